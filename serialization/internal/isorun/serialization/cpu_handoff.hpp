#pragma once
/// @file cpu_handoff.hpp
/// A waiting worker woken on the CPU of the thread that assigns it work and then waits for it.
///
/// A worker launched ahead sleeps until its assignment, and the kernel wakes a sleeping thread
/// where it last ran when that CPU is idle, rather than on the waker's CPU, which is busy until
/// the waker blocks. Waking an idle CPU takes an interprocessor interrupt and, under a hypervisor
/// whose idle vCPUs halt, the vCPU's return: several times a wake-up on the same CPU
/// (bench/README.md, "Calls", measures both). The supervisor's thread blocks as soon as it has
/// sent the assignment, so its CPU is the one about to be free: it narrows the worker's affinity
/// to that CPU just before sending, and the worker widens it back, to the mask it had, as the
/// first thing it does with the assignment, before any of its task runs (a task's threads inherit
/// the mask). The worker's `done` then wakes the supervisor's thread on the CPU they share.

#include <sys/types.h>

#include <cstdint>
#include <vector>

#include "isorun/internal_api.hpp"

namespace isorun::serialization {

/// An affinity mask as 64-bit words (CPU i is bit i % 64 of word i / 64), without trailing zero
/// words. Empty: nothing to restore.
using cpu_mask = std::vector<std::uint64_t>;

/// @brief Narrows thread `tid`'s affinity (a sleeping worker's main thread) to the CPU the
///        calling thread runs on, and returns the mask it had, for the worker to restore.
///        Changes nothing and returns an empty mask where it would not help or cannot be done:
///        the thread may run on one CPU only or not on this one, or its mask cannot be read or set.
ISORUN_INTERNAL_API cpu_mask hand_this_cpu_to(pid_t tid) noexcept;

/// @brief Restores the calling thread's affinity to `mask` (hand_this_cpu_to's). Where that fails
///        (the CPUs allowed changed meanwhile, a cpuset), every CPU allowed: never left narrowed.
ISORUN_INTERNAL_API void restore_cpus(const cpu_mask& mask) noexcept;

}  // namespace isorun::serialization
