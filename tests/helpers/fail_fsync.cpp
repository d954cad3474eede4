// A disk whose writes stop being made durable: preloaded into a program (LD_PRELOAD), it makes
// fsync() and fdatasync() fail with EIO on files whose path ends with $FAIL_FSYNC_SUFFIX, from
// the $FAIL_FSYNC_AFTER-th such call on (counted from 0), and keeps failing after that, as a
// disk that has gone bad does. Every other call goes to the C library.
//
// Not a mock of the sweep's journal: the program under test runs as it is, and only the answer
// of the kernel call is replaced, as dm-error would replace it on a real block device (which
// needs a loop device this machine may not have).
#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

namespace {

using sync_fn = int (*)(int);

bool matches(int fd) {
  const char* suffix = std::getenv("FAIL_FSYNC_SUFFIX");
  if (!suffix) return false;
  char link[64], path[4096];
  std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  const ssize_t n = ::readlink(link, path, sizeof path - 1);
  if (n <= 0) return false;
  const std::string_view p(path, static_cast<std::size_t>(n));
  return p.ends_with(suffix);
}

bool fail_this_one(int fd) {
  static std::atomic<long> calls{0};
  if (!matches(fd)) return false;
  const char* after = std::getenv("FAIL_FSYNC_AFTER");
  return calls++ >= (after ? std::atol(after) : 0);
}

int forward(const char* name, int fd) {
  static auto real_fsync = reinterpret_cast<sync_fn>(::dlsym(RTLD_NEXT, "fsync"));
  static auto real_fdatasync = reinterpret_cast<sync_fn>(::dlsym(RTLD_NEXT, "fdatasync"));
  return (std::strcmp(name, "fsync") == 0 ? real_fsync : real_fdatasync)(fd);
}

}  // namespace

extern "C" int fsync(int fd) {
  if (fail_this_one(fd)) {
    errno = EIO;
    return -1;
  }
  return forward("fsync", fd);
}

extern "C" int fdatasync(int fd) {
  if (fail_this_one(fd)) {
    errno = EIO;
    return -1;
  }
  return forward("fdatasync", fd);
}
