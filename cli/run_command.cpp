#include "run_command.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <dlfcn.h>
#include <sys/mman.h>

#include <algorithm>
#include <filesystem>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "isorun/preload/cap_region.hpp"
#include "isorun/runner/errors.hpp"
#include "isorun/runner/job.hpp"
#include "isorun/runner/process.hpp"
#include "isorun/runner/unique_fd.hpp"
#include "isorun/serialization/protocol.hpp"
#include "isorun/serialization/shm_segment.hpp"
#include "isorun/runner/units.hpp"
#include "isorun/runner/worker_env.hpp"

extern char** environ;

namespace isorun::cli {
namespace {
using clock = std::chrono::steady_clock;
constexpr int shim_fd = serialization::control_fd;

struct shim_report {
  std::int32_t code;
  std::int32_t signal;
};

}  // namespace

bool is_shim_process() {
  const char* s = std::getenv(serialization::env::shim.data());
  return s && std::strcmp(s, "1") == 0;
}

void run_shim(int argc, char** argv) {
  ::unsetenv(serialization::env::shim.data());
  if (argc < 2 || ::fcntl(shim_fd, F_SETFD, FD_CLOEXEC) != 0) {
    std::fprintf(stderr, "isorun shim: started without a command or channel\n");
    ::_exit(125);
  }
  // Only the command should react to Ctrl-C and SIGTERM; the shim waits to report its end.
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) ::signal(sig, SIG_IGN);
  serialization::exit_with_supervisor(shim_fd);

  runner::spawn_options opts;
  opts.executable = argv[1];
  for (int i = 2; i < argc; ++i) opts.args.emplace_back(argv[i]);
  // The cap library is preloaded into the command only, never into this shim.
  std::string preload;
  if (const char* cap = std::getenv(preload::preload_env)) {
    preload = cap;
    if (const char* other = std::getenv("LD_PRELOAD"); other && *other) preload += std::string(":") + other;
    ::unsetenv(preload::preload_env);
  }
  for (char** e = environ; e && *e; ++e)
    if (preload.empty() || std::strncmp(*e, "LD_PRELOAD=", 11) != 0) opts.env.emplace_back(*e);
  if (!preload.empty()) opts.env.push_back("LD_PRELOAD=" + preload);
  opts.new_process_group = false;
  shim_report report{127, 0};
  try {
    runner::child c = runner::spawn(opts);
    c.wait_for(std::chrono::milliseconds(INT_MAX));
    while (!c.peek()) c.wait_for(std::chrono::milliseconds(INT_MAX));
    const runner::exit_status st = c.reap();
    report = {st.code, st.signal};
  } catch (const runner::spawn_error& e) {
    std::fprintf(stderr, "isorun: %s\n", e.what());
    report = {e.error() == ENOENT ? 127 : 126, 0};
  }
  ::send(shim_fd, &report, sizeof report, MSG_NOSIGNAL);
  ::_exit(0);
}

namespace {

// The cap shared by the command's processes: a memfd region, reachable from any of them as
// /proc/<this pid>/fd/<fd> while this process lives, and no longer once it is gone.
class command_cap {
 public:
  explicit command_cap(std::uint64_t limit) : file_{serialization::shm_file::create(sizeof(preload::cap_region))} {
    void* p = ::mmap(nullptr, sizeof(preload::cap_region), PROT_READ | PROT_WRITE, MAP_SHARED, file_.fd(), 0);
    if (p == MAP_FAILED) throw internal_error(std::string("cannot map the cap region: ") + std::strerror(errno));
    region_ = static_cast<preload::cap_region*>(p);  // zero-filled by the kernel: every count 0
    region_->limit = limit;
    region_->magic = preload::region_magic;
  }
  ~command_cap() { ::munmap(region_, sizeof(preload::cap_region)); }
  command_cap(const command_cap&) = delete;
  command_cap& operator=(const command_cap&) = delete;

  /// The variables that make the shim preload the cap library into the command.
  [[nodiscard]] std::vector<std::string> environment() const {
    return {std::string(preload::region_env) + "=/proc/" + std::to_string(::getpid()) + "/fd/" + std::to_string(file_.fd()),
            std::string(preload::preload_env) + "=" + library()};
  }

  /// After the command: what the cap refused, in one line ("" if nothing).
  [[nodiscard]] std::string report() const {
    const std::uint64_t refused = region_->refusals.load();
    if (!refused) return "";
    return "the command reached its --mem-limit of " + format_size(region_->limit) + ": " + std::to_string(refused) +
           " allocation" + (refused == 1 ? "" : "s") + " refused (the largest " +
           format_size(region_->largest_refused.load()) + "), peak " + format_size(region_->peak.load()) + " in " +
           std::to_string(region_->processes.load()) + " process" + (region_->processes.load() == 1 ? "" : "es") +
           " with CUDA";
  }

  /// The library next to libisorun.so.
  static std::string library() {
    Dl_info info{};
    if (!::dladdr(reinterpret_cast<void*>(&runner::self_executable), &info) || !info.dli_fname)
      throw internal_error("cannot locate libisorun.so, next to which the cap library is");
    const auto path = std::filesystem::path(info.dli_fname).parent_path() / preload::library_name;
    if (!std::filesystem::exists(path))
      throw internal_error(path.string() + " is missing, so --mem-limit cannot be enforced for a command; reinstall "
                           "isorun, or pass --mem-limit-mode advisory");
    return path.string();
  }

 private:
  serialization::shm_file file_;
  preload::cap_region* region_ = nullptr;
};

}  // namespace

int run_command(const cli_options& o, const std::optional<runner::gpu_info>& gpu) {
  const auto exe = runner::find_executable(o.command[0]);
  if (!exe) throw usage_error("command not found: '" + o.command[0] + "' (not an executable file, nor found in PATH)");
  std::optional<command_cap> cap;
  if (o.mem_limit && !o.mem_limit_advisory) cap.emplace(o.mem_limit);
  if (o.mem_limit && o.mem_limit_advisory && !o.quiet)
    std::fprintf(stderr, "isorun: note: --mem-limit %s is advisory: exported as ISORUN_MEM_LIMIT, not enforced\n",
                 format_size(o.mem_limit).c_str());

  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
    throw internal_error(std::string("socketpair: ") + std::strerror(errno));
  unique_fd ours(sv[0]), theirs(sv[1]);

  // Signals become readable events; blocked here, reset to default in the child by spawn().
  sigset_t forwarded;
  sigemptyset(&forwarded);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) sigaddset(&forwarded, sig);
  ::sigprocmask(SIG_BLOCK, &forwarded, nullptr);
  unique_fd signals(::signalfd(-1, &forwarded, SFD_CLOEXEC | SFD_NONBLOCK));

  runner::spawn_options opts;
  opts.executable = runner::self_executable();
  opts.args = {*exe};
  opts.args.insert(opts.args.end(), o.command.begin() + 1, o.command.end());
  opts.env = runner::inherited_environment();
  for (auto& e : runner::assignment_environment(gpu, o.mem_limit)) opts.env.push_back(std::move(e));
  if (cap)
    for (auto& e : cap->environment()) opts.env.push_back(std::move(e));
  opts.env.push_back(std::string(serialization::env::shim) + "=1");
  opts.fds = {{0, 0}, {1, 1}, {2, 2}, {shim_fd, theirs.get()}};
  runner::child c;
  try {
    c = runner::spawn(opts);
  } catch (const runner::spawn_error& e) {
    throw internal_error(std::string("cannot start the command: ") + e.what());
  }
  theirs.reset();

  // Stops follow one plan: the signal that asked for it (SIGTERM on a timeout), the grace
  // period, SIGKILL. A second Ctrl-C takes the next step at once.
  std::optional<runner::stop_escalation> stopping;
  std::optional<clock::time_point> deadline;
  if (o.timeout.count() > 0) deadline = clock::now() + o.timeout;
  bool timed_out = false;
  int interrupted = 0;
  for (;;) {
    pollfd fds[2] = {{c.pidfd(), POLLIN, 0}, {signals.get(), POLLIN, 0}};
    int timeout_ms = -1;
    if (deadline) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - clock::now()).count();
      timeout_ms = static_cast<int>(std::clamp<long long>(left + 1, 0, INT_MAX));
    }
    ::poll(fds, 2, timeout_ms);
    if (fds[1].revents & POLLIN) {
      signalfd_siginfo si{};
      while (::read(signals.get(), &si, sizeof si) == sizeof si) {
        const int sig = static_cast<int>(si.ssi_signo);
        if (!stopping) {
          interrupted = sig;
          stopping.emplace(runner::stop_plan::graceful(o.grace, sig));
          deadline = stopping->advance(c);
        } else if (sig == SIGINT) {
          deadline = stopping->advance(c);
        } else {
          c.signal(sig);  // passed on; the stop already under way keeps its course
        }
      }
    }
    if (fds[0].revents & POLLIN) break;
    if (deadline && clock::now() >= *deadline) {
      if (!stopping) {
        timed_out = true;
        stopping.emplace(runner::stop_plan::graceful(o.grace));
      }
      deadline = stopping->advance(c);
    }
    if (deadline == clock::time_point::max()) deadline.reset();
  }
  shim_report report{-1, 0};
  const bool reported = ::recv(ours.get(), &report, sizeof report, MSG_DONTWAIT) == sizeof report;
  const runner::exit_status shim = c.reap();
  ::sigprocmask(SIG_UNBLOCK, &forwarded, nullptr);
  if (cap && !o.quiet)
    if (const std::string said = cap->report(); !said.empty()) std::fprintf(stderr, "isorun: %s\n", said.c_str());

  if (timed_out) {
    std::fprintf(stderr, "isorun: command timed out after %s; stopped it and its process group\n",
                 format_duration(o.timeout).c_str());
    return 124;
  }
  runner::exit_status st = reported ? runner::exit_status{report.code, report.signal, false} : shim;
  if (!o.quiet && st.signal)
    std::fprintf(stderr, "isorun: command %s\n", runner::describe(st).c_str());
  if (interrupted && !reported) return 128 + interrupted;
  return st.shell_code();
}

}  // namespace isorun::cli
