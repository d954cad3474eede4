#include "command.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "isorun/errors.hpp"
#include "isorun/job.hpp"
#include "isorun/process.hpp"
#include "isorun/unique_fd.hpp"
#include "isorun/units.hpp"

extern char** environ;

namespace isorun::cli {
namespace {
using clock = std::chrono::steady_clock;
constexpr int shim_fd = 3;

struct shim_report {
  std::int32_t code;
  std::int32_t signal;
};

}  // namespace

bool is_shim_process() {
  const char* s = std::getenv("ISORUN_SHIM");
  return s && std::strcmp(s, "1") == 0;
}

void run_shim(int argc, char** argv) {
  ::unsetenv("ISORUN_SHIM");
  if (argc < 2 || ::fcntl(shim_fd, F_SETFD, FD_CLOEXEC) != 0) {
    std::fprintf(stderr, "isorun shim: started without a command or channel\n");
    ::_exit(125);
  }
  // Only the command should react to Ctrl-C and SIGTERM; the shim waits to report its end.
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) ::signal(sig, SIG_IGN);
  // The watcher below takes over from PR_SET_PDEATHSIG, which would race it and could leave the
  // command's children behind.
  ::prctl(PR_SET_PDEATHSIG, 0);
  std::thread([] {
    pollfd p{shim_fd, POLLRDHUP, 0};
    for (;;)
      if (::poll(&p, 1, -1) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR))) {
        ::kill(0, SIGKILL);  // the supervisor is gone: take the whole group down
        ::_exit(137);
      }
  }).detach();

  runner::spawn_options opts;
  opts.executable = argv[1];
  for (int i = 2; i < argc; ++i) opts.args.emplace_back(argv[i]);
  for (char** e = environ; e && *e; ++e) opts.env.emplace_back(*e);
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

int run_command(const cli_options& o, const std::optional<runner::gpu_info>& gpu) {
  const auto exe = runner::find_executable(o.command[0]);
  if (!exe) throw usage_error("command not found: '" + o.command[0] + "' (not an executable file, nor found in PATH)");
  if (o.mem_limit && !o.quiet)
    std::fprintf(stderr,
                 "isorun: note: --mem-limit %s is advisory for an arbitrary command: it is exported as "
                 "ISORUN_MEM_LIMIT but not enforced (only registered tasks run under the capped allocator)\n",
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
  opts.env = runner::worker_environment(gpu, o.mem_limit, {});
  opts.env.push_back("ISORUN_SHIM=1");
  opts.fds = {{0, 0}, {1, 1}, {2, 2}, {shim_fd, theirs.get()}};
  runner::child c;
  try {
    c = runner::spawn(opts);
  } catch (const runner::spawn_error& e) {
    throw internal_error(std::string("cannot start the command: ") + e.what());
  }
  theirs.reset();

  const auto started = clock::now();
  std::optional<clock::time_point> deadline;
  if (o.timeout.count() > 0) deadline = started + o.timeout;
  bool timed_out = false, terminating = false;
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
        if (interrupted && si.ssi_signo == SIGINT) {
          c.signal(SIGKILL);  // a second Ctrl-C does not wait
        } else {
          interrupted = static_cast<int>(si.ssi_signo);
          c.signal(static_cast<int>(si.ssi_signo));
          if (!deadline || *deadline > clock::now() + o.grace) deadline = clock::now() + o.grace;
          terminating = true;
        }
      }
    }
    if (fds[0].revents & POLLIN) break;
    if (deadline && clock::now() >= *deadline) {
      if (!terminating) {
        timed_out = true;
        terminating = true;
        c.signal(SIGTERM);
        deadline = clock::now() + o.grace;
      } else {
        c.signal(SIGKILL);
        deadline.reset();
      }
    }
  }
  shim_report report{-1, 0};
  const bool reported = ::recv(ours.get(), &report, sizeof report, MSG_DONTWAIT) == sizeof report;
  const runner::exit_status shim = c.reap();
  ::sigprocmask(SIG_UNBLOCK, &forwarded, nullptr);

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
