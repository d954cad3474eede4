#pragma once
/// @file stop_source.hpp
/// A sweep's one stop source: request_stop() (Ctrl-C) and nothing else asks a sweep to stop from
/// outside. Signals are process-wide, so its state is too: one stop_source lives at a time.

#include <atomic>
#include <functional>
#include <thread>

#include "isorun/runner/unique_fd.hpp"

namespace isorun::sweep {

class stop_source {
 public:
  /// @brief Becomes what request_stop() reaches, with no request yet.
  /// @throws internal_error if its wake-up pipe cannot be made.
  stop_source();
  /// Stops the watcher (close()) and detaches from request_stop().
  ~stop_source();
  stop_source(const stop_source&) = delete;
  stop_source& operator=(const stop_source&) = delete;

  /// @brief The stop requests so far (0: none). Read without a lock, so that a decision to
  ///        start something sees a request made before it.
  [[nodiscard]] int requests() const noexcept;

  /// @brief Calls `on_request(requests())` on a thread of its own after each request, until
  ///        close(). Call once.
  void watch(std::function<void(int)> on_request);

  /// @brief Ends the watcher's thread (no call to `on_request` after this returns).
  void close() noexcept;

 private:
  unique_fd read_, write_;
  std::thread watcher_;
  std::atomic<bool> closing_{false};
};

}  // namespace isorun::sweep
