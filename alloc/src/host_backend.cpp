#include "isorun/alloc/host_backend.hpp"

#include <sys/mman.h>

#include <cstring>

namespace isorun::alloc {

host_backend::host_backend(std::uint64_t capacity) : capacity_{capacity} {}
host_backend::~host_backend() = default;

void* host_backend::allocate(std::size_t bytes) {
  {
    std::lock_guard lock(mutex_);
    if (used_ + bytes > capacity_) return nullptr;
    used_ += bytes;
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    std::lock_guard lock(mutex_);
    used_ -= bytes;
    return nullptr;
  }
  return p;
}

void host_backend::deallocate(void* p, std::size_t bytes) noexcept {
  ::munmap(p, bytes);
  std::lock_guard lock(mutex_);
  used_ -= bytes;
}

memory_info host_backend::device_memory() const {
  std::lock_guard lock(mutex_);
  return {capacity_ - used_, capacity_};
}

void* host_backend::reserve_address(std::size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

void host_backend::release_address(void* p, std::size_t bytes) noexcept { ::munmap(p, bytes); }

bool host_backend::map(void* p, std::size_t bytes) {
  {
    std::lock_guard lock(mutex_);
    if (used_ + bytes > capacity_) return false;
    used_ += bytes;
  }
  if (::mprotect(p, bytes, PROT_READ | PROT_WRITE) != 0) {
    std::lock_guard lock(mutex_);
    used_ -= bytes;
    return false;
  }
  return true;
}

void host_backend::unmap(void* p, std::size_t bytes) noexcept {
  // Drop the pages (like cuMemUnmap + cuMemRelease) and make the range inaccessible again.
  ::madvise(p, bytes, MADV_DONTNEED);
  ::mprotect(p, bytes, PROT_NONE);
  std::lock_guard lock(mutex_);
  used_ -= bytes;
}

void host_backend::copy(void* dst, const void* src, std::size_t bytes, copy_kind, stream_id) {
  if (bytes) std::memmove(dst, src, bytes);
}

void host_backend::fill(void* p, std::size_t bytes, std::uint8_t value, stream_id) { std::memset(p, value, bytes); }

std::uint64_t host_backend::used() const {
  std::lock_guard lock(mutex_);
  return used_;
}

}  // namespace isorun::alloc
