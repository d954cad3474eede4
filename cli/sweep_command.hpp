#pragma once
// `isorun sweep SPEC.yaml | TASK --grid k=v1,v2 | --grid k=v1,v2 -- PROGRAM ... [FLAGS]`.

#include <string>
#include <vector>

#include "options.hpp"

namespace isorun::cli {

/// @brief Runs (or, with Slurm, submits and follows) the sweep the options describe: the spec
///        file, TASK or command with the sweep flags over it; prints the best trials on stdout
///        and a summary on stderr. Ctrl-C stops it (interrupt.hpp). Without a spec, TASK or
///        command, prints its usage on stderr.
/// @param libs the task libraries, loaded already: the workers load them too.
/// @return 0 if every trial succeeded, 1 if one failed, 130 if interrupted, 2 for bad usage.
/// @throws usage_error for a bad spec or flags, before any trial starts.
int run_sweep(const cli_options& o, const std::vector<std::string>& libs);

}  // namespace isorun::cli
