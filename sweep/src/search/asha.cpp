// Asynchronous successive halving, stopping form (asha.hpp).
#include "isorun/sweep/asha.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace isorun::sweep {

asha_rule::asha_rule(std::int64_t grace_period, int reduction_factor, std::int64_t max_t) : eta_{reduction_factor} {
  if (grace_period < 1 || reduction_factor < 2 || max_t < grace_period)
    throw std::invalid_argument("asha needs grace_period >= 1, reduction_factor >= 2, max_t >= grace_period");
  // Rungs r, rη, rη², ... below max_t: a trial at max_t is complete, and ends by itself.
  for (std::int64_t r = grace_period; r < max_t; r *= eta_) {
    rungs_.push_back(r);
    if (r > std::numeric_limits<std::int64_t>::max() / eta_) break;
  }
  recorded_.resize(rungs_.size());
}

bool asha_rule::report(const std::string& id, std::int64_t step, double value) {
  if (std::isnan(value)) value = std::numeric_limits<double>::infinity();
  // The highest rung the report reaches.
  std::size_t k = rungs_.size();
  while (k > 0 && rungs_[k - 1] > step) --k;
  if (k == 0) return false;  // below the first rung: nothing to compare yet
  --k;
  auto& mine = verdict_[id];
  // Judged before (a resumed trial repeating its steps, or a report between rungs): a stop
  // stands, and a trial judged at this rung or a higher one goes on without being recorded again.
  for (const auto& [judged, stopped] : mine)
    if (stopped) return true;
  if (!mine.empty() && mine.rbegin()->first >= k) return false;
  auto& rung = recorded_[k];
  rung[id] = value;
  std::size_t better = 0;
  for (const auto& [other, v] : rung) better += other != id && v < value;
  // Top ⌊n/η⌋ as in the paper's promotion rule, but at least one: the first at a rung goes on.
  const std::size_t keep = std::max<std::size_t>(1, rung.size() / static_cast<std::size_t>(eta_));
  const bool stop = better >= keep;
  mine[k] = stop;
  return stop;
}

}  // namespace isorun::sweep
