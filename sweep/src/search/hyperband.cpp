// Hyperband as brackets of ASHA (hyperband.hpp).
#include "isorun/sweep/hyperband.hpp"

#include <algorithm>
#include <numeric>
#include <set>
#include <stdexcept>

namespace isorun::sweep {

hyperband_rule::hyperband_rule(std::int64_t grace_period, int reduction_factor, std::int64_t max_t) {
  if (grace_period < 1 || reduction_factor < 2 || max_t < grace_period)
    throw std::invalid_argument("hyperband needs grace_period >= 1, reduction_factor >= 2, max_t >= grace_period");
  const std::int64_t eta = reduction_factor;
  // s_max = ⌊log_η(R/r)⌋, in whole numbers: the largest s with r·η^s ≤ R.
  int s_max = 0;
  for (std::int64_t first = grace_period; first <= max_t / eta;) {
    first *= eta;
    ++s_max;
  }
  std::int64_t first = grace_period;
  for (int s = 0; s <= s_max; ++s) {
    // n_k = ⌈(s_max+1)/(k+1) · η^k⌉ for the bracket with k = s_max − s halvings.
    const int k = s_max - s;
    std::int64_t power = 1;
    for (int i = 0; i < k; ++i) power *= eta;
    const std::int64_t share = ((s_max + 1) * power + k) / (k + 1);
    brackets_.push_back({asha_rule(first, reduction_factor, max_t), share});
    if (s < s_max) first *= eta;  // ≤ R: no overflow
  }
  credit_.assign(brackets_.size(), 0);
}

int hyperband_rule::bracket_of(const std::string& id) const {
  const auto it = assigned_.find(id);
  return it == assigned_.end() ? -1 : it->second;
}

bool hyperband_rule::report(const std::string& id, std::int64_t step, double value) {
  auto [it, fresh] = assigned_.try_emplace(id, 0);
  if (fresh) {
    // Smooth weighted round robin: every bracket earns its share, the richest takes the trial
    // and pays the total. Over Σ shares trials each bracket gets exactly its share, spread out.
    std::int64_t total = 0;
    for (std::size_t b = 0; b < brackets_.size(); ++b) {
      credit_[b] += brackets_[b].share;
      total += brackets_[b].share;
    }
    const auto richest = std::max_element(credit_.begin(), credit_.end()) - credit_.begin();
    credit_[static_cast<std::size_t>(richest)] -= total;
    it->second = static_cast<int>(richest);
  }
  return brackets_[static_cast<std::size_t>(it->second)].rule.report(id, step, value);
}

std::vector<std::int64_t> hyperband_rule::rungs() const {
  std::set<std::int64_t> all;
  for (const auto& b : brackets_) all.insert(b.rule.rungs().begin(), b.rule.rungs().end());
  return {all.begin(), all.end()};
}

}  // namespace isorun::sweep
