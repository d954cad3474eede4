#pragma once
// The sweep's trackers (spec.track): each a process started beside the sweep that reads the
// sweep's events as JSON lines on its stdin (docs/sweeps.md, "Trackers"), fed by a thread of
// its own. The journal is the buffer: each thread reads OUT/reports.jsonl and OUT/results.jsonl
// from where it got to, woken by inotify, so a tracker that is slow, hangs or fails costs the
// sweep nothing. One that fails is started again and given everything from the start (it keeps
// what it needs to skip what it has seen in its folder, OUT/track/NAME/).

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "isorun/sweep/spec.hpp"

namespace isorun::sweep {

class track_sinks {
 public:
  /// @brief Starts each tracker of `trackers` for the sweep in `out`; `sweep` is its first event
  ///        (what the sweep is: its subject, metric, scheduler, runs, the spec's parameters).
  track_sinks(const std::vector<track_spec>& trackers, const std::filesystem::path& out, nlohmann::json sweep);
  track_sinks(const track_sinks&) = delete;
  track_sinks& operator=(const track_sinks&) = delete;
  /// finish() with no summary, if it was not called.
  ~track_sinks();

  /// @brief The sweep's end: each tracker is given what it has not had yet and `summary` (as
  ///        the event "sweep_end"), then its stdin is closed and it is waited for: while it reads,
  ///        then a bounded time to exit (exit_grace), then killed.
  void finish(const nlohmann::json& summary);

 private:
  struct sink;
  std::vector<std::unique_ptr<sink>> sinks_;
};

}  // namespace isorun::sweep
