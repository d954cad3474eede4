// Memory for large payloads: a blob's own pages, and fresh memory faulted in ahead of a copy.
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <new>

#include "isorun/serialization/blob.hpp"
#include "isorun/serialization/blob_placement.hpp"
#include "isorun/serialization/codec.hpp"
#include "parallel.hpp"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older kernels refuse it, and the copy faults as before
#endif

namespace isorun::serialization {
namespace {
std::atomic<blob_placement*> installed_placement{nullptr};
}  // namespace

void set_blob_placement(blob_placement* placement) noexcept { installed_placement.store(placement); }

}  // namespace isorun::serialization

namespace isorun::serialization::detail {

std::byte* allocate_blob(std::size_t size) {
  if (size < parallel_threshold) return new std::byte[size];
  if (blob_placement* placement = installed_placement.load())
    if (std::byte* placed = placement->place(size)) return placed;
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  return static_cast<std::byte*>(p);
}

std::byte* allocate_zeroed_blob(std::size_t size) {
  if (size < parallel_threshold) return new std::byte[size]();
  std::byte* p = allocate_blob(size);
  // Placed storage holds what the segment held before; pages of its own are zero already.
  return blob_in_place(p) ? static_cast<std::byte*>(std::memset(p, 0, size)) : p;
}

bool blob_in_place(const std::byte* data) noexcept {
  blob_placement* placement = installed_placement.load();
  return placement && placement->holds(data);
}

void free_blob(std::byte* data, std::size_t size) noexcept {
  if (size < parallel_threshold) {
    delete[] data;
  } else if (blob_placement* placement = installed_placement.load(); !placement || !placement->take_back(data)) {
    unmap(data, size);
  }
}

void prefault(void* data, std::size_t bytes) noexcept {
  // MADV_POPULATE_WRITE wants whole pages: the range is narrowed to those inside it (the edges
  // fault during the copy, as everything did before).
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const std::uintptr_t first = (reinterpret_cast<std::uintptr_t>(data) + page - 1) & ~(page - 1);
  const std::uintptr_t last = (reinterpret_cast<std::uintptr_t>(data) + bytes) & ~(page - 1);
  if (last > first) advise_in_parallel(reinterpret_cast<void*>(first), last - first, MADV_POPULATE_WRITE);
}

}  // namespace isorun::serialization::detail
