#pragma once
// A trial's metric as the report reads it, in the charts, the cards and the order of the
// memory timelines alike.

#include <optional>

#include "isorun/sweep/report_model.hpp"

namespace isorun::sweep::detail {

// The metric of a successful trial (its wall time, without a metric); none for the others,
// or where its result lacks the metric.
std::optional<double> metric_value(const report_data& d, const trial_record& r);

// Higher is better, whatever the metric's goal (wall time, without a metric: shorter is better).
double goodness(const report_data& d, double m);

}  // namespace isorun::sweep::detail
