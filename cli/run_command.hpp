#pragma once
// `isorun [OPTIONS] -- CMD ARGS...`: any program, isolated (runner/command.hpp runs it); this
// part forwards Ctrl-C and the other stop signals to it and speaks for it on the terminal.

#include "cli_args.hpp"
#include "isorun/runner/gpu_inventory.hpp"

namespace isorun::cli {

/// @brief Runs `opts.command`; returns the exit code to mirror: the command's own, 128 + the
///        signal that ended it, or 124 after a timeout.
/// @throws usage_error if the command cannot be found.
int run_command(const cli_options& opts, const std::vector<runner::gpu_info>& gpus);

}  // namespace isorun::cli
