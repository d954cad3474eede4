#pragma once
/// @file median_stopping.hpp
/// The median stopping rule (Golovin et al., "Google Vizier", KDD 2017): at a step t at or past
/// the grace period, a trial is stopped if its best value so far is worse than the median of the
/// other trials' running averages at t (the mean of each one's values at steps up to t, over
/// the trials that have reached t), once at least min_samples other trials have reached t.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "isorun/sweep/stop_rule_base.hpp"

namespace isorun::sweep {

class median_stopping_rule final : public stop_rule {
 public:
  median_stopping_rule(std::int64_t grace_period, int min_samples);
  bool report(const std::string& id, std::int64_t step, double value) override;

 private:
  struct curve {  // one trial's reports, by step, with running sums for the averages
    std::vector<std::int64_t> steps;
    std::vector<double> values, sums;
    void put(std::int64_t step, double value);
    [[nodiscard]] std::int64_t last() const { return steps.back(); }
    [[nodiscard]] double average_to(std::int64_t t) const;  // mean of the values at steps <= t
    [[nodiscard]] double best_to(std::int64_t t) const;     // least value at steps <= t
  };
  std::int64_t grace_period_;
  int min_samples_;
  std::map<std::string, curve> curves_;
};

}  // namespace isorun::sweep
