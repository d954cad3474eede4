#pragma once
// `isorun [OPTIONS] TASK [key=value ...]`: one task in a fresh worker.

#include <string>
#include <vector>

#include "options.hpp"

namespace isorun::cli {

/// @brief Runs o.task with o.params (checked against the task's types first) on the GPUs the
///        options choose, prints its result (or its --json record) on stdout and a summary on
///        stderr, and draws --memory-timeline. Ctrl-C stops it (interrupt.hpp).
/// @param libs the task libraries, loaded already: the worker loads them too.
/// @return the exit code of the outcome (exit_code()).
/// @throws usage_error for an unknown task, bad arguments or GPUs, before anything starts.
int run_task(const cli_options& o, const std::vector<std::string>& libs);

}  // namespace isorun::cli
