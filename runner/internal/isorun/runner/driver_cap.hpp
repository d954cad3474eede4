#pragma once
/// @file driver_cap.hpp
/// The supervisor's side of the cap on the CUDA driver API (preload/cap_region.hpp has the
/// other side): the sealed terms and the shared ledger of one capped run, a `-- CMD` command or
/// a Python call, and what to tell its processes so that the preloaded library
/// (libisorun_cuda_cap.so) finds them. Both files are memfds reachable from those processes as
/// /proc/<this pid>/fd/<fd> while this process lives, and no longer once it is gone.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "isorun/internal_api.hpp"
#include "isorun/serialization/shm_segment.hpp"

namespace isorun::preload {
struct cap_ledger;
}

namespace isorun::runner {

/// @brief A file installed next to libisorun.so (the cap library, the command shim, isorun-cli),
///        also from a program that has the library linked in.
/// @param without_it what cannot work without the file, for the message.
/// @throws internal_error if it is missing (a broken installation).
std::string beside_library(const char* name, const char* without_it);

/// One run's cap on the driver API: `limit` bytes on each device, for all its processes together.
class ISORUN_INTERNAL_API driver_cap {
 public:
  /// @brief Creates and seals the terms, and an empty ledger.
  /// @param events how many of the last changes the ledger keeps for memory_timeline() (0: none).
  /// @throws internal_error if the files cannot be created or sealed (out of memory).
  explicit driver_cap(std::uint64_t limit, std::uint64_t events = 0);
  ~driver_cap();
  driver_cap(const driver_cap&) = delete;
  driver_cap& operator=(const driver_cap&) = delete;

  /// The variables naming the ledger and the terms ("NAME=/proc/PID/fd/N"), for the processes
  /// under the cap; the library reads them when it loads, or at its first allocation if they
  /// came later (a standby interpreter gets them with its call).
  [[nodiscard]] std::vector<std::string> variables() const;

  /// The cap library's path. @throws internal_error if it is missing.
  static std::string library();

  [[nodiscard]] std::uint64_t limit() const noexcept { return limit_; }
  /// Whether the cap refused anything: an allocation, or a process a slot.
  [[nodiscard]] bool refused() const noexcept;
  [[nodiscard]] std::uint64_t refusals() const noexcept;
  [[nodiscard]] std::uint64_t largest_refused() const noexcept;
  /// The highest any one device reached.
  [[nodiscard]] std::uint64_t peak() const noexcept;

  /// @brief What the cap refused, in one line ("" if nothing).
  /// @param what the run, as the line names it ("the command").
  /// @param option how the user set the cap ("--mem-limit").
  /// @param gpus how many devices the run had (the cap is per device, and so is the peak then).
  [[nodiscard]] std::string report(const std::string& what, const std::string& option, std::size_t gpus) const;

  /// @brief What the run's processes held on each device over time, from the changes the ledger
  ///        kept, as JSON in the form a task's memory timeline has (html::render_memory_timeline
  ///        draws it): per device its cap, what was held at the end and the events ("map",
  ///        "unmap", "oom", each with its process), and at the last refusal, what each process
  ///        held on that device then, largest first. Memory a process still held when it ended went back with
  ///        it: that is an "unmap" at `end_ns`. Read once the run's processes are gone.
  /// @param gpu_indices the physical index of each of the run's devices, in CUDA order.
  [[nodiscard]] std::string memory_timeline(std::int64_t start_ns, std::int64_t end_ns,
                                            const std::vector<int>& gpu_indices) const;

 private:
  serialization::shm_file terms_;
  serialization::shm_file ledger_file_;
  preload::cap_ledger* ledger_ = nullptr;
  std::uint64_t limit_ = 0;
  std::uint64_t events_ = 0;
  std::size_t ledger_bytes_ = 0;
};

}  // namespace isorun::runner
