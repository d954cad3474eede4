#pragma once
/// @file stop_rule.hpp
/// Early stopping's decision, as the sweep sees it: trials report a metric at steps, and a rule
/// says after each report whether that trial goes on. Pure logic: no clock, no files, no
/// threads, so that replaying the reports a sweep journaled, in their order, rebuilds exactly
/// the state the rule had (what makes a resumed sweep decide as an uninterrupted one would).

#include <cstdint>
#include <memory>
#include <string>

namespace isorun::sweep {

struct early_stop_spec;

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

/// @brief The rule `spec` names ("asha" or "median"). @throws std::invalid_argument otherwise.
std::unique_ptr<stop_rule> make_stop_rule(const early_stop_spec& spec);

}  // namespace isorun::sweep
