#pragma once
// What a sweep's trials run: a C++ task of a program (task_program.cpp), any command
// (command_program.cpp) or a Python function (python_trials.cpp). One class per kind, chosen
// in one place (program_of); the rest of the sweep asks the program what differs between kinds
// instead of checking which of task:, command: and python: a spec has. A new kind is a file of
// its own and a line in program_of.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "isorun/runner/driver_cap.hpp"
#include "isorun/runner/job.hpp"
#include "isorun/sweep/spec.hpp"

namespace isorun::sweep {

class trial_program {
 public:
  explicit trial_program(const sweep_spec& s) : s_{s} {}
  virtual ~trial_program() = default;
  trial_program(const trial_program&) = delete;
  trial_program& operator=(const trial_program&) = delete;

  /// @brief What trial ids are derived from: the task, "python:module:function", or the
  ///        command's words.
  [[nodiscard]] virtual std::string subject() const = 0;

  /// @brief The default output folder's last word (isorun-sweep-NAME), and the Slurm job's.
  [[nodiscard]] virtual std::string short_name() const = 0;

  /// @brief Checks what can be known before anything starts: the program is found, and each of
  ///        the spec's trials fits it.
  /// @throws spec_error naming the line where one is known.
  virtual void check() const = 0;

  /// @brief A trial's request for its worker, from its parameters ("" for a program that runs
  ///        no worker).
  /// @throws usage_error (spec_error naming the parameter's line) for parameters that do not fit.
  [[nodiscard]] virtual std::string request(const nlohmann::json& /*params*/) const { return {}; }

  /// @brief The result's shape where it is known before any trial runs (a task's default
  ///        result), to check the metric against; nullopt otherwise.
  [[nodiscard]] virtual std::optional<nlohmann::json> result_shape() const { return std::nullopt; }

  /// @brief Whether each trial runs in an isorun worker (which standby workers serve), or as a
  ///        process of its own (a command).
  [[nodiscard]] virtual bool in_worker() const { return true; }

  /// @brief Whether trials allocate through isorun's allocator, which can keep a memory timeline.
  [[nodiscard]] virtual bool uses_isorun_allocator() const { return false; }

  /// @brief The task a worker serves a trial under.
  [[nodiscard]] virtual std::string worker_task() const { return {}; }

  /// @brief Makes a worker trial's job launch what the program needs (another worker program).
  virtual void launch(runner::job_spec& /*spec*/) const {}

  /// @brief What a worker trial on a capped GPU brings with its request (`spec.args`, updated):
  ///        a Python trial's driver-API cap, whose region rides with the request. Null: nothing.
  /// @throws std::exception where the cap cannot be made.
  [[nodiscard]] virtual std::unique_ptr<runner::driver_cap> bring_cap(runner::job_spec& /*spec*/) const {
    return nullptr;
  }

  /// @brief Hands an attempt's own variables (KEY=VALUE: its checkpoint folder, where it
  ///        resumes) to a worker trial. True where they ride with the request (`spec.args`,
  ///        updated), which a standby worker launched earlier receives too; false where they are
  ///        the worker's environment (`spec.extra_env`), which only a worker launched for the
  ///        attempt gets.
  virtual bool carry_variables(runner::job_spec& spec, const std::vector<std::string>& variables) const {
    spec.extra_env.insert(spec.extra_env.end(), variables.begin(), variables.end());
    return false;
  }

  /// @brief What to say when a trial's result lacks the metric because it gave no result: ""
  ///        where the generic message says it all.
  [[nodiscard]] virtual std::string no_result_hint(const std::string& /*metric*/, const std::string& /*whose*/) const {
    return {};
  }

 protected:
  const sweep_spec& s_;
};

/// @brief The spec's parameter names, in the order its trials first give them: every one a
///        trial can get (a searcher names what it chooses in `search: params:`).
std::vector<std::string> parameter_names(const sweep_spec& s);

/// @brief The program of `s`'s trials (which outlives it).
std::unique_ptr<trial_program> program_of(const sweep_spec& s);

std::unique_ptr<trial_program> task_program(const sweep_spec& s);
std::unique_ptr<trial_program> command_program(const sweep_spec& s);
std::unique_ptr<trial_program> python_program(const sweep_spec& s);

}  // namespace isorun::sweep
