// isorun._core, a zygote: an interpreter that imported the preloads and never initialized CUDA
// forks a worker per request of the supervisor (runner/zygote.hpp has the other side).
// bounds before the caller sees it; the Python side then parses it bounds-checked.
#include <nanobind/nanobind.h>

#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <linux/sched.h>

#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "isorun/preload/cap_region.hpp"
#include "isorun/runner/zygote.hpp"
#include "isorun/serialization/control.hpp"
#include "isorun/serialization/protocol.hpp"
#include "isorun/worker/warm_pages.hpp"
#include "module.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using isorun_python::python_task;

namespace {

/// The threads of this process now (a zygote must have one to fork safely).
int thread_count() {
  DIR* d = ::opendir("/proc/self/task");
  if (!d) return -1;
  int n = 0;
  while (const dirent* e = ::readdir(d))
    if (e->d_name[0] != '.') ++n;
  ::closedir(d);
  return n;
}

namespace zw = isorun::runner::zygote_wire;

void zygote_reply(const zw::reply& rep, int pidfd) {
  isorun::serialization::send_with_fds(isorun::serialization::control_fd, std::as_bytes(std::span(&rep, 1)),
                                       pidfd >= 0 ? std::span<const int>(&pidfd, 1) : std::span<const int>());
}

/// The forked child's steps before it returns to Python: its own process group, death with the
/// supervisor, its descriptors 0-3 (3: its own control socket, in place of the zygote's). The
/// GIL is held; this process has one thread. Returns 0 or the errno of the step that failed.
int zygote_child_setup(const int* fds, int nfds, pid_t supervisor) {
  if (::setpgid(0, 0) != 0) return errno;
  // The parent is the supervisor (CLONE_PARENT), whose thread that started the zygote this
  // signal follows, as an exec'd worker's follows the thread that spawned it.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != supervisor) ::_exit(127);  // the supervisor died before prctl took effect
  int moved[zw::child_fds];
  for (int i = 0; i < zw::child_fds; ++i) {
    moved[i] = ::fcntl(fds[i], F_DUPFD_CLOEXEC, 16);
    if (moved[i] < 0) return errno;
  }
  for (int i = 0; i < nfds; ++i) ::close(fds[i]);
  for (int i = 0; i < zw::child_fds; ++i) {
    if (::dup2(moved[i], i) < 0) return errno;
    ::close(moved[i]);
  }
  return 0;
}

/// Waits, without the GIL, for the supervisor's next request on `control` and the descriptors that
/// come with it (at most the child's and a cgroup's: the rest are closed). Returns recvmsg's count.
ssize_t receive_request(int control, zw::request& req, int* fds, int& nfds) {
  nb::gil_scoped_release unlocked;
  std::size_t got = 0;
  const ssize_t n = isorun::serialization::receive_with_fds(
      control, std::as_writable_bytes(std::span(&req, 1)),
      std::span(fds + nfds, static_cast<std::size_t>(zw::child_fds + 1 - nfds)), got);
  nfds += static_cast<int>(got);
  return n;
}

/// Forks the worker `req` asks for (clone3: the supervisor's child, born in the cgroup `cgroup`
/// where it is not -1), its pidfd into `pidfd`: 0 in the child, its pid in the zygote, -1 (errno)
/// where it failed. Between PyOS_BeforeFork and its After calls.
long fork_worker(const zw::request& req, int cgroup, int& pidfd) {
  clone_args args{};
  args.flags = CLONE_PARENT | CLONE_PIDFD;
  args.pidfd = reinterpret_cast<std::uint64_t>(&pidfd);
  args.exit_signal = 0;  // with CLONE_PARENT: the zygote's own, SIGCHLD, to the supervisor
  if (cgroup >= 0) {
    args.flags |= CLONE_INTO_CGROUP;
    args.cgroup = static_cast<std::uint64_t>(cgroup);
    if (req.flags & zw::with_namespace) args.flags |= CLONE_NEWCGROUP;
  }
  long pid = ::syscall(SYS_clone3, &args, sizeof args);
  if (pid < 0 && errno == EPERM && (args.flags & CLONE_NEWCGROUP)) {
    args.flags &= ~static_cast<std::uint64_t>(CLONE_NEWCGROUP);  // no CAP_SYS_ADMIN here
    pid = ::syscall(SYS_clone3, &args, sizeof args);
  }
  return pid;
}

/// A zygote's loop: waits for the supervisor's requests on the control socket and forks a worker
/// for each (clone3: the supervisor's child, born in its cgroup). Returns in each forked child
/// (which then becomes an ordinary worker waiting for its assignment); the zygote itself exits
/// when the supervisor hangs up. The GIL is released while it waits.
void zygote_serve() {
  const pid_t supervisor = ::getppid();
  const int control = isorun::serialization::control_fd;
  isorun::worker::note_pages_to_warm();  // what the preloads and the rehearsal mapped, for each worker to map
  zygote_reply({.pid = 0, .error = 0, .threads = thread_count()}, -1);  // ready: the preloads are imported
  for (;;) {
    zw::request req{};
    int fds[zw::child_fds + 1];
    int nfds = 0;
    const ssize_t n = receive_request(control, req, fds, nfds);
    if (n <= 0) ::_exit(0);  // the supervisor hung up (or the socket failed): no more workers
    auto close_all = [&] {
      for (int i = 0; i < nfds; ++i) ::close(fds[i]);
    };
    const bool with_cgroup = req.flags & zw::with_cgroup;
    if (n != static_cast<ssize_t>(sizeof req) || req.magic != zw::magic ||
        nfds != zw::child_fds + (with_cgroup ? 1 : 0)) {
      close_all();
      zygote_reply({.pid = -1, .error = EINVAL}, -1);
      continue;
    }
    // Forking copies only the calling thread: a thread a preload started (a BLAS pool) would be
    // missing in the child with whatever locks it held. Refused, and the supervisor execs instead.
    if (const int threads = thread_count(); threads != 1) {
      close_all();
      zygote_reply({.pid = -1, .error = zw::error_threads, .threads = threads}, -1);
      continue;
    }
    int pidfd = -1;
    PyOS_BeforeFork();
    const long pid = fork_worker(req, with_cgroup ? fds[zw::child_fds] : -1, pidfd);
    if (pid == 0) {
      PyOS_AfterFork_Child();
      if (const int err = zygote_child_setup(fds, nfds, supervisor)) {
        const std::string line = std::string("isorun: a worker forked from the zygote failed to start: ") +
                                 std::strerror(err) + "\n";
        [[maybe_unused]] auto w = ::write(2, line.data(), line.size());
        ::_exit(127);
      }
      return;
    }
    const int err = pid < 0 ? errno : 0;
    PyOS_AfterFork_Parent();
    close_all();
    zygote_reply({.pid = pid > 0 ? static_cast<std::int32_t>(pid) : -1, .error = err}, pid > 0 ? pidfd : -1);
    if (pidfd >= 0) ::close(pidfd);
  }
}

/// In a zygote's child, once its environment is its call's: CUDA allowed from now on, under the
/// deferred cap (`capped`) or none at all (the cap library steps aside).
void cap_thaw(bool capped) {
  using thaw_t = void (*)(int);
  if (auto* thaw = reinterpret_cast<thaw_t>(::dlsym(RTLD_DEFAULT, isorun::preload::thaw_symbol))) thaw(capped ? 1 : 0);
}
}  // namespace

namespace isorun_python {

void bind_zygote(nb::module_& m) {
  m.def("zygote_serve", &zygote_serve,
        "A zygote's loop: forks a worker per request of the supervisor; returns in each forked child.");
  m.def("cap_thaw", &cap_thaw, "capped"_a, "A zygote's child: CUDA allowed from now on (under the deferred cap).");
}

}  // namespace isorun_python
