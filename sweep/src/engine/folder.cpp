// Files in a sweep's output folder: by name, inside the folder, not through links.
#include "engine/folder.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "isorun/runner/errors.hpp"
#include "isorun/serialization/whole_file.hpp"

namespace isorun::sweep::detail {
namespace fs = std::filesystem;

namespace {
[[noreturn]] void refuse_link(const fs::path& shown) {
  throw usage_error(shown.string() + " is a symbolic link; isorun reads and writes a sweep's files only inside its " +
                    "folder, never through a link: remove it (only the output folder itself may be a link)");
}
}  // namespace

unique_fd open_folder(const fs::path& dir) {
  unique_fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd && errno != ENOENT && errno != ENOTDIR)
    throw internal_error("cannot open " + dir.string() + ": " + std::strerror(errno));
  return fd;
}

unique_fd open_subfolder(int dir, const std::string& name, bool create, const fs::path& shown) {
  if (create && ::mkdirat(dir, name.c_str(), 0755) != 0 && errno != EEXIST)
    throw internal_error("cannot create " + shown.string() + ": " + std::strerror(errno));
  unique_fd fd(::openat(dir, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (fd) return fd;
  if (errno == ENOENT && !create) return fd;
  if (errno == ELOOP) refuse_link(shown);
  if (errno == ENOTDIR) {
    struct stat st {};
    if (::fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode)) refuse_link(shown);
    throw usage_error(shown.string() + " is not a folder; remove it, or " + std::string(another_out));
  }
  throw internal_error("cannot open " + shown.string() + ": " + std::strerror(errno));
}

unique_fd open_subfolders(const fs::path& out, std::initializer_list<const char*> names, bool create) {
  unique_fd fd = open_folder(out);
  if (!fd && create) throw internal_error("cannot open " + out.string() + ": no such folder");
  fs::path shown = out;
  for (const char* name : names) {
    if (!fd) return fd;
    shown /= name;
    fd = open_subfolder(fd.get(), name, create, shown);
  }
  return fd;
}

unique_fd open_file(int dir, const std::string& name, int flags, const fs::path& shown) {
  unique_fd fd(serialization::open_regular_file(dir, name, flags));
  if (fd) return fd;
  if (errno == ENOENT && !(flags & O_CREAT)) return fd;
  if (errno == ELOOP) refuse_link(shown);
  if (errno == EINVAL)
    throw usage_error(shown.string() +
                      " is not a regular file (a FIFO, a device or a folder); isorun reads and writes " +
                      "only plain files in a sweep's folder: remove it, or " + std::string(another_out));
  throw internal_error("cannot open " + shown.string() + ": " + std::strerror(errno));
}

std::string read_all(int fd, std::size_t limit, const fs::path& shown) {
  std::string text;
  const int failed = serialization::read_bounded(fd, limit, text);
  if (failed == EFBIG)
    throw usage_error(shown.string() + " is larger than " + std::to_string(limit >> 20) +
                      " MiB, more than isorun ever writes there; remove it, or " + std::string(another_out));
  if (failed) throw internal_error("cannot read " + shown.string() + ": " + std::strerror(failed));
  return text;
}

lines_read read_lines(int fd, std::size_t max_line, std::size_t budget, bool in_long_line, const fs::path& shown,
                      const std::function<void(std::string_view, int, bool)>& line) {
  lines_read r;
  std::string current;
  bool too_long = in_long_line;
  int number = 0;
  char buf[65536];
  while (r.read < budget) {
    const ssize_t n = ::read(fd, buf, std::min(sizeof buf, budget - r.read));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw internal_error("cannot read " + shown.string() + ": " + std::strerror(errno));
    if (n == 0) break;
    for (std::string_view chunk(buf, static_cast<std::size_t>(n)); !chunk.empty();) {
      const std::size_t nl = chunk.find('\n');
      const std::string_view part = chunk.substr(0, nl);
      if (!too_long && current.size() + part.size() > max_line) {
        too_long = true;
        current = std::string();  // its memory goes back now
      }
      if (!too_long) current.append(part);
      if (nl == std::string_view::npos) {
        r.read += chunk.size();
        break;
      }
      r.read += nl + 1;
      r.complete = r.read;
      line(too_long ? std::string_view() : std::string_view(current), ++number, too_long);
      current.clear();
      too_long = false;
      chunk.remove_prefix(nl + 1);
    }
  }
  r.long_tail = too_long && r.read > r.complete;
  return r;
}

std::size_t for_each_line(int fd, std::size_t max_line, const fs::path& shown,
                          const std::function<void(std::string_view, int, bool)>& line) {
  return read_lines(fd, max_line, std::numeric_limits<std::size_t>::max(), false, shown, line).complete;
}

void drop_cut_line(int fd, std::size_t complete, const fs::path& shown) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) == complete) return;
  if (::ftruncate(fd, static_cast<off_t>(complete)) != 0) throw internal_error("cannot repair " + shown.string());
  ::fsync(fd);
}

int write_all(int fd, std::string_view s) {
  const char* p = s.data();
  std::size_t n = s.size();
  while (n) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return errno;
    if (w == 0) return EIO;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return 0;
}

std::string timeline_file(const std::string& id, int attempt) {
  return id + (attempt > 1 ? ".attempt" + std::to_string(attempt) : "") + ".memory.json";
}

}  // namespace isorun::sweep::detail
