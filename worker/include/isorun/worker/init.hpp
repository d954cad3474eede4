#pragma once
/// @file init.hpp
/// The one call that lets a program serve as its own worker.

namespace isorun {

/// @brief Call first thing in `main`. In the parent it returns immediately. When isorun has
///        re-executed this program as a worker, it runs the requested task and exits: it never
///        returns there.
void init(int argc, char** argv);

/// @brief True if this process was started as an isorun worker and init() has not yet run.
bool is_worker_process() noexcept;

namespace detail {
/// The worker's main: what init() runs in a worker process. Never returns.
[[noreturn]] void run_worker();
}  // namespace detail

}  // namespace isorun
