#pragma once
/// @file report_log.hpp
/// Every intermediate report of every trial, durable: OUT/reports.jsonl, one line per report
/// ({"trial": ID, "step": N, "metrics": {...}}) in the order the sweep's scheduler judged them,
/// each written before it is judged and fsync'ed before the record of any trial that ended after
/// it is journaled (sync(), by the journal's writer: one fsync for many reports, none on the way
/// from a report to its verdict). Written with the journal's care (by name in the folder, never
/// through a link, a line cut short by a crash truncated away). The learning curves, and what a
/// resumed sweep replays, in order, to rebuild its early-stopping rule's state.

#include <cstdint>
#include <filesystem>
#include <mutex>
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

  /// @brief Appends `r`: in the file (and so kept if this process dies) when this returns,
  ///        durable at the next sync().
  /// @throws internal_error if the write fails (what it wrote is cut off again), or a sync failed.
  void append(const trial_report& r);

  /// @brief Appends that an attempt of trial `trial` starts, with its parameters, to
  ///        OUT/events.jsonl: a line {"trial", "event": "start", "attempt", "params"}, for the
  ///        trackers (track/sinks.hpp). In the file when this returns; never synced (a lost line
  ///        costs a tracker one event, nothing of the sweep's).
  /// @throws internal_error if the write fails (what it wrote is cut off again).
  void append_start(const std::string& trial, int attempt, const nlohmann::json& params);
  /// @brief Appends that checkpoint `step` of trial `trial` is committed (in
  ///        OUT/checkpoints/ID/), to OUT/events.jsonl: {"trial", "event": "checkpoint",
  ///        "attempt", "step"}. As append_start.
  void append_checkpoint(const std::string& trial, int attempt, std::int64_t step);

  /// @brief Makes every report appended so far durable (one fdatasync, none if there is nothing
  ///        new). May be called from another thread than append()'s.
  /// @throws internal_error if the fdatasync fails; every later append() and sync() then throws
  ///         too (after a failed fsync the kernel may have dropped the pages: nothing is known).
  void sync();

  /// @brief The reports in `folder`'s reports.jsonl, for reading (the HTML report): none if
  ///        there is no such file.
  static std::vector<trial_report> read(const std::filesystem::path& folder);

 private:
  [[noreturn]] void fail(int error, const std::filesystem::path& file) const;
  void append_line(int fd, const std::filesystem::path& file, const std::string& line);

  int fd_ = -1, events_fd_ = -1;
  std::filesystem::path path_, events_path_;
  std::vector<trial_report> earlier_;
  std::mutex mutex_;            // guards the counts below (append and sync run on different threads)
  std::uint64_t appended_ = 0;  // reports appended by this process
  std::uint64_t synced_ = 0;    // of those, made durable
  int failed_ = 0;              // the errno of a failed sync: the file can no longer be trusted
};

}  // namespace isorun::sweep
