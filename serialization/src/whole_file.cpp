#include "isorun/serialization/whole_file.hpp"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>

namespace isorun::serialization {

std::string temporary_name(const std::string& name) {
  std::uint64_t r = 0;
  if (::getrandom(&r, sizeof r, GRND_NONBLOCK) != static_cast<ssize_t>(sizeof r))
    // No entropy yet (early boot): unpredictable enough, and O_EXCL keeps it safe regardless.
    r = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) *
            0x9e3779b97f4a7c15ULL ^
        static_cast<std::uint64_t>(::getpid());
  char hex[16];
  std::snprintf(hex, sizeof hex, "%012llx", static_cast<unsigned long long>(r & 0xffffffffffffULL));
  return name + "." + hex + ".tmp";
}

int write_whole_file(int dir_fd, const std::string& name, std::string_view content, bool durable) {
  std::string tmp;
  int fd = -1;
  for (int attempt = 0; fd < 0 && attempt < 16; ++attempt) {
    tmp = temporary_name(name);
    fd = ::openat(dir_fd, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0 && errno != EEXIST) return errno;
  }
  if (fd < 0) return EEXIST;
  int failed = 0;
  for (const char* p = content.data(); !failed && p != content.data() + content.size();) {
    const ssize_t w = ::write(fd, p, static_cast<std::size_t>(content.data() + content.size() - p));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) failed = errno;
    else if (w == 0) failed = EIO;
    else p += w;
  }
  if (!failed && durable && ::fsync(fd) != 0) failed = errno;
  if (::close(fd) != 0 && !failed && errno != EINTR) failed = errno;
  if (!failed && ::renameat(dir_fd, tmp.c_str(), dir_fd, name.c_str()) != 0) failed = errno;
  if (failed) ::unlinkat(dir_fd, tmp.c_str(), 0);
  return failed;
}

int write_whole_file(const std::string& path, std::string_view content, bool durable) {
  const auto slash = path.rfind('/');
  const std::string folder = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  const int dir = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return errno;
  const int failed = write_whole_file(dir, path.substr(slash + 1), content, durable);
  ::close(dir);
  return failed;
}

int open_regular_file(int dir_fd, const std::string& name, int flags) {
  // O_NONBLOCK: opening a FIFO must not wait for its other end; it is refused below.
  const int fd = ::openat(dir_fd, name.c_str(), flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
  int failed = fd < 0 ? (errno == ENXIO || errno == EISDIR ? EINVAL : errno) : 0;
  struct stat st {};
  if (!failed && (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))) failed = EINVAL;
  if (!failed && ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) failed = errno;
  if (!failed) return fd;
  if (fd >= 0) ::close(fd);
  errno = failed;
  return -1;
}

int read_bounded(int fd, std::size_t limit, std::string& out) {
  out.clear();
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    const int failed = n < 0 ? errno : out.size() + static_cast<std::size_t>(n) > limit ? EFBIG : 0;
    if (failed) out.clear();
    if (failed || n == 0) return failed;
    out.append(buf, static_cast<std::size_t>(n));
  }
}

int read_whole_file(int dir_fd, const std::string& name, std::size_t limit, std::string& out) {
  out.clear();
  const int fd = open_regular_file(dir_fd, name, O_RDONLY);
  if (fd < 0) return errno;
  const int failed = read_bounded(fd, limit, out);
  ::close(fd);
  return failed;
}

}  // namespace isorun::serialization
