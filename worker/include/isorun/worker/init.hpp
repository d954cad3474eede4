#pragma once
/// @file init.hpp
/// The one call that lets a program serve as its own worker.

#include "isorun/export.hpp"

namespace isorun {

/// @brief Call first thing in `main`. In the parent it returns immediately. When isorun has
///        re-executed this program as a worker, it runs the requested task and exits: it never
///        returns there.
ISORUN_API void init(int argc, char** argv);

/// @brief True if this process was started as an isorun worker and init() has not yet run.
ISORUN_API bool is_worker_process() noexcept;

namespace detail {
/// The worker's main: what init() runs in a worker process. Never returns.
[[noreturn]] ISORUN_API void run_worker();
}  // namespace detail

}  // namespace isorun
