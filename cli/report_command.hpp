#pragma once
// `isorun report OUT` and `isorun status OUT`: a sweep's folder, read.

#include "options.hpp"

namespace isorun::cli {

/// @brief (Re)writes o.out/report.html. @throws usage_error if o.out is not a sweep's folder.
/// @return the exit code, 0.
int write_report(const cli_options& o);

/// @brief Prints a sweep's progress from its folder o.out (and squeue, for Slurm arrays).
/// @throws usage_error if o.out is not a sweep's folder. @return the exit code, 0.
int show_status(const cli_options& o);

}  // namespace isorun::cli
