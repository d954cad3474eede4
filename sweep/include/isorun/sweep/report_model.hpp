#pragma once
/// @file report_model.hpp
/// What a sweep's report shows, read from its output folder: the runs, the trials' records, the
/// parameters as axes, the slots' intervals, the curves and the memory timelines. The page
/// (html_report.hpp) draws it.

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "isorun/sweep/journal.hpp"

namespace isorun::sweep {

/// One run of the sweep (it runs again on each resume), from sweep.json.
struct run_info {
  int run = 0;
  std::vector<std::pair<int, std::string>> slots;  ///< slot index, its device ("cpu" or UUIDs)
  std::uint64_t mem_limit = 0;
  double wall_s = 0;  ///< 0 while it runs, or if it was killed
};

/// How a parameter is drawn on an axis.
struct param_axis {
  std::string name;
  bool numeric = false;                 ///< every value is a number
  bool integer = false;                 ///< numeric, and every value is a whole number
  bool log = false;                     ///< numeric, all positive, a decade or more, spaced as by a factor
  double lo = 0, hi = 0;                ///< the numeric range
  std::vector<std::string> categories;  ///< otherwise: the values as words, in first-seen order
};

/// One bar of the slot occupancy chart: a trial on a slot, in a run.
struct slot_interval {
  int run = 0;
  int slot = 0;
  double start_s = 0, end_s = 0;  ///< seconds after the run started
  std::string id;
  outcome_kind kind = outcome_kind::success;
};

/// What a report is drawn from.
struct report_data {
  std::string out;      ///< the output folder
  std::string subject;  ///< the task, or the command
  std::string metric;   ///< "" = none (wall time is shown instead)
  bool maximize = true;
  /// A search with several objectives (sweep.json's objectives): each {name, maximize}; the
  /// report then shows their Pareto front.
  std::vector<std::pair<std::string, bool>> objectives;
  std::vector<trial_record> records;  ///< each trial's latest record, in journal order
  std::vector<run_info> runs;
  std::map<std::string, std::size_t> outcomes;  ///< trials per outcome class
  std::vector<param_axis> params;
  /// The memory timelines shown, in order (out-of-memory trials first, then the best): each
  /// trial's index in `records` and its timeline, read from OUT/logs (the file of its record's
  /// id and attempt) and checked.
  std::vector<std::pair<std::size_t, nlohmann::json>> timelines;
  std::size_t timelines_kept = 0;     ///< trials whose timeline file is there (more than are shown)
  std::vector<std::string> warnings;  ///< what was left out, and why (a damaged timeline, say)
  /// Early stopping (sweep.json's scheduler): its rule ("" none), max_t (0: not given), and
  /// the steps of ASHA's rungs, marked on the learning curves.
  std::string scheduler;
  std::int64_t max_t = 0;
  std::vector<std::int64_t> rungs;
  /// The learning curves (OUT/reports.jsonl): the metric by step, per trial id, each curve
  /// thinned to at most a few hundred points.
  std::map<std::string, std::vector<std::pair<std::int64_t, double>>> curves;
};

/// @brief The axis for parameter `name` taking `values`: numeric or categorical. A numeric one
///        is logarithmic when every value is positive, they span a decade or more, and their
///        distinct values are spaced more evenly by ratio than by difference (0.01, 0.055, 0.3),
///        or there are only two of them (1e-4, 1e-3).
param_axis axis_for(const std::string& name, const std::vector<nlohmann::json>& values);

/// @brief The tick labels drawn under a numeric parameter's axis `width_px` wide: round values
///        (whole numbers only, for an integer parameter), as few as it takes for no two labels to
///        overlap.
std::vector<std::string> axis_tick_labels(const param_axis& axis, double width_px);

/// @brief Every journaled trial that has a run and a start, as a bar on its slot, by run then
///        slot then start. Only runs and slots sweep.json lists are drawn: a record naming any
///        other is left out.
std::vector<slot_interval> slot_intervals(const report_data& data);

/// @brief Reads OUT/sweep.json, OUT/results.jsonl and the memory timelines shown, as a damaged
///        or crafted folder may hold them: files only inside OUT (a timeline is found by its
///        trial's id and attempt, never by a path a record names), never through a link, nothing but
///        regular files, journal lines up to journal::max_line. A timeline that cannot be read
///        or is not one is left out with a warning.
/// @throws usage_error if OUT is not a sweep's output folder, or one of its files is a link or
///         not a regular file.
report_data load_report_data(const std::filesystem::path& out);

}  // namespace isorun::sweep
