#pragma once
/// @file html_report.hpp
/// A sweep's report: one self-contained HTML file (inline SVG and CSS, a little plain JavaScript
/// to sort and page the table; nothing is fetched), drawn from what the output folder holds:
/// sweep.json (the runs, their slots), the journal and the trials' memory timelines. It stays
/// readable at 10,000 trials: charts sample or aggregate, the table is paged.

#include <filesystem>
#include <string>

#include "isorun/sweep/memory_timeline.hpp"
#include "isorun/sweep/report_model.hpp"

namespace isorun::sweep {

/// @brief The report page for `data`.
std::string render_report(const report_data& data);

/// @brief Writes OUT/report.html (atomically), from what OUT holds; the warnings of
///        load_report_data go to stderr.
/// @throws usage_error (not a sweep's folder), internal_error (cannot write).
void write_report(const std::filesystem::path& out);

}  // namespace isorun::sweep
