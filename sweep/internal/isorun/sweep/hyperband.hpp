#pragma once
/// @file hyperband.hpp
/// Hyperband (Li et al., "Hyperband: A Novel Bandit-Based Approach to Hyperparameter
/// Optimization", JMLR 2018) run asynchronously as brackets of ASHA (Li et al., MLSys 2020,
/// section 3.3): with R = max_t, r = grace_period and η, bracket s = 0..s_max (s_max =
/// ⌊log_η(R/r)⌋) is ASHA whose first rung is r·η^s, so bracket 0 halves most aggressively and
/// bracket s_max, whose first rung is at or near R, stops least. Trials go to brackets in the
/// proportions of Hyperband's budgets: the bracket with k = s_max − s halvings gets
/// n_k = ⌈(s_max+1)/(k+1) · η^k⌉ shares (R = 81, η = 3: 81, 34, 15, 8, 5), interleaved by a
/// smooth weighted round robin in the order trials first report, which a resumed sweep's
/// replayed reports repeat.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "isorun/sweep/asha.hpp"
#include "isorun/sweep/stop_rule_base.hpp"

namespace isorun::sweep {

class hyperband_rule final : public stop_rule {
 public:
  /// @param grace_period r, the least first rung (≥ 1); @param reduction_factor η (≥ 2);
  /// @param max_t R, the step a trial is complete at (≥ grace_period).
  hyperband_rule(std::int64_t grace_period, int reduction_factor, std::int64_t max_t);

  /// @brief Judged by the trial's bracket (assigned at its first report).
  bool report(const std::string& id, std::int64_t step, double value) override;

  /// The brackets, s = 0 first: each an ASHA rule and its share of the trials.
  struct bracket {
    asha_rule rule;
    std::int64_t share;
  };
  [[nodiscard]] const std::vector<bracket>& brackets() const noexcept { return brackets_; }
  /// The bracket trial `id` was assigned to; -1 if it has not reported yet.
  [[nodiscard]] int bracket_of(const std::string& id) const;
  /// Every bracket's rungs together, lowest first, each once.
  [[nodiscard]] std::vector<std::int64_t> rungs() const;

 private:
  std::vector<bracket> brackets_;
  std::vector<std::int64_t> credit_;  // the round robin's running credit per bracket
  std::map<std::string, int> assigned_;
};

}  // namespace isorun::sweep
