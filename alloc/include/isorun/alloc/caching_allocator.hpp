#pragma once
/// @file caching_allocator.hpp
/// The capped caching device allocator every worker gets.
///
/// Memory comes from a backend in segments (or, with the expandable strategy, in 2 MiB pages of
/// one reserved address range); freed blocks are cached and reused best-fit, split and
/// coalesced within their segment. The cap is exact and atomic: bytes held from the backend,
/// rounding included, never exceed it, whatever the number of threads. Under pressure cached
/// memory is released and the request retried before `out_of_memory` is thrown with a report.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "isorun/alloc/backend.hpp"
#include "isorun/alloc/config.hpp"
#include "isorun/alloc/out_of_memory.hpp"
#include "isorun/alloc/stats.hpp"

namespace isorun::alloc {

class caching_allocator {
 public:
  /// Allocation granularity: every request is rounded up to a multiple of this.
  static constexpr std::size_t rounding = 512;

  /// @param memory  the backend (owned)
  /// @param cap     hard cap on bytes held from the backend (before `config.reserve` is taken off)
  /// @param config  policy
  /// @param cap_origin how the cap was derived, quoted in OOM reports (e.g. "--mem-limit 2 GiB
  ///        minus 300 MiB CUDA context")
  /// @throws config_error if the cap cannot hold a single 2 MiB segment, or for a preallocate
  ///         strategy that the backend cannot satisfy.
  caching_allocator(std::unique_ptr<backend> memory, std::uint64_t cap, alloc_config config = {},
                    std::string cap_origin = {});
  /// Returns all memory to the backend (see release_all()).
  ~caching_allocator();

  /// @brief Returns every segment to the backend now. Allocations still live are counted as
  ///        leaks (leaked_bytes, leaked_allocations) in the statistics returned; afterwards the
  ///        allocator holds nothing and must not be used.
  allocator_stats release_all();
  caching_allocator(const caching_allocator&) = delete;
  caching_allocator& operator=(const caching_allocator&) = delete;

  /// @brief Allocates `bytes` for use on `stream`.
  /// @throws std::invalid_argument for 0 bytes, an absurd size (over 1 PiB), or a stream the
  ///         strategy cannot serve; out_of_memory when the cap (or the device) cannot fit it.
  void* allocate(std::size_t bytes, stream_id stream = 0);

  /// @brief Frees an allocation. It is reused at once on its own stream, or after the events of
  ///        streams recorded with record_stream() have completed.
  /// @throws std::invalid_argument for a pointer this allocator did not return, or a double free.
  void deallocate(void* p);

  /// @brief Marks `p` as used on `stream` too, so it is not reused before that work completes.
  /// @throws std::invalid_argument for an unknown pointer.
  void record_stream(void* p, stream_id stream);

  /// @brief Returns every cached, unused segment (and unused expandable page) to the backend.
  void empty_cache();
  /// @brief Resets the peaks of all statistics to their current values.
  void reset_peak();

  [[nodiscard]] allocator_stats stats() const;
  /// @brief Memory as the task should see it: total = the cap, free = cap - allocated.
  [[nodiscard]] memory_info mem_info() const;
  /// @brief Size (rounded) of a live allocation. @throws std::invalid_argument if unknown.
  [[nodiscard]] std::size_t allocation_size(void* p) const;
  [[nodiscard]] std::uint64_t cap() const noexcept;
  [[nodiscard]] const alloc_config& config() const noexcept;
  [[nodiscard]] backend& memory() noexcept;
  /// @brief Largest live allocations, largest first: (address, bytes).
  [[nodiscard]] std::vector<std::pair<std::uintptr_t, std::size_t>> largest_allocations(std::size_t n) const;
  /// @brief The event ring buffer (config.history) as a JSON array of
  ///        {"t_ns","action","addr","size","stream"}: input for memory-timeline plots.
  [[nodiscard]] std::string history_json() const;

  /// @brief Checks every internal invariant (blocks tile their segments, no overlap, free
  ///        neighbours coalesced, free sets and maps consistent, counters equal a recomputation,
  ///        reserved within the cap). For tests and debugging.
  /// @throws std::logic_error describing the first violation.
  void check_invariants() const;

  struct impl;

 private:
  std::unique_ptr<impl> impl_;
};

}  // namespace isorun::alloc
