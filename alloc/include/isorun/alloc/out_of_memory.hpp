#pragma once
/// @file out_of_memory.hpp
/// Thrown when an allocation would take a worker past its memory cap. Thrown by the allocator
/// inside the worker, and rethrown to the caller of an isolated task with the same message.

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "isorun/alloc/export.hpp"

namespace isorun {

/// Figures at the time of an out-of-memory failure; zero where unknown.
struct oom_figures {
  std::uint64_t requested = 0;      ///< bytes asked for
  std::uint64_t limit = 0;          ///< the cap
  std::uint64_t reserved = 0;       ///< bytes held from the backend
  std::uint64_t allocated = 0;      ///< bytes in live allocations
  std::uint64_t largest_free = 0;   ///< largest free cached block
  std::vector<std::uint64_t> live;  ///< the live allocations' sizes, largest first (at most 64)
};

class ISORUN_ALLOC_API out_of_memory : public std::runtime_error {
 public:
  explicit out_of_memory(const std::string& message) : std::runtime_error(message) {}
  out_of_memory(const std::string& message, const oom_figures& f) : std::runtime_error(message), figures_{f} {}
  /// The figures (all zero when rethrown in the caller, where only the message travels).
  [[nodiscard]] const oom_figures& figures() const noexcept { return figures_; }

 private:
  oom_figures figures_;
};

}  // namespace isorun
