// Early stopping in a sweep (early_stop.hpp).
#include "search/early_stop.hpp"

#include <limits>

namespace isorun::sweep {

early_stopper::early_stopper(const sweep_spec& s, report_log& log, const std::map<std::string, std::int64_t>& replayed,
                             std::unique_ptr<stop_rule> rule)
    : s_{s}, log_{log}, rule_{std::move(rule)} {
  if (!rule_ && s.early_stopping) rule_ = make_stop_rule(s.early_stopping);
  if (!rule_) return;
  // The rule's state as the last run left it: the done trials' reports, in the same order, each
  // judged again (verdicts are recomputed, never read). Verdicts are not acted on here: those
  // trials were pruned or finished.
  for (const auto& r : log.earlier()) {
    const auto done = replayed.find(r.trial);
    if (done == replayed.end() || r.step > done->second || !first_time(r.trial, r.step)) continue;
    if (const auto v = value(r.metrics)) rule_->report(r.trial, r.step, *v);
  }
}

bool early_stopper::first_time(const std::string& id, std::int64_t step) {
  if (!s_.checkpoints) return true;
  const auto [at, added] = counted_.try_emplace(id, step);
  if (!added && step <= at->second) return false;
  at->second = step;
  return true;
}

std::optional<double> early_stopper::value(const nlohmann::json& metrics) const {
  const auto it = metrics.find(s_.metric.name);
  // null: a value JSON cannot carry (NaN, a diverged loss), which the rule takes for the worst
  if (it != metrics.end() && it->is_null()) return std::numeric_limits<double>::quiet_NaN();
  if (it == metrics.end() || !it->is_number()) return std::nullopt;
  const double v = it->get<double>();
  return s_.metric.maximize ? -v : v;
}

bool early_stopper::judge(const std::string& id, std::int64_t step, const nlohmann::json& metrics) {
  if (!first_time(id, step)) return false;  // a step a resumed attempt reports again: counted once
  log_.append({id, step, metrics});
  if (!rule_) return false;
  const auto v = value(metrics);
  if (!v) {
    std::string shown = metrics.dump();
    if (shown.size() > 200) shown = shown.substr(0, 200) + "...";
    throw spec_error("trial " + id + " reported step " + std::to_string(step) + " without the metric '" +
                         s_.metric.name + "' as a number (" + shown + "); the " + s_.early_stopping.type +
                         " scheduler judges every report by it: print it in each report line, e.g. {\"step\": " +
                         std::to_string(step) + ", \"" + s_.metric.name + "\": 0.41}",
                     0);
  }
  return rule_->report(id, step, *v);
}

}  // namespace isorun::sweep
