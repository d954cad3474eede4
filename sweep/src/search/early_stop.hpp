#pragma once
// Early stopping in a sweep: every report a trial makes is made durable (report_log), then
// judged by the spec's rule (ASHA, median) on the spec's metric. A resumed sweep replays the
// reports its folder holds, in their order, so its rule starts where the last run's left off.
// Where trials keep checkpoints, a step a resumed trial reports again is not counted twice.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "isorun/sweep/report_log.hpp"
#include "isorun/sweep/spec.hpp"
#include "isorun/sweep/stop_rule.hpp"

namespace isorun::sweep {

class early_stopper {
 public:
  /// @param log the folder's reports: those it holds already are replayed into the rule
  /// @param replayed the trials whose earlier reports are replayed, and the step each reached:
  ///        the sweep's own trials that are done (journaled, not run again). Other lines (a
  ///        trial this sweep does not have, a step past the one its record says it reached, a
  ///        trial that runs again and will report afresh) are left out, so that no line of the
  ///        file can decide a verdict by itself.
  /// @param rule what judges the reports where not the spec's scheduler: population-based
  ///        training's (pbt.hpp)
  early_stopper(const sweep_spec& s, report_log& log, const std::map<std::string, std::int64_t>& replayed,
                std::unique_ptr<stop_rule> rule = nullptr);

  /// @brief Records trial `id`'s report durably, then judges it (with no scheduler: records).
  ///        Not thread-safe: the scheduler calls it one report at a time.
  /// @return true: stop the trial.
  /// @throws spec_error if the report lacks the metric the rule judges by, naming the trial;
  ///         internal_error if the report cannot be made durable.
  bool judge(const std::string& id, std::int64_t step, const nlohmann::json& metrics);

  /// The value the rule judges `metrics` by (lower is better), if it has the metric.
  [[nodiscard]] std::optional<double> value(const nlohmann::json& metrics) const;

 private:
  // With checkpoints, whether trial `id`'s report of `step` is the first of that step: a trial
  // that resumes from a checkpoint reports again the steps after it it had reached, and each
  // step counts once. (Without checkpoints every report counts: a retry starts afresh.)
  bool first_time(const std::string& id, std::int64_t step);

  const sweep_spec& s_;
  report_log& log_;
  std::map<std::string, std::int64_t> counted_;  // the last step counted, by trial
  std::unique_ptr<stop_rule> rule_;              // none without a scheduler
};

}  // namespace isorun::sweep
