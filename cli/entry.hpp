#pragma once
// What both programs of the isorun command do around their work (CMakeLists.txt says why there are
// two): main.cpp is isorun-cli, the whole command line; front_end.cpp is isorun, which runs
// `-- CMD` itself and hands everything else to isorun-cli.

#include <functional>

namespace isorun::cli {

/// @brief ISORUN_STOP_WITH_PARENT=PID (set by a program that runs isorun as its child, such as
///        isorun.sweep() from Python): isorun gets SIGTERM when that program dies, and stops what
///        it runs as a Ctrl-C would, instead of running on orphaned. The variable is removed, so
///        that the programs isorun runs do not see it.
void stop_with_parent();

/// The variable naming a file for the failure record (ISORUN_ERROR_FILE=PATH), for a program
/// that runs isorun and wants its failure as data rather than words on stderr: Python's
/// isorun.sweep(), a Slurm array task's batch script.
inline constexpr const char* error_file_env = "ISORUN_ERROR_FILE";

/// @brief Runs `work` and returns its exit status; what it throws becomes the command's failure:
///        usage_error and parse_error (bad input) exit 2, anything else 125, each printed on
///        stderr, and as a JSON record ({"outcome": "usage" | "internal_error", "exit_code": N,
///        "message": TEXT}) on stdout when the command line asks for --json, and into the file
///        error_file_env names (taken out of the environment first, so that what isorun runs
///        does not inherit it; written only on such a failure, never through a link).
int guarded(int argc, char** argv, const std::function<int()>& work);

/// @brief Puts error_file_env back, for the program isorun execs in its own place (isorun-cli,
///        whose failures are then recorded there instead).
void hand_on_error_file();

}  // namespace isorun::cli
