#pragma once
// `isorun [OPTIONS] -- CMD ARGS...`: any program, isolated (runner/command.hpp runs it); this
// part hands it the stop signals (interrupt.hpp) and speaks for it on the terminal.

#include "options.hpp"

namespace isorun::cli {

/// @brief Runs `o.command` on the GPUs the options choose; returns the exit code to mirror: the
///        command's own, 128 + the signal that ended it, or 124 after a timeout.
/// @throws usage_error if the command cannot be found or the GPUs cannot be had.
int run_command(const cli_options& o);

}  // namespace isorun::cli
