#include "isorun/serialization/shm_segment.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <system_error>

namespace isorun::serialization {
namespace {

[[noreturn]] void throw_errno(const std::string& what) {
  throw std::system_error(errno, std::generic_category(), what);
}

std::string random_name() {
  unsigned char bytes[16];
  std::size_t got = 0;
  while (got < sizeof bytes) {
    ssize_t n = ::getrandom(bytes + got, sizeof bytes - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_errno("getrandom");
    }
    got += static_cast<std::size_t>(n);
  }
  char name[80];
  int len = std::snprintf(name, sizeof name, "/%s%ld-", segment_prefix, static_cast<long>(::getpid()));
  for (unsigned char b : bytes) len += std::snprintf(name + len, sizeof name - len, "%02x", b);
  return name;
}

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
  for (int attempt = 0;; ++attempt) {
    const std::string name = random_name();
    int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
      if (errno == EEXIST && attempt < 4) continue;
      throw_errno("shm_open(" + name + ")");
    }
    // Unlink first: from here on a crash cannot leave the name behind.
    ::shm_unlink(name.c_str());
    shm_file file{fd};
    if (size > 0) file.reserve(size);
    return file;
  }
}

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
  if (rc != 0) throw_errno("growing shared memory segment to " + std::to_string(size) + " bytes (is /dev/shm full?)");
}

mapping::mapping(mapping&& other) noexcept : addr_{other.addr_}, length_{other.length_} {
  other.addr_ = nullptr;
  other.length_ = 0;
}

mapping& mapping::operator=(mapping&& other) noexcept {
  if (this != &other) {
    if (addr_) ::munmap(addr_, length_);
    addr_ = other.addr_;
    length_ = other.length_;
    other.addr_ = nullptr;
    other.length_ = 0;
  }
  return *this;
}

mapping::~mapping() {
  if (addr_) ::munmap(addr_, length_);
}

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

std::size_t remove_stale_segments() noexcept {
  std::size_t removed = 0;
  DIR* dir = ::opendir("/dev/shm");
  if (!dir) return 0;
  const std::size_t prefix_len = std::strlen(segment_prefix);
  while (dirent* entry = ::readdir(dir)) {
    const char* name = entry->d_name;
    if (std::strncmp(name, segment_prefix, prefix_len) != 0) continue;
    char* end = nullptr;
    long pid = std::strtol(name + prefix_len, &end, 10);
    if (pid <= 0 || !end || *end != '-') continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    std::string path = std::string("/") + name;
    if (::shm_unlink(path.c_str()) == 0) ++removed;
  }
  ::closedir(dir);
  return removed;
}

}  // namespace isorun::serialization
