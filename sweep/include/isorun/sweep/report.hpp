#pragma once
/// @file report.hpp
/// What a sweep's results say: the metric of each trial, the top-k table and results.csv.

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "isorun/sweep/journal.hpp"
#include "isorun/sweep/spec.hpp"

namespace isorun::sweep {

/// @brief The value `r` is ranked by: its result's numeric field named by the metric, for a
///        successful trial of a spec that has a metric; nullopt otherwise.
std::optional<double> metric_of(const sweep_spec& s, const trial_record& r);

/// @brief Why `result` (of `whose`, for the message) cannot be ranked by the spec's metric,
///        naming the numeric fields it has; "" if it can.
std::string metric_problem(const sweep_spec& s, const nlohmann::json& result, const std::string& whose);

/// @brief The top-k table, sorted by the metric (wall time when there is none), numbers aligned.
std::string top_table(const sweep_spec& s, const std::vector<trial_record>& records, int k);

/// @brief results.csv: one row per record; parameters and result fields as columns.
std::string results_csv(const std::vector<trial_record>& records);

}  // namespace isorun::sweep
