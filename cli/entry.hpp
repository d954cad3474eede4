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

/// @brief Runs `work` and returns its exit status; what it throws becomes the command's failure:
///        usage_error and parse_error (bad input) exit 2, anything else 125, each printed on
///        stderr, and as a JSON record on stdout when the command line asks for --json.
int guarded(int argc, char** argv, const std::function<int()>& work);

}  // namespace isorun::cli
