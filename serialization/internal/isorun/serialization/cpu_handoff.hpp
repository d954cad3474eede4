#pragma once
/// @file cpu_handoff.hpp
/// A waiting worker woken on the CPU of the thread that assigns it work and then waits for it.
///
/// A worker launched ahead sleeps until its assignment, and the kernel wakes a sleeping thread
/// where it last ran when that CPU is idle, rather than on the waker's CPU, which is busy until
/// the waker blocks. Waking an idle CPU takes an interprocessor interrupt and, under a hypervisor
/// whose idle vCPUs halt, the vCPU's return: several times a wake-up on the same CPU
/// (bench/README.md, "Calls", measures both). The supervisor's thread blocks as soon as it has
/// sent the assignment, so its CPU is the one about to be free: it narrows the worker's main
/// thread to that CPU just before sending, and the worker widens it back, to the mask it had, as
/// the first thing it does with the assignment, before any of its task runs (a task's threads
/// inherit the mask). The worker's `done` then wakes the supervisor's thread on the CPU they share.
///
/// A worker taken while it is still starting (a standby pool hands out workers launched, not
/// necessarily asleep yet) is narrowed before it waits, and the threads its start makes from then
/// on (a preloaded library's pool, a CUDA context's) inherit the one CPU: the worker reads its
/// mask before it waits, and where that was the narrowed one, widens those threads too.

#include <sys/types.h>

#include <cstdint>
#include <vector>

#include "isorun/internal_api.hpp"

namespace isorun::serialization {

/// An affinity mask as 64-bit words (CPU i is bit i % 64 of word i / 64), without trailing zero
/// words. Empty: nothing to restore.
using cpu_mask = std::vector<std::uint64_t>;

/// @brief Narrows thread `tid`'s affinity (a worker's main thread) to the CPU the calling
///        thread runs on, and returns the mask it had, for the worker to restore. Changes
///        nothing and returns an empty mask where it would not help or cannot be done: no thread
///        named (`tid` ≤ 0), the thread may run on one CPU only or not on this one, or its mask
///        cannot be read or set.
ISORUN_INTERNAL_API cpu_mask hand_this_cpu_to(pid_t tid) noexcept;

/// @brief The calling thread's affinity now: what a worker reads just before it waits for its
///        assignment, for restore_cpus. Empty where it cannot be read.
ISORUN_INTERNAL_API cpu_mask this_thread_cpus() noexcept;

/// @brief Restores the calling thread's affinity to `mask` (hand_this_cpu_to's), and, where the
///        mask read before waiting (`before_wait`) was already a single CPU of it (narrowed before
///        the wait), every other thread of the process left on just that CPU. Where a thread's
///        mask cannot be restored (the CPUs allowed changed meanwhile), it is set to every CPU
///        the cpuset allows. Nothing where `mask` is empty.
ISORUN_INTERNAL_API void restore_cpus(const cpu_mask& mask, const cpu_mask& before_wait) noexcept;

}  // namespace isorun::serialization
