#pragma once
/// @file stop_request.hpp
/// Stopping a running sweep from outside its threads: what a signal handler may call.

namespace isorun::sweep {

/// @brief Asks a running sweep to stop (as Ctrl-C): no new trials, running ones cancelled; a
///        second call kills them at once. Says so on stderr at once. Async-signal-safe.
void request_stop() noexcept;

}  // namespace isorun::sweep
