#pragma once
/// @file page.hpp
/// The frame of isorun's pages (a sweep's report, a run's memory timeline): one self-contained
/// HTML file each, with its style and no dependencies. A live page (served by the sweep's
/// report_server) shows a generation and carries the script that swaps in the next one.

#include <sstream>
#include <string>

namespace isorun::html {

/// @brief The page's head, up to <body>, with the style; on a live page (`live_generation` not
///        empty) the generation it shows is the root's.
void page_head(std::ostringstream& o, const std::string& title, const std::string& live_generation);

/// @brief The end of the page: the live script where the page is live.
void page_tail(std::ostringstream& o, const std::string& live_generation);

}  // namespace isorun::html
