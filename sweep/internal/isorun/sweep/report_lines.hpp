#pragma once
/// @file report_lines.hpp
/// A trial's intermediate reports as they appear in its stdout: lines that are JSON objects with
/// a whole-number "step" (`this_worker().report`, `isorun.report`, or a command printing them);
/// and a command's checkpoints, lines `{"checkpoint": STEP}`.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

namespace isorun::sweep {

/// @brief A line as a report: its step and the rest of the object (the metrics); nullopt for any
///        line that is not a JSON object with a whole-number "step" of 0 or more.
std::optional<std::pair<std::int64_t, nlohmann::json>> report_line(std::string_view line);

/// @brief A line as a checkpoint's announcement: its step; nullopt for any line that is not a
///        JSON object whose "checkpoint" is a whole number of 0 or more.
std::optional<std::int64_t> checkpoint_line(std::string_view line);

/// Splits output into lines as it comes, in pieces of any size, handing each report line on.
struct report_lines {
  static constexpr std::size_t max_line = 1 << 20;  ///< a longer line is never taken for a report
  std::function<void(std::int64_t, nlohmann::json)> on_report;
  std::string line;
  bool too_long = false;
  std::function<void(std::int64_t)> on_checkpoint;  ///< optional: checkpoint lines
  void feed(const char* p, std::size_t n);
};

}  // namespace isorun::sweep
