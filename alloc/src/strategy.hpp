#pragma once
// How a caching allocator finds blocks and grows and shrinks the memory it holds: one class per
// strategy (config `strategy:`). The allocator (caching_allocator.cpp) holds the lock, keeps the
// books and calls these; the arena (arena.hpp) does the splitting and coalescing.
//
//   auto_growth   segments from the backend as needed (a small pool of 2 MiB segments for
//                 requests up to 1 MiB, a large pool otherwise); whole free segments go back
//                 under pressure, least recently used first
//   preallocate   one segment of the whole cap taken up front, never grown nor returned
//   expandable    one reserved address range per stream; the pages under a block mapped as
//                 it is needed (one backend call per run of missing pages), and pages of free
//                 blocks unmapped under pressure (one wait for the stream, one call per run)

#include <functional>
#include <memory>
#include <stdexcept>

#include "arena.hpp"
#include "isorun/alloc/backend.hpp"
#include "isorun/alloc/config.hpp"
#include "ledger.hpp"

namespace isorun::alloc::detail {

/// What a strategy works on. `settle` completes the frees waiting for other streams' events.
struct strategy_context {
  backend& memory;
  arena& blocks;
  ledger& books;
  const alloc_config& cfg;
  std::function<void()> settle;
};

class growth_strategy {
 public:
  explicit growth_strategy(strategy_context c) : c_{std::move(c)} {}
  virtual ~growth_strategy() = default;
  growth_strategy(const growth_strategy&) = delete;
  growth_strategy& operator=(const growth_strategy&) = delete;

  /// @brief Checks that requests on `stream` can be served at all (not virtual: it is on the
  ///        hot path, and only preallocate limits streams).
  /// @throws std::invalid_argument saying what to use instead.
  void check_stream(stream_id stream) const {
    if (stream != 0 && default_stream_only_)
      throw std::invalid_argument(
          "strategy:preallocate serves the default stream only; use auto_growth or expandable "
          "for work on other streams");
  }

  /// @brief A free block of at least `size` bytes for `stream`: from the cache, else by holding
  ///        more memory within the cap, else after releasing the cache once; nullptr if none.
  virtual block* obtain(std::size_t size, stream_id stream) = 0;

  /// @brief Gives cached memory back to the backend, least recently used first, until `want`
  ///        bytes are back (completing waiting frees first with `settle`). Returns the bytes.
  virtual std::uint64_t release_cached(std::uint64_t want, bool settle = true) = 0;

  /// @brief Called when a freed block has left segment `s` wholly free.
  virtual void on_segment_free(std::list<segment>::iterator) {}

  /// @brief Gives every segment's memory back to the backend (counting the frees); the caller
  ///        clears the arena and the books.
  virtual void release_everything() = 0;

 protected:
  strategy_context c_;
  bool default_stream_only_ = false;
};

/// @brief The strategy `cfg.kind` names, with any memory it takes up front.
/// @throws config_error if a preallocation cannot be had.
std::unique_ptr<growth_strategy> make_strategy(strategy_context c);

}  // namespace isorun::alloc::detail
