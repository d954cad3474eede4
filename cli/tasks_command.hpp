#pragma once
// `isorun tasks`: the registered tasks.

#include "options.hpp"

namespace isorun::cli {

/// @brief Lists the registered tasks (loaded before) with their signature and parameters, as
///        text or, with --json, as a JSON array on stdout. @return the exit code, 0.
int list_tasks(const cli_options& o);

}  // namespace isorun::cli
