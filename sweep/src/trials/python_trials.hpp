#pragma once
// Python sweeps (`python: module:function` in a spec): each trial calls the function in a fresh
// interpreter running isorun's Python worker (`python -m isorun._worker`, from the isorun
// package), the same worker an isolated call from Python gets. The request is JSON, not a
// pickle, so that a sweep needs no Python of its own: the function by name, the folder it is
// found from, the trial's parameters as keyword arguments, and the variables of the call (the
// driver-API cap's region). The function's returned dict comes back as the task's JSON result.

#include <string>

#include <nlohmann/json.hpp>

#include "isorun/runner/job.hpp"
#include "isorun/sweep/spec.hpp"

namespace isorun::sweep::python_trials {

/// The task the Python worker serves a call under (python/src/worker_side.cpp).
inline constexpr const char* task_name = "isorun.python";

/// Set in a trial's interpreter (and the check's): isorun.sweep() refuses to start a sweep
/// there, so a script that sweeps its own functions without a `__main__` guard fails plainly
/// instead of starting a sweep per trial.
inline constexpr const char* trial_env = "ISORUN_SWEEP_TRIAL";

/// @brief The interpreter trials run in: $ISORUN_PYTHON, else `python3` from PATH.
/// @throws usage_error if there is none.
std::string interpreter();

/// @brief The last line of what a Python program said on stderr (its exception, where it raised
///        one), for a message about why it failed.
std::string last_line(std::string text);

/// @brief Checks a Python sweep before anything starts: the interpreter runs and imports the
///        isorun package, and the function is found (its module imported or its file loaded,
///        as a trial does).
/// @throws spec_error naming the `python:` line.
void check(const sweep_spec& s);

/// @brief One trial's request: the function (a file's path made absolute), the folder modules
///        are found from (the current one), and `params` as keyword arguments.
nlohmann::json request(const sweep_spec& s, const nlohmann::json& params);

/// @brief Makes `spec` launch the Python worker: the interpreter, `-m isorun._worker`, the
///        modules standby interpreters preload, and the cap library where the trial is capped
///        on a GPU.
void launch(const sweep_spec& s, runner::job_spec& spec);

}  // namespace isorun::sweep::python_trials
