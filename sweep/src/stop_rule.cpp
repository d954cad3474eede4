// Which early-stopping rule a spec names (stop_rule.hpp).
#include "isorun/sweep/stop_rule.hpp"

#include <stdexcept>

#include "isorun/sweep/asha.hpp"
#include "isorun/sweep/median_stopping.hpp"
#include "isorun/sweep/spec.hpp"

namespace isorun::sweep {

std::unique_ptr<stop_rule> make_stop_rule(const early_stop_spec& spec) {
  if (spec.type == "asha") return std::make_unique<asha_rule>(spec.grace_period, spec.reduction_factor, spec.max_t);
  if (spec.type == "median") return std::make_unique<median_stopping_rule>(spec.grace_period, spec.min_samples);
  throw std::invalid_argument("no early-stopping rule named '" + spec.type + "'");
}

}  // namespace isorun::sweep
