#pragma once
/// @file launcher.hpp
/// Starting a worker process, separate from giving it work. A launched worker waits on its
/// control socket for an assignment (protocol.hpp), so it can be started before its task is
/// known (standby) or by something other than a local spawn (another host); `job` assigns it.

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "isorun/internal_api.hpp"
#include "isorun/runner/job.hpp"
#include "isorun/runner/process.hpp"
#include "isorun/runner/unique_fd.hpp"
#include "isorun/serialization/protocol.hpp"

namespace isorun::runner {

/// What a worker needs at exec time; everything else comes with its assignment (a stdout file
/// too: see job_spec::stdout_path).
struct launch_spec {
  std::string executable;  ///< worker program; empty = this program
  std::string label;       ///< shown after "isorun-worker" in ps (the task, when known)
  /// Set: the worker's arguments after argv[0] (the executable) instead of "isorun-worker
  /// [label]": for a worker that is an interpreter running a program of its own (Python's).
  std::vector<std::string> argv;
  std::vector<std::string> extra_env;  ///< "KEY=VALUE" added to the inherited environment
  bool stdout_to_stderr = false;       ///< stdout merged into the stderr stream, else inherited
  /// Set: the worker sees this GPU from exec on and creates its CUDA context and capped
  /// allocator while it waits; it can then only be assigned a job on exactly this device and cap.
  std::optional<serialization::warm_device> warm;
  /// Set: called with the supervisor's end of the control socket before the process starts, by a
  /// launcher that starts one now (not by one that hands over a worker started earlier): what it
  /// sends is waiting when the worker first reads, so the worker does not wait for it. Not part
  /// of what makes two launches interchangeable.
  std::function<void(int control)> before_start;
  /// Workers forked from a zygote launched as this spec says (zygote.hpp), not exec'd each: only
  /// a standby pool's launcher forks them. To local_launcher, it means "this is the zygote": it
  /// gets a cgroup of its own, but no cgroup namespace (its children's cgroups are beside its own).
  bool zygote = false;
};

/// @brief The warm_device for a job on `gpu` under `mem_limit` and `alloc_conf`.
inline serialization::warm_device warm_device_for(const gpu_info& gpu, std::uint64_t mem_limit,
                                                  std::string alloc_conf) {
  return {.index = gpu.index,
          .simulated = gpu.simulated,
          .device_memory = gpu.total_memory,
          .mem_limit = mem_limit,
          .uuid = gpu.uuid,
          .alloc_conf = std::move(alloc_conf)};
}

/// A started worker that has no work yet.
struct launched_worker {
  child process;          ///< the worker, leading its own process group
  unique_fd control;      ///< the supervisor's end of the control socket
  unique_fd stderr_read;  ///< the worker's stderr (and stdout with to_stderr), non-blocking
  std::chrono::steady_clock::time_point started;
  /// Launched ahead of its call (a standby pool's): asleep waiting for its assignment, or still
  /// starting. The caller's CPU is handed to it for its wake-up (cpu_handoff.hpp).
  bool waiting = false;
};

/// @brief What launching a worker for `spec` takes: its program, environment and output, and its
///        device when `spec.warm_context` asks for it to be prepared ahead.
inline launch_spec launch_spec_for(const job_spec& spec) {
  launch_spec l{.executable = spec.executable,
                .label = spec.task,
                .argv = spec.worker_argv,
                .extra_env = spec.extra_env,
                .stdout_to_stderr = spec.stdout_to == stdout_mode::to_stderr};
  // (One GPU only: a worker on several prepares them once assigned.)
  if (spec.warm_context && spec.gpus.size() == 1)
    l.warm = warm_device_for(spec.gpus.front(), spec.mem_limit, spec.alloc_conf);
  return l;
}

/// Starts workers.
class ISORUN_INTERNAL_API launcher {
 public:
  virtual ~launcher() = default;
  /// @brief Starts a worker that waits for its assignment. No GPU is visible to it until then.
  /// @throws internal_error if it cannot be started (nothing is left running).
  virtual launched_worker launch(const launch_spec& spec) = 0;
};

/// The worker's ends of what it starts with, made for `spec` (the supervisor's ends go into the
/// launched_worker): stdin from /dev/null, stdout (its stderr pipe, or this process's stdout),
/// its stderr pipe, and its control socket, handed to `spec.before_start` on the supervisor's end.
struct worker_ends {
  unique_fd stdin_null, stderr_write, control;
  int stdout_fd = -1;
};
/// @brief Makes them, for any launcher. @throws internal_error if a descriptor cannot be made.
ISORUN_INTERNAL_API worker_ends make_worker_ends(const launch_spec& spec, launched_worker& w);

/// Starts workers as children of this process: vfork + exec, each leading its own process
/// group, the control socket as its descriptor 3, stdin from /dev/null.
class ISORUN_INTERNAL_API local_launcher final : public launcher {
 public:
  launched_worker launch(const launch_spec& spec) override;
};

}  // namespace isorun::runner
