// The only file that uses Boost.Process (v2, Boost 1.81). Known 1.81 defects and how they are
// handled here:
//  - the (context, ec, ...) launcher overload throws: we call the (executor, ec, ...) overload;
//  - user on_error/on_exec_error hooks are detected with a wrong signature and never called: the
//    initializer below declares that signature too, so its on_exec_error does run;
//  - after a failed exec the vfork child calls exit() (atexit handlers in the parent's memory!)
//    and the parent gets an empty process, leaving a zombie: our on_exec_error calls _exit(127)
//    and the parent reaps `launcher.pid` itself;
//  - basic_process's destructor terminates and does not reap: we detach at once and own the pid
//    through a pidfd;
//  - posix::bind_fd::on_setup has no return statement, and close_all skips gaps in the fd
//    whitelist: we map descriptors ourselves, to a contiguous run from 3, all others being
//    close-on-exec anyway;
//  - the environment initializer needs separate compilation: we set launcher.env directly;
//  - the vfork child calls io_context::notify_fork(fork_child), which rebuilds an existing
//    reactor inside the parent's memory: each spawn uses a fresh io_context whose reactor does
//    not exist yet at vfork time.
#include "isorun/runner/process.hpp"

#include "isorun/runner/containment.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/process/v2/posix/vfork_launcher.hpp>
#include <boost/process/v2/process.hpp>

#include <array>
#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <optional>

#ifndef P_PIDFD
#define P_PIDFD 3
#endif

namespace bp = boost::process::v2;

namespace isorun::runner {
namespace {

constexpr std::size_t max_fds = 16;

int pidfd_open(pid_t pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }

// Runs in the vfork child between vfork and execve: async-signal-safe calls only, no allocation.
struct isolation_init {
  const spawn_options* options;
  pid_t parent;
  int cgroup_procs = -1;  // the child's cgroup.procs, opened by the parent
  int exec_errno = 0;
  std::array<int, max_fds> scratch{};

  bp::error_code on_setup(bp::posix::default_launcher& launcher, const bp::filesystem::path&,
                          const char* const*) {
    for (const auto& [target, source] : options->fds)
      if (target > 2) launcher.fd_whitelist.push_back(target);
    return {};
  }

  bp::error_code on_exec_setup(bp::posix::default_launcher&, const bp::filesystem::path&, const char* const*) {
    sigset_t all;
    ::sigfillset(&all);
    ::sigprocmask(SIG_SETMASK, &all, nullptr);
    // Handlers are reset by exec anyway; ignored signals are not, and an ignored SIGPIPE or
    // SIGINT in the supervisor must not leak into the worker.
    for (int sig = 1; sig < NSIG; ++sig) {
      if (sig == SIGKILL || sig == SIGSTOP) continue;
      struct sigaction sa {};
      sa.sa_handler = SIG_DFL;
      ::sigaction(sig, &sa, nullptr);
    }
    if (options->new_process_group && ::setpgid(0, 0) != 0) return {errno, bp::system_category()};
    // Into its cgroup before anything of the child's own runs ("0": the writing process).
    if (cgroup_procs >= 0 && ::write(cgroup_procs, "0", 1) != 1) return {errno, bp::system_category()};
    if (options->parent_death_signal) {
      ::prctl(PR_SET_PDEATHSIG, options->parent_death_signal);
      if (::getppid() != parent) ::_exit(127);  // the parent died before prctl took effect
    }
    // Two phases so that a source fd numbered like another target is not clobbered.
    int top = 2;
    for (const auto& [target, source] : options->fds) top = target > top ? target : top;
    std::size_t i = 0;
    for (const auto& [target, source] : options->fds) {
      scratch[i] = ::fcntl(source, F_DUPFD_CLOEXEC, top + 1);
      if (scratch[i] < 0) return {errno, bp::system_category()};
      ++i;
    }
    i = 0;
    for (const auto& [target, source] : options->fds)
      if (::dup2(scratch[i++], target) < 0) return {errno, bp::system_category()};
    sigset_t none;
    ::sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    return {};
  }

  // Boost 1.81 only detects this (never defined) signature; the one below is what it calls.
  void on_exec_error(bp::posix::default_launcher&, bp::error_code, const bp::filesystem::path&,
                     const char* const*, bp::error_code);
  void on_exec_error(bp::posix::default_launcher&, const bp::filesystem::path&, const char* const*,
                     const bp::error_code& ec) {
    exec_errno = ec.value();  // vfork: this is the parent's memory
    ::_exit(127);
  }
};

std::vector<const char*> c_strings(const std::vector<std::string>& strings) {
  std::vector<const char*> out;
  out.reserve(strings.size() + 1);
  for (const auto& s : strings) out.push_back(s.c_str());
  out.push_back(nullptr);
  return out;
}

bool is_executable_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

exit_status from_siginfo(const siginfo_t& info) {
  exit_status s;
  if (info.si_code == CLD_EXITED) {
    s.code = info.si_status;
  } else {
    s.signal = info.si_status;
    s.core_dumped = info.si_code == CLD_DUMPED;
  }
  return s;
}

}  // namespace

child spawn(const spawn_options& options) {
  if (options.fds.size() > max_fds) throw spawn_error("too many descriptors to pass to a child", EINVAL);
  int expected = 3;
  for (const auto& [target, source] : options.fds) {
    if (target <= 2) continue;
    if (target != expected++) throw spawn_error("child descriptors above 2 must be contiguous from 3", EINVAL);
  }

  bp::posix::vfork_launcher launcher;
  const auto envp = c_strings(options.env);
  launcher.env = envp.data();
  isolation_init init{&options, ::getpid()};
  // The cgroup is this call's until a child owns it: every failure below removes it.
  struct cgroup_guard {
    const std::string& dir;
    int procs = -1;
    bool owned = false;
    ~cgroup_guard() {
      if (procs >= 0) ::close(procs);
      if (!dir.empty() && !owned) kill_and_remove_cgroup(dir);
    }
  } cgroup{options.cgroup};
  if (!options.cgroup.empty()) {
    cgroup.procs = ::open((options.cgroup + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC);
    if (cgroup.procs < 0)
      throw spawn_error("cannot join cgroup " + options.cgroup + ": " + std::strerror(errno), errno);
    init.cgroup_procs = cgroup.procs;
  }
  // Every way the start can fail ends here: the child (if one was forked) reaped, and one
  // spawn_error saying why.
  auto failed = [&](int err) {
    if (launcher.pid > 0) {  // exec failed (it has exited), or the handle failed after it ran
      ::kill(launcher.pid, SIGKILL);
      int status;
      while (::waitpid(launcher.pid, &status, 0) < 0 && errno == EINTR) {
      }
    }
    const char* hint = err == EMFILE   ? " (too many open files: raise the limit, ulimit -n)"
                       : err == EAGAIN ? " (the process limit, ulimit -u, is reached, or memory is short)"
                                       : "";
    return spawn_error("cannot start " + options.executable + ": " + std::strerror(err) + hint, err);
  };
  pid_t pid = -1;
  try {
    // Boost.Process wants an executor; nothing ever runs on it. Its reactor and the process
    // handle take descriptors, so a process out of them can fail here too (by throwing).
    boost::asio::io_context context;
    bp::error_code ec;
    auto proc = launcher(context.get_executor(), ec, bp::filesystem::path(options.executable), options.args, init);
    if (ec || init.exec_errno) throw failed(init.exec_errno ? init.exec_errno : ec.value());
    pid = proc.id();
    proc.detach();
  } catch (const boost::system::system_error& e) {
    throw failed(e.code().value());
  }
  const int pidfd = pidfd_open(pid);
  if (pidfd < 0) {
    const int err = errno;
    ::kill(pid, SIGKILL);
    int status;
    ::waitpid(pid, &status, 0);
    throw spawn_error("pidfd_open failed (Linux 5.3 or newer is required): " + std::string(std::strerror(err)), err);
  }
  ::fcntl(pidfd, F_SETFD, FD_CLOEXEC);
  cgroup.owned = true;
  return child(pid, pidfd, options.new_process_group, options.cgroup);
}

child::child(child&& other) noexcept
    : pid_{std::exchange(other.pid_, -1)},
      pidfd_{std::exchange(other.pidfd_, -1)},
      group_{other.group_},
      cgroup_{std::move(other.cgroup_)},
      memory_peak_{other.memory_peak_} {
  other.cgroup_.clear();
}

child& child::operator=(child&& other) noexcept {
  if (this != &other) {
    if (valid()) stop(stop_plan::immediate());
    pid_ = std::exchange(other.pid_, -1);
    pidfd_ = std::exchange(other.pidfd_, -1);
    group_ = other.group_;
    cgroup_ = std::move(other.cgroup_);
    other.cgroup_.clear();
    memory_peak_ = other.memory_peak_;
  }
  return *this;
}

child::~child() {
  if (valid()) stop(stop_plan::immediate());
}

std::optional<exit_status> child::peek() const noexcept {
  siginfo_t info{};
  if (::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd_), &info, WEXITED | WNOHANG | WNOWAIT) != 0)
    return std::nullopt;
  if (info.si_pid == 0) return std::nullopt;
  return from_siginfo(info);
}

bool child::wait_for(std::chrono::milliseconds timeout) const noexcept {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (peek()) return true;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() < 0) return false;
    pollfd p{pidfd_, POLLIN, 0};
    const long long ms = left.count() > INT_MAX ? INT_MAX : left.count();
    ::poll(&p, 1, static_cast<int>(ms));
  }
}

void child::signal(int sig) const noexcept {
  if (!valid()) return;
  if (group_ && ::kill(-pid_, sig) == 0) return;
  ::kill(pid_, sig);
}

exit_status child::reap() noexcept {
  exit_status status;
  if (!valid()) return status;
  // Wait (without reaping) so the group id cannot be recycled while we signal it.
  while (!peek()) {
    pollfd p{pidfd_, POLLIN, 0};
    ::poll(&p, 1, -1);
  }
  if (group_) ::kill(-pid_, SIGKILL);  // stragglers: grandchildren left in the group
  siginfo_t info{};
  while (::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd_), &info, WEXITED) != 0 && errno == EINTR) {
  }
  status = from_siginfo(info);
  ::close(pidfd_);
  pidfd_ = -1;
  pid_ = -1;
  // Descendants that left the group (setsid) are still in the cgroup: they go now, before the
  // caller looks at anything the child left behind.
  if (!cgroup_.empty()) memory_peak_ = kill_and_remove_cgroup(std::exchange(cgroup_, {}));
  return status;
}

exit_status child::stop(const stop_plan& plan) noexcept {
  if (!valid()) return {};
  stop_escalation escalation(plan);
  while (!peek()) {
    const auto due = escalation.advance(*this);
    if (due == std::chrono::steady_clock::time_point::max()) break;  // reap() waits for the rest
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(due - std::chrono::steady_clock::now());
    wait_for(std::max(left, std::chrono::milliseconds(0)));
  }
  return reap();
}

stop_plan stop_plan::graceful(std::chrono::milliseconds grace, int first_signal) {
  return {{{first_signal, grace}, {SIGKILL, std::chrono::milliseconds(0)}}};
}

stop_plan stop_plan::immediate() { return {{{SIGKILL, std::chrono::milliseconds(0)}}}; }

std::chrono::steady_clock::time_point stop_escalation::advance(const child& c) noexcept {
  if (next_ >= plan_.steps.size()) return std::chrono::steady_clock::time_point::max();
  const stop_step& step = plan_.steps[next_++];
  if (step.signal) c.signal(step.signal);
  if (next_ >= plan_.steps.size()) return std::chrono::steady_clock::time_point::max();
  return std::chrono::steady_clock::now() + step.timeout;
}

std::optional<std::string> find_executable(const std::string& name) {
  if (name.empty()) return std::nullopt;
  if (name.find('/') != std::string::npos) {
    if (is_executable_file(name)) return name;
    return std::nullopt;
  }
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  std::size_t start = 0;
  while (start <= dirs.size()) {
    std::size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string dir = dirs.substr(start, end - start);
    if (dir.empty()) dir = ".";
    std::string candidate = dir + "/" + name;
    if (is_executable_file(candidate)) return candidate;
    start = end + 1;
  }
  return std::nullopt;
}

program_output collect_output(child& c, int out, int err) {
  program_output r;
  pollfd fds[2] = {{out, POLLIN, 0}, {err, POLLIN, 0}};
  char buf[4096];
  for (int open = 2; open > 0;) {
    if (::poll(fds, 2, -1) < 0) continue;  // EINTR
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !fds[i].revents) continue;
      const ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
      if (n > 0) {
        (i == 0 ? r.out : r.err).append(buf, static_cast<std::size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open;
      }
    }
  }
  r.code = c.reap().shell_code();
  return r;
}

std::string self_executable() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "/proc/self/exe";
  buf[n] = '\0';
  return buf;
}

}  // namespace isorun::runner
