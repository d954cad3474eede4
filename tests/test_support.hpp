#pragma once
// Helpers shared by the test binaries: process liveness, /dev/shm and fd accounting.
#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <string>

namespace isorun::test {

/// Entries in /dev/shm whose name starts with "isorun".
inline int shm_entries() {
  int n = 0;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d))
      if (std::string(e->d_name).rfind("isorun", 0) == 0) ++n;
    ::closedir(d);
  }
  return n;
}

/// Open descriptors of this process.
inline int open_fds() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (dirent* e = ::readdir(d))
      if (e->d_name[0] != '.') ++n;
    ::closedir(d);
  }
  return n - 1;  // the DIR's own descriptor
}

/// Waits until process `pid` (any process, not only a child) has exited, at most `bound_ms`
/// (a safety bound so that a regression fails instead of hanging). True if it is gone.
inline bool process_gone(pid_t pid, int bound_ms = 30000) {
  int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) return errno == ESRCH;
  pollfd p{fd, POLLIN, 0};
  int rc = ::poll(&p, 1, bound_ms);
  ::close(fd);
  return rc == 1;
}

}  // namespace isorun::test
