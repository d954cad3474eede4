#pragma once
/// @file report_log.hpp
/// Every intermediate report of every trial, durable: OUT/reports.jsonl, one line per report
/// ({"trial": ID, "step": N, "metrics": {...}}) in the order the sweep's scheduler judged them,
/// each fsync'ed before it is judged. Written with the journal's care (by name in the folder,
/// never through a link, a line cut short by a crash truncated away). The learning curves, and
/// what a resumed sweep replays, in order, to rebuild its early-stopping rule's state.

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace isorun::sweep {

struct trial_report {
  std::string trial;  ///< its id
  std::int64_t step = 0;
  nlohmann::json metrics;  ///< the report's object, without "step"
};

class report_log {
 public:
  /// @brief Opens (or creates) OUT/reports.jsonl in `folder` and reads the reports it holds.
  /// @throws usage_error if a link or anything but a regular file is there; internal_error if it
  ///         cannot be opened, read or repaired.
  explicit report_log(const std::filesystem::path& folder);
  ~report_log();
  report_log(const report_log&) = delete;
  report_log& operator=(const report_log&) = delete;

  /// The reports it held when opened, in order (lines that are not reports are skipped).
  [[nodiscard]] const std::vector<trial_report>& earlier() const noexcept { return earlier_; }

  /// @brief Appends `r` and fsyncs: durable when this returns.
  /// @throws internal_error if the write or the fsync fails (what it wrote is cut off again).
  void append(const trial_report& r);

  /// @brief The reports in `folder`'s reports.jsonl, for reading (the HTML report): none if
  ///        there is no such file.
  static std::vector<trial_report> read(const std::filesystem::path& folder);

 private:
  int fd_ = -1;
  std::filesystem::path path_;
  std::vector<trial_report> earlier_;
};

}  // namespace isorun::sweep
