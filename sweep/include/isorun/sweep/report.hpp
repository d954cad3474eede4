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

/// @brief The top-k table, sorted by the metric (wall time when there is none), numbers aligned;
///        "" for k <= 0.
std::string top_table(const sweep_spec& s, const std::vector<trial_record>& records, int k);

/// The columns a set of records gets after the fixed ones (id, outcome, attempts, wall_s,
/// device, peak_reserved, and error last): one per parameter, then one per result field, named
/// result_NAME where the name is a parameter's or a fixed column's; or, where no result is an
/// object, one column "result" holding the whole result. results.csv and the report's table.
struct result_columns {
  std::vector<std::string> params;   ///< parameter names, sorted
  std::vector<std::string> fields;   ///< result fields, sorted (empty: the whole result in one column)
  std::vector<std::string> headers;  ///< the columns' names: the parameters', then the fields' (or "result")

  /// @brief What `r` holds in these columns, in `headers` order (null where it has nothing).
  [[nodiscard]] std::vector<nlohmann::json> values(const trial_record& r) const;
};

/// @brief The columns of `records` (see result_columns).
result_columns columns_of(const std::vector<trial_record>& records);

/// @brief results.csv: one row per record; parameters and result fields as columns.
std::string results_csv(const std::vector<trial_record>& records);

}  // namespace isorun::sweep
