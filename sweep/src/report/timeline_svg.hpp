#pragma once
// Memory timelines (the JSON a worker, or a command's cap, writes to $ISORUN_MEMORY_TIMELINE):
// read from a sweep's logs or a file as a damaged or crafted one may be, and drawn as SVG.

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

namespace isorun::sweep::detail {

// The memory timeline `name` in `dir` (shown as `shown`), checked; null if there is none.
// @throws std::exception saying what is wrong with it.
nlohmann::json read_timeline(int dir, const std::string& name, const std::filesystem::path& shown);

// One device's allocated and reserved bytes over the task's time, with the cap; and, after an
// OOM, what was live when it failed. `t` has passed timeline_problem.
std::string timeline_svg(const nlohmann::json& t);

}  // namespace isorun::sweep::detail
