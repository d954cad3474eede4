#pragma once
/// @file memory_timeline.hpp
/// One run's memory timeline, as a worker writes it to $ISORUN_MEMORY_TIMELINE: checked, read as
/// a sweep's files are, and drawn as a page of its own (`isorun --memory-timeline FILE.html`) or
/// in a sweep's report.

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

namespace isorun::sweep {

/// @brief What is wrong with `timeline` as the JSON a worker writes to $ISORUN_MEMORY_TIMELINE
///        (a field of the wrong type, say); "" if nothing.
std::string timeline_problem(const nlohmann::json& timeline);

/// @brief The memory timeline a worker wrote to `file` ($ISORUN_MEMORY_TIMELINE), read as a
///        sweep's files are (not through a link, a regular file, bounded) and checked by
///        timeline_problem.
/// @throws std::exception (usage_error, internal_error, std::runtime_error) saying what is wrong.
nlohmann::json read_memory_timeline(const std::filesystem::path& file);

/// @brief A page with one run's memory timeline (`isorun --memory-timeline FILE.html`), from
///        the JSON a worker writes to $ISORUN_MEMORY_TIMELINE, checked by timeline_problem.
std::string render_memory_timeline(const nlohmann::json& timeline, const std::string& title);

}  // namespace isorun::sweep
