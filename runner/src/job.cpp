#include "isorun/runner/job.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

#include "isorun/alloc/config.hpp"
#include "isorun/runner/errors.hpp"
#include "isorun/runner/host_memory.hpp"
#include "isorun/runner/launcher.hpp"
#include "isorun/runner/option_table.hpp"
#include "isorun/runner/placement.hpp"
#include "isorun/runner/process.hpp"
#include "isorun/runner/stream_tail.hpp"
#include "isorun/runner/unique_fd.hpp"
#include "isorun/runner/units.hpp"
#include "isorun/runner/worker_env.hpp"
#include "isorun/serialization/codec.hpp"
#include "isorun/serialization/control.hpp"
#include "isorun/serialization/cpu_handoff.hpp"
#include "isorun/serialization/machine.hpp"
#include "isorun/serialization/protocol.hpp"
#include "isorun/serialization/request.hpp"
#include "isorun/serialization/result_stream.hpp"
#include "isorun/serialization/segment_pool.hpp"
#include "isorun/serialization/shm_segment.hpp"
#include "job_state.hpp"
#include "watcher.hpp"

namespace isorun::runner {
namespace ser = isorun::serialization;
using namespace std::chrono_literals;

namespace {

using ser::monotonic_ns;

// Encodes what `spec` asks for (into a request segment unless it is small enough to be carried by
// the assignment), and takes a result segment.
// The size of each task's last result, by task name: what its next worker maps ahead
// (request::expected_result).
class result_sizes {
 public:
  static result_sizes& instance() {
    static auto* sizes = new result_sizes;  // never destroyed: jobs may finish during exit
    return *sizes;
  }
  std::uint64_t last(const std::string& task) {
    std::lock_guard lock(mutex_);
    const auto it = last_.find(task);
    return it == last_.end() ? 0 : it->second;
  }
  void record(const std::string& task, std::uint64_t bytes) {
    std::lock_guard lock(mutex_);
    last_[task] = bytes;
  }

 private:
  std::mutex mutex_;
  std::map<std::string, std::uint64_t> last_;
};

prepared_request prepare_request(job_spec& spec) {
  if (!spec.max_result) spec.max_result = ser::physical_memory();
  ser::request req;
  req.task = spec.task;
  req.encoding = static_cast<std::uint32_t>(spec.encoding);
  req.task_libraries = spec.task_libraries;
  req.mem_limit = spec.mem_limit;
  for (const auto& g : spec.gpus) req.gpus.push_back({g.index, g.uuid, g.total_memory, g.simulated});
  req.alloc_conf = spec.alloc_conf;
  req.max_result = spec.max_result;
  req.early_result = spec.early_result;
  req.early_small_result = spec.early_small_result;
  req.expected_result = result_sizes::instance().last(spec.task);
  req.args = std::move(spec.args);
  auto& pool = ser::segment_pool::instance();
  prepared_request p;
  try {
    const std::uint64_t n = ser::encoded_size(req);
    std::byte* base;
    if (ser::header_size + n <= ser::inline_limit) {  // carried by the assignment
      p.inline_request.assign(ser::header_size + n, '\0');
      base = reinterpret_cast<std::byte*>(p.inline_request.data());
    } else {
      p.request = pool.acquire(ser::header_size + n);
      base = p.request->writable(ser::header_size + n);
    }
    const std::uint64_t sum = ser::encode_into(base + ser::header_size, n, req);
    ser::write_header(base, ser::request_magic, spec.encoding, n, sum);
    p.result = pool.acquire(0, true);
    // A pooled segment still holds the result of the call it served last, which must not pass
    // for this call's if the worker reports success without writing one: its magic goes.
    if (const std::uint64_t none = 0;
        p.result->capacity() >= sizeof none && ::pwrite(p.result->fd(), &none, sizeof none, 0) != sizeof none)
      throw std::system_error(errno, std::generic_category(), "clearing a result segment");
    if (spec.result_stream) {
      p.ring = ser::segment_pool::rings().acquire(ser::ring_bytes);
      // Not faulted in here: a ring's slot pages are made by the first stream through it.
      ser::reset_ring(p.ring->writable(ser::ring_bytes, false));
      p.stream_event.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
      if (!p.stream_event) throw std::system_error(errno, std::generic_category(), "eventfd");
    }
  } catch (const std::system_error& e) {
    throw internal_error(std::string("cannot prepare shared memory for the worker: ") + e.what());
  }
  return p;
}

// Gives a launched worker its work: the device assignment, the two segments and, for
// stdout_mode::file and stdout_mode::fd, its stdout; with `hand_cpu_to`, the worker's pid, this
// thread's CPU for its wake-up (true if handed). A worker that is already gone is not an error
// here; watching it finds out how it ended.
bool assign(int control, const prepared_request& p, const job_spec& spec, pid_t hand_cpu_to = 0) {
  ser::assign_message a;
  a.env = assignment_environment(spec.gpus, spec.mem_limit);
  if (!spec.memory_timeline.empty())
    a.env.push_back(std::string(ser::env::memory_timeline) + "=" + spec.memory_timeline);
  unique_fd out;
  if (spec.stdout_to == stdout_mode::file) {
    // Not through a symbolic link, and a regular file only (O_NONBLOCK: a FIFO does not hold the
    // open up): the file may lie in a folder others write to.
    out.reset(
        ::open(spec.stdout_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644));
    if (!out) throw internal_error("cannot open " + spec.stdout_path + ": " + std::strerror(errno));
    struct stat st {};
    if (::fstat(out.get(), &st) != 0 || !S_ISREG(st.st_mode))
      throw internal_error("cannot use " + spec.stdout_path + " for the worker's stdout: it is not a regular file");
    ::fcntl(out.get(), F_SETFL, ::fcntl(out.get(), F_GETFL) & ~O_NONBLOCK);
    a.stdout_attached = true;
  } else if (spec.stdout_to == stdout_mode::fd) {
    out.reset(::fcntl(spec.stdout_fd, F_DUPFD_CLOEXEC, 0));
    if (!out) throw internal_error(std::string("cannot hand the worker its stdout: ") + std::strerror(errno));
    a.stdout_attached = true;
  }
  a.request = p.inline_request;
  std::vector<int> fds;
  if (p.request) fds.push_back(p.request->fd());
  fds.push_back(p.result->fd());
  if (out) fds.push_back(out.get());
  if (p.ring) {
    fds.insert(fds.end(), {p.ring->fd(), p.stream_event.get()});
    a.stream_attached = true;
  }
  if (hand_cpu_to) a.cpus = ser::hand_this_cpu_to(hand_cpu_to);  // last: the worker wakes at the send
  try {
    ser::send_message(control, a, fds);
  } catch (const std::system_error&) {
  }
  return !a.cpus.empty();
}

// How the job ended, from what watching recorded: forced ends first (cancel, timeout, protocol
// violation), then the worker's own report, validated; no report means it crashed.
// A successful worker's result, received: inline in its done message, through the ring, or in
// its segment; checked against the spec's encoding and bound. Throws where it is not what it says.
void receive_result(watch_record& w, const job_spec& spec, job_result& r) {
  const bool sent_inline = !w.done->inline_result.empty();
  if (!sent_inline && !w.streamed) w.streamed = streamed_header(*w.result_segment);
  ser::encoding enc{};
  if (sent_inline) {
    const std::string& bytes = w.done->inline_result;
    auto copy = ser::aligned_copy(bytes);
    r.payload = ser::open_payload(copy.get(), bytes.size(), ser::result_magic, spec.max_result, enc);
    r.owner = std::move(copy);
    r.sent_inline = true;
  } else if (w.streamed) {  // the payload came through the ring
    const ser::segment_header h = ser::read_header(reinterpret_cast<const std::byte*>(&*w.streamed),
                                                   sizeof(ser::segment_header), ser::streamed_result_magic,
                                                   spec.max_result);
    if (!w.stream) throw ser::wire_error("it says its result was streamed, but no stream began");
    auto got = w.stream->finish();
    if (h.payload_size != got.payload.size() || h.checksum != got.checksum)
      throw ser::wire_error("the streamed result differs from what its header says (size or checksum)");
    enc = static_cast<ser::encoding>(h.encoding);
    r.payload = got.payload;
    r.owner = std::move(got.owner);
  } else {
    r.payload = w.result_segment->payload(ser::result_magic, spec.max_result, enc);
    r.owner = w.result_segment;
  }
  if (enc != spec.encoding) throw ser::wire_error("result has a different encoding than requested");
  r.encoding = enc;
  r.received_ns = monotonic_ns();
  result_sizes::instance().record(spec.task, r.payload.size());
}

// What the watch saw of the worker, whatever its outcome: its exit, times, peaks and stderr.
job_result observed(watch_record& w, const job_spec& spec, const call_trace& trace) {
  job_result r;
  r.trace = trace;
  r.trace.done_seen_ns = w.done_seen_ns;
  outcome& o = r.status;
  o.exit = w.exited;
  o.exit_pending = w.early;
  o.wall = std::chrono::duration_cast<std::chrono::nanoseconds>(w.wall);
  o.timeout = spec.timeout;
  o.device = spec.gpus.empty() ? "cpu" : visible_devices_for(spec.gpus);
  o.stderr_tail = std::move(w.stderr_tail);
  o.host_memory_peak = w.memory_peak;
  if (w.done) {
    r.trace.worker_assigned_ns = w.done->assigned_ns;
    r.trace.worker_request_ns = w.done->request_ns;
    r.trace.worker_sent_ns = w.done->sent_ns;
    o.peak_allocated = w.done->peak_allocated;
    o.peak_reserved = w.done->peak_reserved;
    o.run = std::chrono::nanoseconds(w.done->run_ns);
    r.encode_begin_ns = static_cast<std::int64_t>(w.done->encode_begin_ns);
    r.encode_ns = w.done->encode_ns;
  }
  r.reaped_ns = w.reaped_ns;
  return r;
}

job_result classify(watch_record w, const job_spec& spec, const call_trace& trace) {
  job_result r = observed(w, spec, trace);
  outcome& o = r.status;
  if (w.forced) {
    o.kind = w.forced->first;
    o.message = std::move(w.forced->second);
  } else if (w.done && w.done->status == ser::task_status::ok) {
    try {
      receive_result(w, spec, r);
      o.kind = outcome_kind::success;
    } catch (const std::exception& e) {
      r.payload = {};
      r.owner.reset();
      o.kind = outcome_kind::invalid_result;
      o.message = std::string("worker result rejected: ") + e.what();
    }
  } else if (w.done && w.done->status == ser::task_status::result_too_large) {
    o.kind = outcome_kind::invalid_result;
    o.message = "worker result rejected: " + valid_utf8(w.done->message);
  } else if (w.done) {
    o.kind = w.done->status == ser::task_status::out_of_memory ? outcome_kind::out_of_memory : outcome_kind::task_error;
    o.error_type = valid_utf8(w.done->error_type);  // the task's own text: any bytes
    o.message = valid_utf8(w.done->message);
  } else {
    o.kind = outcome_kind::crashed;
    o.message = w.exited.signal ? "worker " + describe(w.exited)
                                : "worker " + describe(w.exited) + " without delivering a result";
  }
  host_memory_cap::classify(o, w.host, spec.host_mem_limit, "worker");
  return r;
}

local_launcher& local() {
  static local_launcher l;
  return l;
}

}  // namespace

job::job(std::shared_ptr<state> s) : state_{std::move(s)} {}

job::~job() {
  if (!state_) return;
  if (!state_->ended) {
    if (!state_->cancel_asked) cancel();  // (a second cancel would skip the grace)
    // The watcher sees the stop through and reaps: a dropped job costs its owner no wait.
    try {
      watch_elsewhere();
    } catch (...) {  // (no memory to hand it over) seen through here
      wait();
    }
  }
  // The watcher keeps the state until the worker is reaped; the result's memory goes back now
  // (values decoded from it hold their own reference).
  std::lock_guard lock(state_->wait_mutex);
  state_->result.payload = {};
  state_->result.owner.reset();
  state_->record.reset();
}

pid_t job::pid() const noexcept { return state_->pid; }

void job::cancel(int first_signal) noexcept {
  state_->cancel_asked = true;
  if (first_signal) {
    int none = 0;
    state_->cancel_signal.compare_exchange_strong(none, first_signal);
  }
  state_->request_cancel();
}

job_spec job_spec_for(std::string task, serialization::encoding encoding, blob args, std::vector<gpu_info> gpus,
                      const isolated_options& opts) {
  job_spec spec;
  spec.task = std::move(task);
  spec.encoding = encoding;
  spec.args = std::move(args);
  spec.gpus = std::move(gpus);
  for_each_option([&](const auto& row) {
    if (row.sets) spec.*row.sets = opts.*row.field;
  });
  spec.extra_env = opts.env;
  if (opts.cpus_per_call) {
    auto limits = thread_limits(opts.cpus_per_call, opts.env);
    spec.extra_env.insert(spec.extra_env.end(), limits.begin(), limits.end());
  }
  spec.stderr_echo_fd = opts.echo_stderr ? 2 : -1;
  return spec;
}

// A value the user gave any of the five (the call's `env` first, then this process's) wins, and
// for the ones not given too: OpenBLAS reads OPENBLAS_NUM_THREADS before OMP_NUM_THREADS, so a
// user's OMP_NUM_THREADS=4 beside isorun's OPENBLAS_NUM_THREADS=1 would not reach it.
std::vector<std::string> thread_limits(unsigned threads, const std::vector<std::string>& env) {
  static constexpr const char* names[] = {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                                          "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS"};
  auto given = [&](const char* name) -> std::optional<std::string> {
    const std::string key = std::string(name) + "=";
    for (const auto& e : env)
      if (e.rfind(key, 0) == 0) return e.substr(key.size());
    if (const char* v = std::getenv(name)) return std::string(v);
    return std::nullopt;
  };
  std::optional<std::string> users;
  for (const char* name : names)
    if ((users = given(name))) break;
  std::vector<std::string> out;
  for (const char* name : names)
    if (!given(name)) out.push_back(std::string(name) + "=" + users.value_or(std::to_string(std::max(1u, threads))));
  return out;
}

void check_job_spec(const job_spec& spec) {
  alloc::alloc_config config;
  try {
    config = alloc::alloc_config::parse(spec.alloc_conf);
  } catch (const alloc::config_error& e) {
    throw usage_error(std::string("allocator configuration: ") + e.what());
  }
  if (spec.mem_limit) {
    try {
      alloc::check_cap(spec.mem_limit, config);
    } catch (const alloc::config_error& e) {
      throw usage_error("mem-limit " + format_size(spec.mem_limit) + ": " + e.what());
    }
  }
  for (const auto& g : spec.gpus) check_fits(g, spec.mem_limit);
  if (spec.host_mem_limit) check_host_mem_limit(spec.host_mem_limit);
}

void check_host_mem_limit(std::uint64_t bytes) {
  constexpr std::uint64_t smallest = 16ULL << 20;  // below it an interpreter cannot even start
  if (bytes < smallest)
    throw usage_error("host-mem-limit " + format_size(bytes) + " is below the smallest, " + format_size(smallest) +
                      "; give a larger cap (e.g. 1G)");
  if (const std::string why = host_memory_cap::unavailable(); !why.empty())
    throw usage_error("host-mem-limit cannot be enforced here: " + why);
}

std::shared_ptr<job> job::start(job_spec spec) { return start(std::move(spec), local()); }

std::shared_ptr<job> job::start(job_spec spec, launcher& from) {
  check_job_spec(spec);  // before a worker is launched (or taken from standby) for it
  // The request is ready, and for a worker launched now already in its socket, before the
  // worker starts: it finds its assignment waiting instead of waiting for it (after a launch the
  // caller often runs again only once the new process has started up and blocked).
  const std::int64_t begin = monotonic_ns();
  auto s = prepare_state(spec);
  s->trace.begin_ns = begin;
  bool assigned = false;
  launch_spec how = launch_spec_for(spec);
  // (Not under a host memory cap: the cap is put on the worker before its task is assigned.)
  if (!spec.host_mem_limit)
    how.before_start = [&](int control) {
      assign(control, s->segments, spec);
      s->trace.assigned_ns = monotonic_ns();
      assigned = true;
    };
  launched_worker w = from.launch(how);
  s->trace.launched_ns = monotonic_ns();
  return assign_prepared(std::move(s), std::move(spec), std::move(w), assigned);
}

std::shared_ptr<job> job::start(job_spec spec, launched_worker worker) {
  check_job_spec(spec);  // a launched worker that is not used is stopped when `worker` goes
  const std::int64_t begin = monotonic_ns();
  auto s = prepare_state(spec);
  s->trace.begin_ns = begin;
  s->trace.launched_ns = begin;  // (launched before)
  return assign_prepared(std::move(s), std::move(spec), std::move(worker), false);
}

std::shared_ptr<job::state> job::prepare_state(job_spec& spec) {
  auto s = std::make_shared<state>();
  s->cancel_event.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!s->cancel_event) throw internal_error(std::string("eventfd: ") + std::strerror(errno));
  s->segments = prepare_request(spec);
  s->trace.prepared_ns = monotonic_ns();
  return s;
}

std::shared_ptr<job> job::assign_prepared(std::shared_ptr<state> s, job_spec spec, launched_worker worker,
                                          bool assigned) {
  s->worker = std::move(worker);
  s->pid = s->worker.process.pid();
  // The job starts now, not when its worker was launched (a standby one may have waited long):
  // the timeout and the wall time count from here.
  s->worker.started = clock::now();
  if (spec.host_mem_limit) s->host_cap = std::make_unique<host_memory_cap>(s->worker.process, spec.host_mem_limit);
  if (!assigned) {
    s->trace.cpu_handed = assign(s->worker.control.get(), s->segments, spec,
                                 spec.caller_waits && s->worker.waiting ? s->pid : 0);
    s->trace.assigned_ns = monotonic_ns();
  }
  s->spec = std::move(spec);
  return std::shared_ptr<job>(new job(std::move(s)));
}

// Watches the job on this thread (claimed by this wait) and publishes its end; after an early
// hand-over the watcher sees the worker's exit.
void job::watch_here(const interruption& interrupted) {
  state& s = *state_;
  watch_record r = runner::watch_here(s, interrupted);
  const bool early = r.early;
  // A CPU call's core is free once its result is handed over (the exit takes little of it): let
  // go of it before the caller hears of the result. A GPU call's memory is not, until its worker
  // is gone.
  if (early && s.spec.gpus.empty()) s.spec.admitted.reset();
  if (!early) release_worker(s);
  publish_end(s, std::move(r));
  if (early) watcher::instance().adopt(state_);
}

void job::watch_elsewhere(std::function<void()> on_end) {
  state& s = *state_;
  {
    std::lock_guard lock(s.wait_mutex);
    if (!s.ended) {
      if (on_end) s.on_end = std::move(on_end);
      on_end = nullptr;
    }
  }
  if (on_end) on_end();  // ended already
  else if (!s.claimed.exchange(true)) watcher::instance().watch(state_);
}

bool job::ended() const noexcept { return state_->ended; }

int job::end_fd() {
  state& s = *state_;
  std::lock_guard lock(s.wait_mutex);
  if (!s.end_event) {
    s.end_event.reset(::eventfd(s.ended ? 1 : 0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!s.end_event) throw internal_error(std::string("eventfd: ") + std::strerror(errno));
  }
  return s.end_event.get();
}

bool job::wait_for(std::chrono::milliseconds timeout) {
  watch_elsewhere();
  state& s = *state_;
  std::unique_lock lock(s.wait_mutex);
  const auto ended = [&] { return s.ended.load(); };
  // (milliseconds::max(): no deadline; added to now, it would overflow and not wait at all)
  if (timeout == std::chrono::milliseconds::max()) {
    s.ready.wait(lock, ended);
    return true;
  }
  return s.ready.wait_for(lock, timeout, ended);
}

const job_result& job::wait() { return wait(interruption{}); }

const job_result& job::wait(const interruption& interrupted) {
  state& s = *state_;
  if (!s.claimed.exchange(true)) watch_here(interrupted);
  else if (!s.ended) wait_elsewhere(interrupted);
  std::lock_guard lock(s.wait_mutex);
  if (!s.classified) {
    s.result = classify(std::move(*s.record), s.spec, s.trace);
    s.record.reset();
    s.classified = true;
  }
  return s.result;
}

// Waits for the watch another thread (or the watcher) carries out.
void job::wait_elsewhere(const interruption& interrupted) {
  state& s = *state_;
  wait_until_done(
      s.wait_mutex, s.ready, interrupted ? end_fd() : -1, [&] { return s.ended.load(); }, interrupted,
      [this] { cancel(); });
}

}  // namespace isorun::runner
