#pragma once
/// @file html_report.hpp
/// A sweep's report: one self-contained HTML file (inline SVG and CSS, a little plain JavaScript
/// to sort and page the table; nothing is fetched), drawn from what the output folder holds:
/// sweep.json (the runs, their slots), the journal and the trials' memory timelines. It stays
/// readable at 10,000 trials: charts sample or aggregate, the table is paged.

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

/// @brief The report page for `data`.
std::string render_report(const report_data& data);

/// @brief Writes OUT/report.html (atomically), from what OUT holds; the warnings of
///        load_report_data go to stderr.
/// @throws usage_error (not a sweep's folder), internal_error (cannot write).
void write_report(const std::filesystem::path& out);

/// @brief What is wrong with `timeline` as the JSON a worker writes to $ISORUN_MEMORY_TIMELINE
///        (a field of the wrong type, say); "" if nothing.
std::string timeline_problem(const nlohmann::json& timeline);

/// @brief The memory timeline a worker wrote to `file` ($ISORUN_MEMORY_TIMELINE), read as a
///        sweep's files are (not through a link, a regular file, bounded) and checked by
///        timeline_problem.
/// @throws std::exception (usage_error, internal_error, std::runtime_error) saying what is wrong.
nlohmann::json read_memory_timeline(const std::filesystem::path& file);

/// @brief A page with one run's memory timeline (`isorun --memory-timeline FILE.html`), from
///        the JSON a worker writes to $ISORUN_MEMORY_TIMELINE, checked by timeline_problem.
std::string render_memory_timeline(const nlohmann::json& timeline, const std::string& title);

}  // namespace isorun::sweep
