#pragma once
/// @file stats.hpp
/// Allocator statistics, named after PyTorch's memory_stats where the meaning is the same.

#include <cstdint>
#include <string>

namespace isorun::alloc {

/// A quantity tracked over time.
struct stat {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::int64_t allocated = 0;  ///< total ever added
  std::int64_t freed = 0;      ///< total ever removed

  void add(std::int64_t n) {
    current += n;
    allocated += n;
    if (current > peak) peak = current;
  }
  void sub(std::int64_t n) {
    current -= n;
    freed += n;
  }
  void reset_peak() { peak = current; }
};

struct allocator_stats {
  stat allocated_bytes;       ///< bytes in live allocations (rounded sizes)
  stat requested_bytes;       ///< bytes asked for by live allocations
  stat reserved_bytes;        ///< bytes held from the backend
  stat active_bytes;          ///< allocated, or freed but awaiting stream events
  stat inactive_split_bytes;  ///< free bytes inside segments that also hold live blocks
  stat allocation;            ///< counts
  stat segment;
  stat active;
  stat inactive_split;
  std::uint64_t num_ooms = 0;
  std::uint64_t num_alloc_retries = 0;   ///< cache flushes to satisfy a request
  std::uint64_t num_backend_allocs = 0;  ///< segments or page ranges taken from the backend
  std::uint64_t num_backend_frees = 0;
  std::uint64_t num_device_alloc_failures = 0;  ///< backend said no below the cap (device full)
  std::uint64_t leaked_bytes = 0;               ///< live at teardown
  std::uint64_t leaked_allocations = 0;

  /// @brief 1 - peak allocated / peak reserved (0 when nothing was reserved).
  [[nodiscard]] double fragmentation() const {
    return reserved_bytes.peak ? 1.0 - double(allocated_bytes.peak) / double(reserved_bytes.peak) : 0.0;
  }
  /// @brief JSON object with every field.
  [[nodiscard]] std::string to_json() const;
};

}  // namespace isorun::alloc
