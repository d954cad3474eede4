#pragma once
/// @file asha.hpp
/// Asynchronous successive halving (Li et al., "A System for Massively Parallel Hyperparameter
/// Tuning", MLSys 2020), in its stopping form: rungs at steps r·η^k (r the grace period, η the
/// reduction factor) below max_t. A trial whose report reaches a rung is recorded there; it goes
/// on only if it is among the best ⌊n/η⌋ of the n trials recorded at that rung so far, itself
/// included. The first trial at a rung always goes on (with nothing to compare against, waiting
/// would be synchronous halving). No batches, no waiting: each decision uses the rung as it is.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "isorun/sweep/stop_rule_base.hpp"

namespace isorun::sweep {

class asha_rule final : public stop_rule {
 public:
  /// @param grace_period the first rung (≥ 1); @param reduction_factor η (≥ 2);
  /// @param max_t        the step a trial is complete at: no rung at or above it.
  asha_rule(std::int64_t grace_period, int reduction_factor, std::int64_t max_t);

  /// @brief Judges the trial at the highest rung at or below `step` it has not been judged at
  ///        yet (a report that skips rungs is judged once, at the highest, as Ray Tune does);
  ///        at a rung it was judged at, the verdict given then.
  bool report(const std::string& id, std::int64_t step, double value) override;

  /// The rungs' steps, lowest first.
  [[nodiscard]] const std::vector<std::int64_t>& rungs() const noexcept { return rungs_; }
  /// The trials recorded at rung `k` and their values.
  [[nodiscard]] const std::map<std::string, double>& recorded(std::size_t k) const { return recorded_.at(k); }

 private:
  int eta_;
  std::vector<std::int64_t> rungs_;
  std::vector<std::map<std::string, double>> recorded_;         // per rung: trial -> value there
  std::map<std::string, std::map<std::size_t, bool>> verdict_;  // trial -> rung -> stopped there
};

}  // namespace isorun::sweep
