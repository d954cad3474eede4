#pragma once
/// @file html_report.hpp
/// A sweep's report: one self-contained HTML file (inline SVG and CSS, a little plain JavaScript
/// to sort and page the table; nothing is fetched), drawn from what the output folder holds:
/// sweep.json (the runs, their slots), the journal and the trials' memory timelines. It stays
/// readable at 10,000 trials: charts sample or aggregate, the table is paged. Served live, the
/// same page carries one more script (page_options).

#include <filesystem>
#include <string>

#include "isorun/sweep/report_model.hpp"

namespace isorun::sweep {

/// How a page is given out: as a file, or live by report_server.
struct page_options {
  /// Empty: a file. Otherwise the journal's generation the page shows, embedded with the script
  /// that asks the server for news and swaps each new page in (report_server.hpp).
  std::string live_generation;
};

/// @brief The report page for `data`.
std::string render_report(const report_data& data, const page_options& page = {});

/// @brief The live page of folder `out` before its sweep has written what a report needs.
std::string render_waiting_page(const std::string& out, const page_options& page);

/// @brief Writes OUT/report.html (atomically), from what OUT holds; the warnings of
///        load_report_data go to stderr.
/// @throws usage_error (not a sweep's folder), internal_error (cannot write).
void write_report(const std::filesystem::path& out);

}  // namespace isorun::sweep
