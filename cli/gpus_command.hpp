#pragma once
// `isorun gpus`: the GPU inventory and the containment in use.

#include "options.hpp"

namespace isorun::cli {

/// @brief Prints the GPU inventory and how workers are contained, as text or, with --json, as
///        a JSON object on stdout. @return the exit code, 0.
int list_gpus(const cli_options& o);

}  // namespace isorun::cli
