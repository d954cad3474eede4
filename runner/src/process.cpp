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
//
// A child that gets a cgroup of its own is started by clone3(CLONE_INTO_CGROUP) instead, which
// Boost.Process cannot do: it is born in its cgroup, so no migration (a write to cgroup.procs,
// which takes the kernel's cgroup threadgroup lock for writing) is on the start's path. Both
// ways run the same child-side steps (prepare_child) before execve.
#include "isorun/runner/process.hpp"

#include "isorun/runner/containment.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/process/v2/posix/vfork_launcher.hpp>
#include <boost/process/v2/process.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <optional>

#include <linux/sched.h>

#ifndef P_PIDFD
#define P_PIDFD 3
#endif

namespace bp = boost::process::v2;

namespace isorun::runner {
namespace {

constexpr std::size_t max_fds = 16;

// Whether a child that gets a cgroup also gets a cgroup namespace rooted there: true until the
// kernel refuses one (no CAP_SYS_ADMIN), then never asked again.
std::atomic<bool> cgroup_namespaces{true};

int pidfd_open(pid_t pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }

// The steps of a new child between its creation and execve, on either start path: signals back
// to their defaults, its own process group, its cgroup (where it was not born there), the parent
// death signal, and the descriptors it is given. It runs in a child that shares the parent's
// memory: async-signal-safe calls only, no allocation, and no sanitizer instrumentation (it may
// run on a stack the sanitizers do not know). Returns 0, or the errno of the step that failed.
__attribute__((no_sanitize("address", "undefined"))) int prepare_child(const spawn_options& options, pid_t parent,
                                                                       int cgroup_procs,
                                                                       std::array<int, max_fds>& scratch) {
  sigset_t all;
  ::sigfillset(&all);
  ::sigprocmask(SIG_SETMASK, &all, nullptr);
  // Handlers are reset by exec anyway; ignored signals are not, and an ignored SIGPIPE or
  // SIGINT in the supervisor must not leak into the worker. (On the clone3 path this also
  // keeps the parent's handlers from running in the child before exec.)
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    struct sigaction sa {};
    sa.sa_handler = SIG_DFL;
    ::sigaction(sig, &sa, nullptr);
  }
  if (options.new_process_group && ::setpgid(0, 0) != 0) return errno;
  // Into its cgroup before anything of the child's own runs ("0": the writing process).
  if (cgroup_procs >= 0) {
    if (::write(cgroup_procs, "0", 1) != 1) return errno;
    // Rooted there, as clone3 roots it (see clone_into_cgroup); refused without CAP_SYS_ADMIN.
    if (options.cgroup_namespace && cgroup_namespaces.load(std::memory_order_relaxed)) ::unshare(CLONE_NEWCGROUP);
  }
  if (options.join_cgroup_procs >= 0 && ::write(options.join_cgroup_procs, "0", 1) != 1) return errno;
  if (options.parent_death_signal) {
    ::prctl(PR_SET_PDEATHSIG, options.parent_death_signal);
    if (::getppid() != parent) ::_exit(127);  // the parent died before prctl took effect
  }
  // Two phases so that a source fd numbered like another target is not clobbered.
  int top = 2;
  for (const auto& [target, source] : options.fds) top = target > top ? target : top;
  std::size_t i = 0;
  for (const auto& [target, source] : options.fds) {
    scratch[i] = ::fcntl(source, F_DUPFD_CLOEXEC, top + 1);
    if (scratch[i] < 0) return errno;
    ++i;
  }
  i = 0;
  for (const auto& [target, source] : options.fds)
    if (::dup2(scratch[i++], target) < 0) return errno;
  sigset_t none;
  ::sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  return 0;
}

// The Boost.Process path: prepare_child as the vfork child's exec-setup hook.
struct isolation_init {
  const spawn_options* options;
  pid_t parent;
  int cgroup_procs = -1;  // the child's cgroup.procs, opened by the parent
  int exec_errno = 0;
  std::array<int, max_fds> scratch{};

  bp::error_code on_setup(bp::posix::default_launcher& launcher, const bp::filesystem::path&, const char* const*) {
    for (const auto& [target, source] : options->fds)
      if (target > 2) launcher.fd_whitelist.push_back(target);
    return {};
  }

  bp::error_code on_exec_setup(bp::posix::default_launcher&, const bp::filesystem::path&, const char* const*) {
    const int err = prepare_child(*options, parent, cgroup_procs, scratch);
    return err ? bp::error_code{err, bp::system_category()} : bp::error_code{};
  }

  // Boost 1.81 only detects this (never defined) signature; the one below is what it calls.
  void on_exec_error(bp::posix::default_launcher&, bp::error_code, const bp::filesystem::path&, const char* const*,
                     bp::error_code);
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

// clone3 with a function to run on a stack of its own, in the child: the raw system call returns
// twice, and a child sharing the parent's memory must not return through the parent's frames,
// so the switch happens here, in assembly (as libc's clone does). Returns the child's pid to the
// parent, or -errno. The child calls fn(arg), which must not return.
extern "C" long isorun_clone3_run(clone_args* args, std::size_t size, void (*fn)(void*), void* arg);
#if defined(__x86_64__)
asm(R"(
  .text
  .globl isorun_clone3_run
  .hidden isorun_clone3_run
  .type isorun_clone3_run, @function
isorun_clone3_run:
  .cfi_startproc
  mov %rdx, %r8          # fn and arg survive the system call in r8 and r9
  mov %rcx, %r9
  mov $435, %eax         # SYS_clone3
  syscall
  test %rax, %rax
  jnz 1f                 # the parent (a pid), or an error
  .cfi_undefined rip     # the child: nothing to return to
  xor %ebp, %ebp
  mov %r9, %rdi
  call *%r8
  mov $127, %edi
  mov $60, %eax          # SYS_exit, should fn return
  syscall
  hlt
1:
  ret
  .cfi_endproc
  .size isorun_clone3_run, .-isorun_clone3_run
)");
constexpr bool have_clone3_run = true;
#elif defined(__aarch64__)
asm(R"(
  .text
  .globl isorun_clone3_run
  .hidden isorun_clone3_run
  .type isorun_clone3_run, %function
isorun_clone3_run:
  mov x8, #435           // SYS_clone3; fn (x2) and arg (x3) survive the call
  svc #0
  cbnz x0, 1f
  mov x29, xzr
  mov x0, x3
  blr x2
  mov x0, #127
  mov x8, #93            // SYS_exit, should fn return
  svc #0
1:
  ret
  .size isorun_clone3_run, .-isorun_clone3_run
)");
constexpr bool have_clone3_run = true;
#else
extern "C" long isorun_clone3_run(clone_args*, std::size_t, void (*)(void*), void*) { return -ENOSYS; }
constexpr bool have_clone3_run = false;
#endif

// What the clone3 child needs; it lives in the parent's memory, which the child shares.
struct clone_child {
  const spawn_options* options;
  pid_t parent;
  const char* const* argv;
  const char* const* envp;
  int exec_errno = 0;
  std::array<int, max_fds> scratch{};
};

[[noreturn]] __attribute__((no_sanitize("address", "undefined"))) void run_clone_child(void* p) {
  auto& c = *static_cast<clone_child*>(p);
  int err = prepare_child(*c.options, c.parent, -1, c.scratch);
  if (!err) {
    // Every descriptor past the ones given is closed, as Boost's launcher closes all but its
    // whitelist (most are close-on-exec already).
    int first = 3;
    for (const auto& [target, source] : c.options->fds) first = target >= first ? target + 1 : first;
    if (::syscall(SYS_close_range, first, ~0U, 0) != 0) {
      rlimit lim{};
      ::getrlimit(RLIMIT_NOFILE, &lim);
      for (rlim_t fd = static_cast<rlim_t>(first); fd < lim.rlim_cur && fd < 65536; ++fd) ::close(static_cast<int>(fd));
    }
    ::execve(c.options->executable.c_str(), const_cast<char* const*>(c.argv), const_cast<char* const*>(c.envp));
    err = errno;
  }
  c.exec_errno = err;  // the parent reads it once this child has exited
  ::_exit(127);
}

// Starts the child in `cgroup_fd` with clone3. The pid and a pidfd, or nullopt where this kernel
// or architecture has no clone3 with CLONE_INTO_CGROUP (the caller then moves the child in itself);
// throws what the caller's `failed` makes of a start that failed (passing it the child's pid,
// once there is a child, for it to reap).
template <class Failed>
std::optional<std::pair<pid_t, int>> clone_into_cgroup(const spawn_options& options, int cgroup_fd,
                                                       const char* const* envp, Failed&& failed) {
  if (!have_clone3_run) return std::nullopt;
  auto argv = c_strings(options.args);
  argv.insert(argv.begin(), options.executable.c_str());  // argv[0], as Boost's launcher passes it
  clone_child child{&options, ::getpid(), argv.data(), envp};

  constexpr std::size_t stack_size = 64 * 1024;
  void* stack = ::mmap(nullptr, stack_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  if (stack == MAP_FAILED) throw failed(errno);
  int pidfd = -1;
  clone_args args{};
  args.pidfd = reinterpret_cast<std::uint64_t>(&pidfd);
  args.exit_signal = SIGCHLD;
  args.stack = reinterpret_cast<std::uint64_t>(stack);
  args.stack_size = stack_size;
  args.cgroup = static_cast<std::uint64_t>(cgroup_fd);
  // No signal handler of this process may run in the child before prepare_child resets them.
  sigset_t all, previous;
  ::sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &previous);
  long pid;
  for (;;) {
    // In a cgroup namespace of its own, rooted at its cgroup, the child's tree cannot name the
    // cgroups above it, nor, where cgroup2 is mounted with nsdelegate (as systemd mounts it),
    // move a process out of it: the kernel refuses a move to or from a cgroup outside the
    // writer's namespace. Creating one takes CAP_SYS_ADMIN: without it the child shares this
    // process's namespace.
    const bool own_namespace = options.cgroup_namespace && cgroup_namespaces.load(std::memory_order_relaxed);
    args.flags = CLONE_VM | CLONE_VFORK | CLONE_PIDFD | CLONE_INTO_CGROUP | (own_namespace ? CLONE_NEWCGROUP : 0);
    pid = isorun_clone3_run(&args, sizeof args, run_clone_child, &child);
    if (pid != -EPERM || !own_namespace) break;
    cgroup_namespaces = false;
  }
  ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  ::munmap(stack, stack_size);  // CLONE_VFORK: the child has exec'd or exited
  if (pid == -ENOSYS || pid == -E2BIG || pid == -EINVAL) return std::nullopt;  // an older kernel
  if (pid < 0) throw failed(static_cast<int>(-pid));
  if (child.exec_errno) {
    ::close(pidfd);
    throw failed(child.exec_errno, static_cast<pid_t>(pid));
  }
  return std::pair{static_cast<pid_t>(pid), pidfd};
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

bool cgroup_namespaces_enabled() noexcept { return cgroup_namespaces.load(std::memory_order_relaxed); }

namespace {

// What spawn() refuses before it starts anything: more descriptors than it passes, or ones above
// 2 that are not contiguous from 3.
void check_fds(const spawn_options& options) {
  if (options.fds.size() > max_fds) throw spawn_error("too many descriptors to pass to a child", EINVAL);
  int expected = 3;
  for (const auto& [target, source] : options.fds) {
    if (target <= 2) continue;
    if (target != expected++) throw spawn_error("child descriptors above 2 must be contiguous from 3", EINVAL);
  }
}

// Every way a start can fail ends here: the child `started` (if any: exec failed, and it has
// exited, or the handle failed after it ran) reaped, and one spawn_error saying why.
spawn_error start_failed(const spawn_options& options, int err, pid_t started) {
  if (started > 0) {
    ::kill(started, SIGKILL);
    int status;
    while (::waitpid(started, &status, 0) < 0 && errno == EINTR) {
    }
  }
  const char* hint = err == EMFILE   ? " (too many open files: raise the limit, ulimit -n)"
                     : err == EAGAIN ? " (the process limit, ulimit -u, is reached, or memory is short)"
                                     : "";
  return spawn_error("cannot start " + options.executable + ": " + std::strerror(err) + hint, err);
}

// The started child's pidfd, which the child handle owns (killed and reaped where there is none).
int open_pidfd(pid_t pid) {
  const int pidfd = pidfd_open(pid);
  if (pidfd < 0) {
    const int err = errno;
    ::kill(pid, SIGKILL);
    int status;
    ::waitpid(pid, &status, 0);
    throw spawn_error("pidfd_open failed (Linux 5.3 or newer is required): " + std::string(std::strerror(err)), err);
  }
  ::fcntl(pidfd, F_SETFD, FD_CLOEXEC);
  return pidfd;
}

}  // namespace

child spawn(const spawn_options& options) {
  check_fds(options);

  bp::posix::vfork_launcher launcher;
  const auto envp = c_strings(options.env);
  launcher.env = envp.data();
  isolation_init init{&options, ::getpid()};
  // The cgroup is this call's until a child owns it: every failure below removes it.
  struct cgroup_guard {
    const std::string& dir;
    int fd = -1;  // the directory (clone3), or its cgroup.procs (a move by the child itself)
    bool owned = false;
    ~cgroup_guard() {
      if (fd >= 0) ::close(fd);
      if (!dir.empty() && !owned) kill_and_remove_cgroup(dir);
    }
  } cgroup{options.cgroup};
  auto open_cgroup = [&](const std::string& path, int flags) {
    if (cgroup.fd >= 0) ::close(cgroup.fd);
    cgroup.fd = ::open(path.c_str(), flags | O_CLOEXEC);
    if (cgroup.fd < 0) throw spawn_error("cannot join cgroup " + options.cgroup + ": " + std::strerror(errno), errno);
  };
  // Every way the start can fail ends here (start_failed): the child, if one was started
  // (`started` from clone3, else Boost's), reaped, and one spawn_error saying why.
  auto failed = [&](int err, pid_t started = -1) {
    return start_failed(options, err, started > 0 ? started : launcher.pid);
  };
  if (!options.cgroup.empty()) {
    // Born in its cgroup where the kernel can (Linux 5.7), else moved there by the child itself.
    static std::atomic<bool> clone3_works{true};
    if (clone3_works.load(std::memory_order_relaxed)) {
      open_cgroup(options.cgroup, O_RDONLY | O_DIRECTORY);
      if (auto started = clone_into_cgroup(options, cgroup.fd, envp.data(), failed)) {
        cgroup.owned = true;
        return child(started->first, started->second, options.new_process_group, options.cgroup);
      }
      clone3_works = false;
    }
    open_cgroup(options.cgroup + "/cgroup.procs", O_WRONLY);
    init.cgroup_procs = cgroup.fd;
  }
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
  const int pidfd = open_pidfd(pid);
  cgroup.owned = true;
  return child(pid, pidfd, options.new_process_group, options.cgroup);
}

child::child(child&& other) noexcept
    : pid_{std::exchange(other.pid_, -1)},
      pidfd_{std::exchange(other.pidfd_, -1)},
      group_{other.group_},
      cgroup_{std::move(other.cgroup_)},
      memory_peak_{other.memory_peak_},
      max_rss_{other.max_rss_} {
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
    max_rss_ = other.max_rss_;
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
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                                            std::chrono::steady_clock::now());
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
  rusage usage{};
  // The system call, not glibc's waitid: only it hands back the child's resource usage, whose
  // largest resident set is the peak where no cgroup measures one.
  while (::syscall(SYS_waitid, P_PIDFD, pidfd_, &info, WEXITED, &usage) != 0 && errno == EINTR) {
  }
  status = from_siginfo(info);
  max_rss_ = static_cast<std::uint64_t>(usage.ru_maxrss) * 1024;
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

program_output run_to_end(const std::string& executable, std::vector<std::string> args, std::vector<std::string> env) {
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) throw spawn_error(std::string("pipe2: ") + std::strerror(errno), errno);
  if (::pipe2(err, O_CLOEXEC) != 0) {
    const int e = errno;
    ::close(out[0]);
    ::close(out[1]);
    throw spawn_error(std::string("pipe2: ") + std::strerror(e), e);
  }
  spawn_options opts;
  opts.executable = executable;
  opts.args = std::move(args);
  opts.env = std::move(env);
  opts.fds = {{1, out[1]}, {2, err[1]}};
  child c;
  try {
    c = spawn(opts);
  } catch (...) {
    for (int fd : {out[0], out[1], err[0], err[1]}) ::close(fd);
    throw;
  }
  ::close(out[1]);
  ::close(err[1]);
  return collect_output(c, out[0], err[0]);
}

std::string self_executable() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "/proc/self/exe";
  buf[n] = '\0';
  return buf;
}

}  // namespace isorun::runner
