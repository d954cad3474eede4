#include "isorun/serialization/shm_segment.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <system_error>

#include "parallel.hpp"

namespace isorun::serialization {
namespace {

[[noreturn]] void throw_errno(const std::string& what) {
  throw std::system_error(errno, std::generic_category(), what);
}

constexpr int all_write_seals = F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK;

}  // namespace

shm_file& shm_file::operator=(shm_file&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.release();
  }
  return *this;
}

shm_file::~shm_file() {
  if (fd_ >= 0) ::close(fd_);
}

shm_file shm_file::create(std::uint64_t size) {
  // The name only labels the descriptor in /proc/PID/fd ("memfd:isorun-segment").
  const int fd = ::memfd_create("isorun-segment", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) throw_errno("memfd_create");
  shm_file file{fd};
  if (::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) throw_errno("sealing a shared memory segment against shrinking");
  if (size > 0) file.reserve(size);
  return file;
}

bool shm_file::seal() {
  if (sealed()) return true;  // (by the worker that wrote it: early_result)
  if (::fcntl(fd_, F_ADD_SEALS, all_write_seals) != 0) {
    if (errno == EBUSY || errno == EPERM) return false;  // mapped writable somewhere; F_SEAL_SEAL already on
    throw_errno("sealing a shared memory segment");
  }
  ::fcntl(fd_, F_ADD_SEALS, F_SEAL_SEAL);  // and no seal can be added or removed any more
  return true;
}

int shm_file::seals() const noexcept {
  const int seals = ::fcntl(fd_, F_GET_SEALS);
  return seals > 0 ? seals : 0;
}

bool shm_file::sealed() const noexcept { return (seals() & all_write_seals) == all_write_seals; }

std::uint64_t shm_file::size() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) throw_errno("fstat(shared memory segment)");
  return static_cast<std::uint64_t>(st.st_size);
}

void shm_file::reserve(std::uint64_t size) {
  if (size <= this->size()) return;
  int rc;
  do {
    rc = ::ftruncate(fd_, static_cast<off_t>(size));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    const int err = errno;
    throw std::system_error(err, std::generic_category(),
                            "growing shared memory segment to " + std::to_string(size) + " bytes" +
                                (err == EFBIG ? " (above this process's file size limit, ulimit -f)" : ""));
  }
}

mapping::mapping(mapping&& other) noexcept : addr_{other.addr_}, length_{other.length_} {
  other.addr_ = nullptr;
  other.length_ = 0;
}

mapping& mapping::operator=(mapping&& other) noexcept {
  if (this != &other) {
    detail::unmap(addr_, length_);
    addr_ = other.addr_;
    length_ = other.length_;
    other.addr_ = nullptr;
    other.length_ = 0;
  }
  return *this;
}

mapping::~mapping() { detail::unmap(addr_, length_); }

mapping mapping::map(int fd, std::uint64_t length, access mode, bool populate) {
  mapping m;
  if (length == 0) return m;
  int prot = mode == access::read_write ? PROT_READ | PROT_WRITE : PROT_READ;
  int flags = MAP_SHARED | (populate ? MAP_POPULATE : 0);
  void* addr = ::mmap(nullptr, length, prot, flags, fd, 0);
  if (addr == MAP_FAILED) throw_errno("mmap of " + std::to_string(length) + "-byte shared memory segment");
  m.addr_ = addr;
  m.length_ = length;
  return m;
}

}  // namespace isorun::serialization
