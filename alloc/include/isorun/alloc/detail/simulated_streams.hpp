#pragma once
/// @file simulated_streams.hpp
/// Streams and events for backends without a device (host and simulated): work on a stream
/// "completes" only when a test says so (synchronize), so cross-stream reuse is tested exactly.

#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

#include "isorun/alloc/backend.hpp"

namespace isorun::alloc::detail {

class simulated_streams {
 public:
  /// @brief An event completed once `synchronize(stream)` is called after it.
  event_id record(stream_id stream) {
    std::lock_guard lock(mutex_);
    const std::uint64_t seq = ++recorded_[stream];
    const event_id id = next_event_++;
    events_[id] = {stream, seq};
    return id;
  }

  /// @brief True once `event` completed; a completed event is forgotten.
  bool done(event_id event) {
    std::lock_guard lock(mutex_);
    auto it = events_.find(event);
    if (it == events_.end()) return true;
    if (completed_[it->second.first] < it->second.second) return false;
    events_.erase(it);
    return true;
  }

  /// @brief Completes all work recorded on `stream` so far.
  void synchronize(stream_id stream) {
    std::lock_guard lock(mutex_);
    completed_[stream] = recorded_[stream];
  }

  /// @brief Events recorded and not yet observed as done.
  [[nodiscard]] std::size_t pending() const {
    std::lock_guard lock(mutex_);
    return events_.size();
  }

 private:
  mutable std::mutex mutex_;
  std::map<stream_id, std::uint64_t> recorded_, completed_;  // per-stream sequence numbers
  std::map<event_id, std::pair<stream_id, std::uint64_t>> events_;
  event_id next_event_ = 1;
};

}  // namespace isorun::alloc::detail
