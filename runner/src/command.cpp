#include "isorun/runner/command.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>

#include "isorun/preload/cap_region.hpp"
#include "isorun/runner/command_shim.hpp"
#include "isorun/runner/containment.hpp"
#include "isorun/runner/driver_cap.hpp"
#include "isorun/runner/errors.hpp"
#include "isorun/runner/host_memory.hpp"
#include "isorun/runner/job.hpp"
#include "isorun/runner/process.hpp"
#include "isorun/runner/stream_tail.hpp"
#include "isorun/runner/unique_fd.hpp"
#include "isorun/runner/units.hpp"
#include "isorun/runner/worker_env.hpp"
#include "isorun/serialization/control.hpp"
#include "isorun/serialization/protocol.hpp"
#include "isorun/serialization/shm_segment.hpp"

extern char** environ;

namespace isorun::runner {
namespace {
using clock = std::chrono::steady_clock;
constexpr int shim_fd = serialization::control_fd;

}  // namespace

struct command::state {
  command_spec spec;
  std::optional<driver_cap> cap;
  std::unique_ptr<host_memory_cap> host_cap;  // until the shim is reaped
  unique_fd report_read;                      // the shim's report
  unique_fd cancel_read, cancel_write;        // one byte per cancel: the signal asked for
  unique_fd stderr_read;                      // with stderr_tail_lines
  child shim;
  clock::time_point started;
  std::int64_t started_ns = 0;  // the same, on the clock the cap's events carry
  std::optional<command_result> result;
};

command::command(std::unique_ptr<state> s) : state_{std::move(s)} {}

command::~command() {
  if (state_ && !state_->result && state_->shim.valid()) state_->shim.stop(stop_plan::immediate());
}

pid_t command::pid() const noexcept { return state_->shim.pid(); }

void command::cancel(int sig) noexcept {
  const auto byte = static_cast<unsigned char>(sig);
  [[maybe_unused]] auto n = ::write(state_->cancel_write.get(), &byte, 1);
}

std::unique_ptr<command> command::start(command_spec spec) {
  if (spec.argv.empty()) throw usage_error("no command given");
  const auto exe = find_executable(spec.argv[0]);
  if (!exe) throw usage_error("command not found: '" + spec.argv[0] + "' (not an executable file, nor found in PATH)");

  if (spec.host_mem_limit) check_host_mem_limit(spec.host_mem_limit);
  auto s = std::make_unique<state>();
  if (spec.mem_limit && spec.enforce_cap) s->cap.emplace(spec.mem_limit, spec.memory_events);
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
    throw internal_error(std::string("socketpair: ") + std::strerror(errno));
  s->report_read.reset(sv[0]);
  unique_fd theirs(sv[1]);
  int p[2];
  if (::pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0) throw internal_error(std::string("pipe2: ") + std::strerror(errno));
  s->cancel_read.reset(p[0]);
  s->cancel_write.reset(p[1]);
  unique_fd stderr_write, null_in;
  if (spec.stderr_tail_lines > 0) {
    if (::pipe2(p, O_CLOEXEC) != 0) throw internal_error(std::string("pipe2: ") + std::strerror(errno));
    s->stderr_read.reset(p[0]);
    stderr_write.reset(p[1]);
    ::fcntl(s->stderr_read.get(), F_SETFL, O_NONBLOCK);
  }
  if (spec.stdin_fd < 0) {
    null_in.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    if (!null_in) throw internal_error(std::string("cannot open /dev/null: ") + std::strerror(errno));
  }

  spawn_options opts;
  opts.executable = beside_library(command_shim_name, "no command can be run");
  opts.args = {*exe};
  opts.args.insert(opts.args.end(), spec.argv.begin() + 1, spec.argv.end());
  opts.env = inherited_environment();
  for (auto& e : assignment_environment(spec.gpus, spec.mem_limit)) opts.env.push_back(std::move(e));
  if (s->cap) {
    for (auto& e : s->cap->variables()) opts.env.push_back(std::move(e));
    opts.env.push_back(std::string(preload::preload_env) + "=" + driver_cap::library());
  }
  for (const auto& e : spec.extra_env) opts.env.push_back(e);
  opts.fds = {{0, null_in ? null_in.get() : spec.stdin_fd},
              {1, spec.stdout_fd},
              {2, stderr_write ? stderr_write.get() : spec.stderr_fd},
              {shim_fd, theirs.get()}};
  opts.cgroup = new_child_cgroup();
  if (spec.host_mem_limit) {
    try {
      s->host_cap = std::make_unique<host_memory_cap>(opts.cgroup, spec.host_mem_limit,
                                                      host_memory_cap::before_start_t{});
    } catch (...) {
      if (!opts.cgroup.empty()) kill_and_remove_cgroup(opts.cgroup);  // no child owns it yet
      throw;
    }
    opts.join_cgroup_procs = s->host_cap->join_fd();
  }
  try {
    s->shim = spawn(opts);
  } catch (const spawn_error& e) {
    throw internal_error(std::string("cannot start the command: ") + e.what());
  }
  if (s->host_cap) s->host_cap->started();
  s->started = clock::now();
  s->started_ns = serialization::monotonic_ns();
  s->spec = std::move(spec);
  return std::unique_ptr<command>(new command(std::move(s)));
}

namespace {

// How the wait for the shim ended, besides the shim's exit.
struct wait_end {
  bool timed_out = false;
  int cancelled_by = 0;  // the first cancel's signal
  bool stderr_open = false;
};

// Carries out the cancels that came (each a byte on cancel_read). Stops follow one plan: the
// signal that asked for it, the grace period, SIGKILL. A second SIGINT or SIGTERM, or the stop's
// own first signal again (a sweep's checkpoint warning, sent twice), takes the next step at once.
void take_cancels(command::state& s, std::optional<stop_escalation>& stopping, clock::time_point& deadline,
                  wait_end& end) {
  unsigned char sigs[16];
  for (ssize_t n; (n = ::read(s.cancel_read.get(), sigs, sizeof sigs)) > 0;)
    for (ssize_t i = 0; i < n; ++i) {
      const int sig = sigs[i];
      if (!stopping) {
        end.cancelled_by = sig;
        stopping.emplace(stop_plan::graceful(s.spec.grace, sig));
        deadline = stopping->advance(s.shim);
      } else if (sig == SIGINT || sig == SIGTERM || sig == end.cancelled_by) {
        deadline = stopping->advance(s.shim);
      } else {
        s.shim.signal(sig);  // passed on; the stop under way keeps its course
      }
    }
}

// Until the shim exits: enforces the timeout (SIGTERM, then the plan of take_cancels), carries
// out cancels and passes stderr through `read_stderr` (false once it is closed).
wait_end wait_for_shim(command::state& s, const std::function<bool()>& read_stderr) {
  std::optional<stop_escalation> stopping;
  constexpr auto never = clock::time_point::max();
  clock::time_point deadline = s.spec.timeout.count() > 0 ? s.started + s.spec.timeout : never;
  wait_end end;
  end.stderr_open = static_cast<bool>(s.stderr_read);
  for (;;) {
    pollfd fds[3] = {{s.shim.pidfd(), POLLIN, 0},
                     {s.cancel_read.get(), POLLIN, 0},
                     {end.stderr_open ? s.stderr_read.get() : -1, POLLIN, 0}};
    int timeout_ms = -1;
    if (deadline != never) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
      timeout_ms = static_cast<int>(std::clamp<long long>(left + 1, 0, INT_MAX));
    }
    if (::poll(fds, 3, timeout_ms) < 0 && errno != EINTR) break;
    if (fds[1].revents & POLLIN) take_cancels(s, stopping, deadline, end);
    if (fds[2].revents) end.stderr_open = read_stderr();
    if (fds[0].revents & POLLIN) break;
    if (deadline != never && clock::now() >= deadline) {
      if (!stopping) {
        end.timed_out = true;
        stopping.emplace(stop_plan::graceful(s.spec.grace, s.spec.timeout_signal));
      }
      deadline = stopping->advance(s.shim);
    }
  }
  return end;
}

// The outcome's class and message, from how the wait ended, what the shim reported and the cap.
void classify(command_result& r, const command::state& s, const wait_end& end, const exit_status& shim) {
  outcome& o = r.status;
  if (end.timed_out) {
    o.kind = outcome_kind::timeout;
    o.message = "timed out after " + format_duration(s.spec.timeout) + "; stopped it and its process group";
  } else if (end.cancelled_by) {
    o.kind = outcome_kind::cancelled;
    o.message = "stopped by " + signal_name(end.cancelled_by);
  } else if (!r.program) {
    o.kind = outcome_kind::crashed;
    o.message = "the command's shim " + describe(shim) + " before it could report";
  } else if (r.program->success()) {
    o.kind = outcome_kind::success;
  } else if (s.cap && s.cap->refused()) {
    o.kind = outcome_kind::out_of_memory;
    o.message = r.cap_report + "; the command " + describe(*r.program);
  } else if (r.program->signal) {
    o.kind = outcome_kind::crashed;
    o.message = "the command was " + describe(*r.program);
  } else {
    o.kind = outcome_kind::task_error;
    o.message = "the command " + describe(*r.program);
  }
}

// A failure's message ends with the command's last stderr line that says something.
void add_last_stderr_line(outcome& o) {
  if (o.kind == outcome_kind::task_error || o.kind == outcome_kind::crashed || o.kind == outcome_kind::out_of_memory)
    for (auto it = o.stderr_tail.rbegin(); it != o.stderr_tail.rend(); ++it)
      if (it->find_first_not_of(" \t\r") != std::string::npos) {
        o.message += "; its last stderr line: " + *it;
        break;
      }
}

}  // namespace

const command_result& command::wait() {
  state& s = *state_;
  if (s.result) return *s.result;
  detail::line_tail tail(s.spec.stderr_tail_lines);
  detail::capped_echo echo(s.spec.stderr_fd, s.spec.stderr_limit);
  auto read_stderr = [&] { return detail::drain(s.stderr_read.get(), &tail, echo); };
  const wait_end end = wait_for_shim(s, read_stderr);
  command_shim_report report{-1, 0};
  const bool reported = ::recv(s.report_read.get(), &report, sizeof report, MSG_DONTWAIT) == sizeof report;
  const host_memory_cap::reading host = s.host_cap ? s.host_cap->read() : host_memory_cap::reading{};
  const exit_status shim = s.shim.reap();  // also kills what is left of the group and the cgroup
  s.host_cap.reset();
  if (end.stderr_open) read_stderr();

  command_result r;
  r.stopped_by = end.cancelled_by;
  if (reported) r.program = exit_status{report.code, report.signal, false};
  outcome& o = r.status;
  o.exit = r.program.value_or(shim);
  o.wall = std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now() - s.started);
  o.timeout = s.spec.timeout;
  o.device = s.spec.gpus.empty() ? "cpu" : visible_devices_for(s.spec.gpus);
  o.stderr_tail = tail.lines();
  o.host_memory_peak = s.shim.memory_peak().value_or(host.peak.value_or(s.shim.max_rss()));
  if (s.cap) {
    r.cap_report = s.cap->report("the command", "--mem-limit", s.spec.gpus.size());
    o.peak_reserved = s.cap->peak();
    if (s.spec.memory_events) {
      std::vector<int> indices;
      for (const auto& g : s.spec.gpus) indices.push_back(g.index);
      r.memory_timeline = s.cap->memory_timeline(s.started_ns, serialization::monotonic_ns(), indices);
    }
  }
  classify(r, s, end, shim);
  host_memory_cap::classify(o, host, s.spec.host_mem_limit, "command");
  add_last_stderr_line(o);
  s.result = std::move(r);
  return *s.result;
}

}  // namespace isorun::runner
