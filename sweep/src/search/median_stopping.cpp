// The median stopping rule (median_stopping.hpp).
#include "isorun/sweep/median_stopping.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace isorun::sweep {

median_stopping_rule::median_stopping_rule(std::int64_t grace_period, int min_samples)
    : grace_period_{grace_period}, min_samples_{min_samples} {
  if (grace_period < 0 || min_samples < 1)
    throw std::invalid_argument("median needs grace_period >= 0, min_samples >= 1");
}

void median_stopping_rule::curve::put(std::int64_t step, double value) {
  const auto at = std::lower_bound(steps.begin(), steps.end(), step);
  const auto i = static_cast<std::size_t>(at - steps.begin());
  if (at != steps.end() && *at == step) {
    values[i] = value;  // a step reported again (a resumed trial): the latest value counts
  } else {
    steps.insert(at, step);
    values.insert(values.begin() + static_cast<std::ptrdiff_t>(i), value);
    sums.push_back(0);
  }
  // Reports come in step order, so this touches the last sum alone but for a repeated step.
  for (std::size_t j = i; j < steps.size(); ++j) sums[j] = values[j] + (j ? sums[j - 1] : 0.0);
}

double median_stopping_rule::curve::average_to(std::int64_t t) const {
  const auto n = static_cast<std::size_t>(std::upper_bound(steps.begin(), steps.end(), t) - steps.begin());
  return n ? sums[n - 1] / static_cast<double>(n) : std::numeric_limits<double>::infinity();
}

double median_stopping_rule::curve::best_to(std::int64_t t) const {
  double best = std::numeric_limits<double>::infinity();
  for (std::size_t j = 0; j < steps.size() && steps[j] <= t; ++j) best = std::min(best, values[j]);
  return best;
}

bool median_stopping_rule::report(const std::string& id, std::int64_t step, double value) {
  if (std::isnan(value)) value = std::numeric_limits<double>::infinity();
  curves_[id].put(step, value);
  if (step < grace_period_) return false;
  std::vector<double> averages;
  for (const auto& [other, c] : curves_)
    if (other != id && c.last() >= step) averages.push_back(c.average_to(step));
  if (averages.size() < static_cast<std::size_t>(min_samples_)) return false;
  const auto mid = averages.begin() + static_cast<std::ptrdiff_t>(averages.size() / 2);
  std::nth_element(averages.begin(), mid, averages.end());
  double median = *mid;
  if (averages.size() % 2 == 0) median = (median + *std::max_element(averages.begin(), mid)) / 2;
  return curves_[id].best_to(step) > median;
}

}  // namespace isorun::sweep
