#pragma once
// `isorun [OPTIONS] -- CMD ARGS...`: any program, isolated. The program runs under a small
// shim (isorun itself, re-executed) that shares its process group and kills the whole group if
// the supervisor disappears; the supervisor forwards Ctrl-C and enforces the timeout.

#include "cli_args.hpp"
#include "isorun/runner/gpu_inventory.hpp"

namespace isorun::cli {

/// @brief Runs `opts.command`; returns the exit code to mirror.
/// @throws usage_error if the command cannot be found.
int run_command(const cli_options& opts, const std::optional<runner::gpu_info>& gpu);

/// @brief True if this process was started as the shim (ISORUN_SHIM=1).
bool is_shim_process();

/// @brief The shim's main: runs argv[1..] in this process group, reports its status. Never returns.
[[noreturn]] void run_shim(int argc, char** argv);

}  // namespace isorun::cli
