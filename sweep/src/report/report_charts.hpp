#pragma once
// The report's charts, each an SVG (or a note saying why there is nothing to draw) to place in
// the page: the metric by parameter, all parameters at once, learning curves, slots over time
// and memory against the cap. Each stays readable at 10,000 trials: it samples or merges.

#include <string>

#include "isorun/sweep/report_model.hpp"

namespace isorun::sweep::detail {

// The metric against one parameter: points for a numeric one, a box per value otherwise.
std::string param_chart(const report_data& d, const param_axis& ax);

// All trials across all parameters, one line each, coloured by the metric.
std::string parallel_chart(const report_data& d);

// Every trial's reported metric against its step: pruned trials faded, the best drawn last
// (on top), the rule's rungs marked.
std::string curves_chart(const report_data& d);

// Trials on slots over time, per run: packing and idle gaps.
std::string slots_chart(const report_data& d);

// Peak memory per trial against its cap, highest first.
std::string memory_chart(const report_data& d);

}  // namespace isorun::sweep::detail
