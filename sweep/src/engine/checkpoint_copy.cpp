// Checkpoint copies that cost the disk what the original does (checkpoint_copy.hpp).
#include "isorun/sweep/checkpoint_copy.hpp"

#include <fcntl.h>
#include <linux/fs.h>  // FICLONE
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "isorun/runner/unique_fd.hpp"
#include "isorun/runner/units.hpp"

namespace isorun::sweep {

namespace {
namespace fs = std::filesystem;

constexpr off_t piece = off_t{64} << 20;  // the most copied between two looks at `stop`

[[noreturn]] void fail(const std::string& what, const fs::path& where, int err) {
  throw std::runtime_error("cannot " + what + " " + where.string() + ": " + std::strerror(err));
}

void check(const std::atomic<bool>& stop) {
  if (stop) throw std::runtime_error("the copy was stopped: the sweep is ending");
}

// One thing a checkpoint holds, as lstat saw it.
struct item {
  fs::path relative;
  mode_t mode = 0;
  off_t size = 0;
};

// What `from` holds, each folder before what it holds, never through a link; `total`: its
// files' apparent size.
std::vector<item> listing(const fs::path& from, std::uint64_t& total) {
  std::vector<item> items;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(from, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    struct stat st {};
    if (::lstat(it->path().c_str(), &st) != 0) fail("look at", it->path(), errno);
    if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode) && !S_ISLNK(st.st_mode))
      throw std::runtime_error(it->path().string() +
                               " is neither a file, a folder nor a symbolic link (a FIFO, a socket or a device), "
                               "which a checkpoint cannot hold");
    if (S_ISREG(st.st_mode)) total += static_cast<std::uint64_t>(st.st_size);
    items.push_back({it->path().lexically_relative(from), st.st_mode, st.st_size});
  }
  if (ec) fail("read", from, ec.value());
  return items;
}

void write_all(int out, const char* p, std::size_t n, off_t at, const fs::path& where) {
  while (n > 0) {
    const ssize_t w = ::pwrite(out, p, n, at);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail("write", where, w < 0 ? errno : EIO);
    p += w;
    n -= static_cast<std::size_t>(w);
    at += w;
  }
}

// Bytes [at, end) of `in` to the same place in `out`: copy_file_range (in the kernel, shared
// blocks where the file system can), else read and write.
void copy_range(int in, int out, off_t at, off_t end, const fs::path& to, const std::atomic<bool>& stop) {
  bool in_kernel = true;
  std::vector<char> buffer;
  while (at < end) {
    check(stop);
    const auto n = static_cast<std::size_t>(std::min(piece, end - at));
    ssize_t done = 0;
    if (in_kernel) {
      off_t in_at = at, out_at = at;
      done = ::copy_file_range(in, &in_at, out, &out_at, n, 0);
      if (done < 0 && (errno == EXDEV || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP)) {
        in_kernel = false;  // (not between these file systems, or not on this kernel)
        continue;
      }
    } else {
      buffer.resize(std::size_t{1} << 20);
      done = ::pread(in, buffer.data(), std::min(n, buffer.size()), at);
      if (done > 0) write_all(out, buffer.data(), static_cast<std::size_t>(done), at, to);
    }
    if (done < 0 && errno == EINTR) continue;
    if (done < 0) fail("copy into", to, errno);
    if (done == 0) return;  // the file is shorter than it was: the rest stays a hole
    at += done;
  }
}

// One file, `left` the apparent size still allowed: cloned where the file system can, else its
// data, hole by hole.
void copy_file(const fs::path& from, const fs::path& to, std::uint64_t& left, const std::atomic<bool>& stop) {
  // (O_NONBLOCK: a FIFO put in the file's place since the listing does not hold the open up.)
  const unique_fd in(::open(from.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  if (!in) fail("open", from, errno);
  struct stat st {};
  if (::fstat(in.get(), &st) != 0) fail("look at", from, errno);
  if (!S_ISREG(st.st_mode)) throw std::runtime_error(from.string() + " is no longer a file");
  if (static_cast<std::uint64_t>(st.st_size) > left)
    throw std::runtime_error(from.string() + " grew while the checkpoint was copied");
  left -= static_cast<std::uint64_t>(st.st_size);
  const unique_fd out(::open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!out) fail("create", to, errno);
  if (::ioctl(out.get(), FICLONE, in.get()) != 0) {
    for (off_t at = 0; at < st.st_size;) {
      off_t data = ::lseek(in.get(), at, SEEK_DATA);
      off_t hole = st.st_size;
      if (data < 0 && errno == ENXIO) break;  // nothing but a hole is left
      if (data < 0 && errno != EINVAL) fail("look for data in", from, errno);
      if (data < 0) data = at;  // (a file system that cannot say: all of it is data)
      else if ((hole = ::lseek(in.get(), data, SEEK_HOLE)) < 0) fail("look for holes in", from, errno);
      hole = std::min(hole, st.st_size);
      if (data >= hole) break;
      copy_range(in.get(), out.get(), data, hole, to, stop);
      at = hole;
    }
  }
  // The size counted: a hole at the end made, a clone of a file that grew since cut back.
  if (::ftruncate(out.get(), st.st_size) != 0) fail("set the size of", to, errno);
  if (::fchmod(out.get(), st.st_mode & 07777) != 0) fail("set the permissions of", to, errno);
}

}  // namespace

void copy_checkpoint(const fs::path& from, const fs::path& to, const std::atomic<bool>& stop) {
  std::uint64_t total = 0;
  const std::vector<item> items = listing(from, total);
  // The bound on the apparent size: the space free where the copy goes. Holes are kept only
  // where the file systems tell them apart (SEEK_DATA); one that cannot has the copy write a
  // file's apparent size out in full. A checkpoint that could not be written out in full there
  // is no state a trial saved but a sparse file made to look large, and copying it could fill
  // the disk that also holds the sweep's journal: it is refused before anything is written.
  struct statvfs where {};
  if (::statvfs(to.c_str(), &where) != 0) fail("look at the file system of", to, errno);
  const std::uint64_t free = static_cast<std::uint64_t>(where.f_bavail) * where.f_frsize;
  if (total > free)
    throw std::runtime_error("checkpoint " + from.string() + " holds " + format_size(total) +
                             " (its files' apparent size, holes counted), more than the " + format_size(free) +
                             " free on the file system of " + to.parent_path().string() +
                             ", where a copy written out in full would not fit (free space there, or keep "
                             "checkpoints smaller)");
  std::uint64_t left = total;
  for (const item& i : items) {
    check(stop);
    const fs::path source = from / i.relative, target = to / i.relative;
    if (S_ISDIR(i.mode)) {
      // (Writable by its owner whatever the original says: the copy is written into it, and
      // pruning removes it.)
      if (::mkdir(target.c_str(), 0700) != 0) fail("create", target, errno);
      if (::chmod(target.c_str(), (i.mode & 07777) | S_IRWXU) != 0) fail("set the permissions of", target, errno);
    } else if (S_ISLNK(i.mode)) {
      std::error_code ec;
      const fs::path points_to = fs::read_symlink(source, ec);
      if (ec) fail("read the link", source, ec.value());
      fs::create_symlink(points_to, target, ec);
      if (ec) fail("create the link", target, ec.value());
    } else {
      copy_file(source, target, left, stop);
    }
  }
}

}  // namespace isorun::sweep
