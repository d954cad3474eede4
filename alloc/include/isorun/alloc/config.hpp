#pragma once
/// @file config.hpp
/// Allocator configuration: a struct, and its string form
/// `ISORUN_ALLOC_CONF="strategy:expandable,max_split_size_mb:128,garbage_collection_threshold:0.8"`.

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include "isorun/alloc/export.hpp"

namespace isorun::alloc {

/// An invalid configuration entry; the message names the entry and what is accepted.
class ISORUN_ALLOC_API config_error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

enum class strategy {
  auto_growth,  ///< segments on demand (default)
  preallocate,  ///< reserve the cap (or a fraction of free memory) up front, then sub-allocate
  expandable,   ///< reserve address space for the cap; map 2 MiB pages on demand
};

struct alloc_config {
  strategy kind = strategy::auto_growth;
  /// Reproduce PyTorch's default policy constants (20 MiB segments for requests of 1-10 MiB).
  bool pytorch_compat = false;
  /// Blocks at least this large are never split (0 = no limit). PyTorch's max_split_size_mb.
  std::uint64_t max_split_size = 0;
  /// Above this fraction of the cap, cached free segments are released before growing (0 = off).
  double garbage_collection_threshold = 0;
  /// preallocate: fraction of the device's free memory to take (0 = the whole cap).
  double fraction = 0;
  /// auto_growth: size of the first segment (0 = as needed). Paddle's initial_gpu_memory_in_mb.
  std::uint64_t initial_chunk = 0;
  /// auto_growth: smallest segment when growing (0 = as needed). Paddle's reallocate_gpu_memory_in_mb.
  std::uint64_t regrowth_chunk = 0;
  /// Bytes of the cap kept free for libraries that allocate on their own (cuDNN workspaces).
  std::uint64_t reserve = 0;
  /// Every allocation goes straight to the backend (for compute-sanitizer). Still capped.
  bool no_caching = false;
  /// Fill new allocations with this byte (-1 = off). Paddle's FLAGS_init_allocated_mem.
  int debug_fill = -1;
  /// Keep a ring buffer of this many allocation events (0 = off).
  std::size_t history = 0;

  /// @brief Parses the string form (comma-separated `key:value`). Keys: strategy
  ///        (auto_growth|preallocate|expandable), pytorch_compat, expandable_segments,
  ///        max_split_size_mb, garbage_collection_threshold, fraction, initial_chunk_mb,
  ///        regrowth_chunk_mb, reserve_mb, no_caching, debug_fill, history.
  /// @throws config_error naming the bad entry.
  static alloc_config parse(std::string_view text);

  /// @brief The string form (round-trips through parse).
  [[nodiscard]] std::string to_string() const;
};

/// @brief Checks that a cap of `cap` bytes can serve `config`: after `reserve`, at least one 2 MiB
///        segment must fit. The supervisor calls it before starting a worker, so an impossible
///        --mem-limit is a usage error; the allocator checks it again.
/// @throws config_error saying what to raise.
void check_cap(std::uint64_t cap, const alloc_config& config);

/// @brief "auto_growth", "preallocate", "expandable".
const char* to_string(strategy s) noexcept;

}  // namespace isorun::alloc
