#pragma once
// Which task libraries a command loads, and loading them.

#include <string>
#include <vector>

#include "options.hpp"

namespace isorun::cli {

/// @brief The task libraries, absolute: --tasks, then ISORUN_TASKS, then every .so in
///        <libdir>/isorun/tasks (beside isorun-cli). @throws usage_error naming one that does not exist.
std::vector<std::string> task_libraries(const cli_options& o);

/// @brief dlopens them, registering their tasks. @throws usage_error if one cannot be loaded,
///        or two register the same task name.
void load_libraries(const std::vector<std::string>& libs);

}  // namespace isorun::cli
