#pragma once
// Chunk-parallel work over a payload: the checksum of a large result is computed by several
// threads on each side, one chunk per task, so a 1 GiB result is not hashed by one core; and
// large mappings are given back on several threads, so a 1 GiB result's memory is not freed by
// one core either.

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

#include "isorun/serialization/machine.hpp"

namespace isorun::serialization::detail {

/// Below this many bytes a payload is hashed by the calling thread alone: starting threads
/// costs more than it saves.
inline constexpr std::uint64_t parallel_threshold = 32ULL << 20;

/// @brief Calls `fn(i)` for i in [0, n), on up to `threads` threads (the caller's included),
///        each taking the next i as it comes free. Falls back to the calling thread alone if a
///        thread cannot be started.
template <class Fn>
void for_each_chunk(std::size_t n, unsigned threads, Fn&& fn) {
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t i; (i = next++) < n;) fn(i);
  };
  std::vector<std::thread> helpers;
  const unsigned want = std::max(1u, std::min<unsigned>(threads, static_cast<unsigned>(std::min<std::size_t>(n, 64))));
  try {
    for (unsigned t = 1; t < want; ++t) helpers.emplace_back(work);
  } catch (...) {  // no more threads: the ones there are (at least this one) do it all
  }
  work();
  for (auto& h : helpers) h.join();
}

/// Threads for a pass over `bytes` (hashing them, or giving back their pages): one below
/// parallel_threshold, else one per core this process may use (at most 16: memory bandwidth, or
/// the kernel's page allocator, is saturated long before).
inline unsigned threads_for(std::uint64_t bytes) {
  if (bytes < parallel_threshold) return 1;
  return std::min(usable_cores(), 16u);
}

/// @brief madvise(addr, bytes, advice) in 16 MiB pieces on threads_for(bytes) threads; returns
///        false, having done nothing, where that is one thread. `addr` is page-aligned. For
///        advice that holds the address-space lock only shared (MADV_DONTNEED,
///        MADV_POPULATE_WRITE), so that the pieces' page faults or frees run at once.
inline bool advise_in_parallel(void* addr, std::uint64_t bytes, int advice) noexcept {
  const unsigned threads = threads_for(bytes);
  if (threads < 2) return false;
  constexpr std::uint64_t piece = 16ULL << 20;
  auto* base = static_cast<std::byte*>(addr);
  for_each_chunk((bytes + piece - 1) / piece, threads,
                 [&](std::size_t i) { ::madvise(base + i * piece, std::min(piece, bytes - i * piece), advice); });
  return true;
}

/// @brief munmap(addr, bytes), with the pages of a large range given back first on several
///        threads.
///
/// munmap, like a process's exit, tears a range down on one core, one 4 KiB page (or, for a
/// shared segment, one page-table entry) at a time: for gigabytes that is a visible part of a
/// call. MADV_DONTNEED drops pieces of one range in parallel, so the time divides by the
/// threads (bench/README.md has the figures). Private
/// anonymous pages are freed by it; a shared mapping only loses its page-table entries, its data
/// stays in the file. `addr` is page-aligned (it came from mmap).
inline void unmap(void* addr, std::uint64_t bytes) noexcept {
  if (!addr) return;
  advise_in_parallel(addr, bytes, MADV_DONTNEED);
  ::munmap(addr, bytes);
}

}  // namespace isorun::serialization::detail
