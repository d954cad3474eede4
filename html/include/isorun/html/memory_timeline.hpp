#pragma once
/// @file memory_timeline.hpp
/// One run's memory timeline, as a worker (or a command's cap) writes it to
/// $ISORUN_MEMORY_TIMELINE: checked as a crafted file may be, read without following links, and
/// drawn as a page of its own (`isorun --memory-timeline FILE.html`) or in a sweep's report.

#include <cstddef>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

namespace isorun::html {

/// The most a memory timeline file may hold: a timeline holds the allocator's history
/// (history:N events), and this is far beyond any.
inline constexpr std::size_t max_timeline_bytes = std::size_t{256} << 20;

/// @brief What is wrong with `timeline` as the JSON a worker writes to $ISORUN_MEMORY_TIMELINE
///        (a field of the wrong type, say); "" if nothing.
std::string timeline_problem(const nlohmann::json& timeline);

/// @brief `text` as a memory timeline: parsed with bounds and checked by timeline_problem.
/// @throws std::runtime_error naming `shown` and saying what is wrong.
nlohmann::json parse_memory_timeline(const std::string& text, const std::filesystem::path& shown);

/// @brief The memory timeline a worker wrote to `file` ($ISORUN_MEMORY_TIMELINE): read as a file
///        others may have planted (not through a link, a regular file, bounded), then parsed.
/// @throws std::runtime_error saying what is wrong (or that it is not there).
nlohmann::json read_memory_timeline(const std::filesystem::path& file);

/// @brief One device's allocated and reserved bytes over the task's time, with the cap; and,
///        after an OOM, what was live when it failed: SVG for a page. `timeline` has passed
///        timeline_problem.
std::string timeline_svg(const nlohmann::json& timeline);

/// @brief A page with one run's memory timeline (`isorun --memory-timeline FILE.html`).
///        `timeline` has passed timeline_problem.
std::string render_memory_timeline(const nlohmann::json& timeline, const std::string& title);

}  // namespace isorun::html
