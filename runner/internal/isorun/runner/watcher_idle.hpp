#pragma once
/// @file watcher_idle.hpp
/// For tests that count descriptors or children: the process's call watcher (which watches every
/// call no thread waits for at once, and reaps workers after early results) let go of them all.

#include "isorun/internal_api.hpp"

namespace isorun::runner {

/// @brief Waits until the process's watcher holds no call: each one it watched has ended and
///        its worker was reaped (also each worker it saw exit after an early hand-over), and what
///        was posted to it has run.
ISORUN_INTERNAL_API void wait_for_watcher_idle();

}  // namespace isorun::runner
