#pragma once
// Chunk-parallel work over a payload: the checksum of a large result is computed by several
// threads on each side, one chunk per task, so a 1 GiB result is not hashed by one core.

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

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

/// Threads to hash a payload of `bytes` with: one below parallel_threshold, else up to the
/// cores (at most 16: memory bandwidth is saturated long before).
inline unsigned hash_threads(std::uint64_t bytes) {
  if (bytes < parallel_threshold) return 1;
  return std::clamp(std::thread::hardware_concurrency(), 1u, 16u);
}

}  // namespace isorun::serialization::detail
