#pragma once
// --memory-timeline FILE.html: the page's folder checked before anything runs, and the page
// drawn from a timeline (a task's, which its worker writes; a command's, which the cap kept).

#include <string>

#include <nlohmann/json.hpp>

namespace isorun::cli {

/// @brief Says now, before the run, if the page cannot be written where it is asked for.
/// @throws usage_error naming the folder and why.
void check_timeline_page(const std::string& page);

/// @brief Draws `timeline` into `page` (written whole, then renamed), titled `title`, and says
///        where it is unless `quiet`; a timeline that cannot be drawn is said, not thrown.
void write_timeline_page(const std::string& page, const nlohmann::json& timeline, const std::string& title, bool quiet);

}  // namespace isorun::cli
