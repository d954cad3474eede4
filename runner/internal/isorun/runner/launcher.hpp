#pragma once
/// @file launcher.hpp
/// Starting a worker process, separate from giving it work. A launched worker waits on its
/// control socket for an assignment (protocol.hpp), so it can be started before its task is
/// known (standby) or by something other than a local spawn (another host); `job` assigns it.

#include <chrono>
#include <string>
#include <vector>

#include "isorun/runner/job.hpp"
#include "isorun/runner/process.hpp"
#include "isorun/runner/unique_fd.hpp"

namespace isorun::runner {

/// What a worker needs at exec time; everything else comes with its assignment.
struct launch_spec {
  std::string executable;              ///< worker program; empty = this program
  std::string label;                   ///< shown after "isorun-worker" in ps (the task, when known)
  std::vector<std::string> extra_env;  ///< "KEY=VALUE" added to the inherited environment
  stdout_mode stdout_to = stdout_mode::inherit;
  std::string stdout_path;             ///< for stdout_mode::file
};

/// A started worker that has no work yet.
struct launched_worker {
  child process;          ///< the worker, leading its own process group
  unique_fd control;      ///< the supervisor's end of the control socket
  unique_fd stderr_read;  ///< the worker's stderr (and stdout with to_stderr), non-blocking
  std::chrono::steady_clock::time_point started;
};

/// @brief What launching a worker for `spec` takes: its program, environment and output.
inline launch_spec launch_spec_for(const job_spec& spec) {
  return {.executable = spec.executable,
          .label = spec.task,
          .extra_env = spec.extra_env,
          .stdout_to = spec.stdout_to,
          .stdout_path = spec.stdout_path};
}

/// Starts workers.
class launcher {
 public:
  virtual ~launcher() = default;
  /// @brief Starts a worker that waits for its assignment. No GPU is visible to it until then.
  /// @throws internal_error if it cannot be started (nothing is left running).
  virtual launched_worker launch(const launch_spec& spec) = 0;
};

/// Starts workers as children of this process: vfork + exec, each leading its own process
/// group, the control socket as its descriptor 3, stdin from /dev/null.
class local_launcher final : public launcher {
 public:
  launched_worker launch(const launch_spec& spec) override;
};

}  // namespace isorun::runner
