#pragma once
/// @file stop_rule_base.hpp
/// Early stopping's decision, as the sweep sees it: trials report a metric at steps, and a rule
/// (asha.hpp, median_stopping.hpp, hyperband.hpp) says after each report whether that trial goes
/// on. Pure logic: no clock, no files, no threads, so that replaying the reports a sweep
/// journaled, in their order, rebuilds exactly the state the rule had (what makes a resumed sweep
/// decide as an uninterrupted one would). The registry that names the rules is stop_rule.hpp.

#include <cstdint>
#include <string>

namespace isorun::sweep {

class stop_rule {
 public:
  virtual ~stop_rule() = default;
  /// @brief Trial `id` reported `value` at `step`; lower is better (the caller negates a metric
  ///        to maximize). NaN counts as the worst value.
  /// @return true if the trial should stop now. A trial that repeats a step it already reported
  ///         (a resumed sweep runs an interrupted trial again from its start) is judged as it
  ///         was the first time where the rule keeps that judgement (ASHA's rungs).
  virtual bool report(const std::string& id, std::int64_t step, double value) = 0;
};

}  // namespace isorun::sweep
