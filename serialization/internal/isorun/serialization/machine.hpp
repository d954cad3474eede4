#pragma once
/// @file machine.hpp
/// The machine as this process may use it: the cores it may run on (what parallel passes over a
/// payload and the packing of CPU slots are sized by) and the memory it has.

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <thread>

namespace isorun::serialization {

/// @brief The cores this process may run on: its CPU affinity, which a cpuset (a Slurm job, a
///        container), `taskset` or `numactl` can make fewer than the machine has. The machine's
///        count where the mask cannot be read (more than 1024 CPUs).
[[nodiscard]] inline unsigned usable_cores() noexcept {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0) return static_cast<unsigned>(std::max(1, CPU_COUNT(&set)));
  return std::max(1u, std::thread::hardware_concurrency());
}

/// @brief The machine's physical memory in bytes: no result larger than it could be held.
[[nodiscard]] inline std::uint64_t physical_memory() noexcept {
  return static_cast<std::uint64_t>(::sysconf(_SC_PHYS_PAGES)) * static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
}

}  // namespace isorun::serialization
