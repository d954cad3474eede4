#pragma once
/// @file report_lines.hpp
/// A trial's intermediate reports as they appear in its stdout: lines that are JSON objects with
/// a whole-number "step" (`this_worker().report`, `isorun.report`, or a command printing them).

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

/// Splits output into lines as it comes, in pieces of any size, handing each report line on.
struct report_lines {
  static constexpr std::size_t max_line = 1 << 20;  ///< a longer line is never taken for a report
  std::function<void(std::int64_t, nlohmann::json)> on_report;
  std::string line;
  bool too_long = false;
  void feed(const char* p, std::size_t n);
};

}  // namespace isorun::sweep
