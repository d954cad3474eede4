#include "isorun/serialization/blob.hpp"

#include <sys/mman.h>

#include <new>

#include "parallel.hpp"

namespace isorun::serialization::detail {

std::byte* allocate_blob(std::size_t size) {
  if (size < parallel_threshold) return new std::byte[size];
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  return static_cast<std::byte*>(p);
}

void free_blob(std::byte* data, std::size_t size) noexcept {
  if (size < parallel_threshold) {
    delete[] data;
  } else {
    unmap(data, size);
  }
}

}  // namespace isorun::serialization::detail
