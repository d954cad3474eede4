#pragma once
/// @file process.hpp
/// Starting and stopping child processes. A child's end is a value (`exit_status`), never an
/// exception. Every stop (a timeout, a cancel, Ctrl-C, a handle destroyed) follows a
/// `stop_plan`, always for the child's whole process group. process.cpp is the only file that
/// touches Boost.Process.

#include <sys/types.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "isorun/internal_api.hpp"
#include "isorun/runner/outcome.hpp"

namespace isorun::runner {

/// What to start and how.
struct spawn_options {
  std::string executable;         ///< path to exec (not searched in PATH)
  std::vector<std::string> args;  ///< argv[1..]; argv[0] is `executable`
  std::vector<std::string> env;   ///< the whole environment, "KEY=VALUE"
  /// {child fd, parent fd}: each parent fd appears in the child under the given number.
  /// Child fds must be 0, 1, 2 or a contiguous run from 3; every other descriptor is closed.
  std::vector<std::pair<int, int>> fds;
  bool new_process_group = true;      ///< the child leads a group of its own
  int parent_death_signal = SIGKILL;  ///< sent to the child if the spawning thread dies; 0 = none
  /// An empty cgroup (new_child_cgroup()) the child is born in (clone3 with CLONE_INTO_CGROUP;
  /// before Linux 5.7 it moves itself there before it execs), and which its handle then owns:
  /// reap() kills whatever is left in it and removes it. "" = none.
  std::string cgroup;
  /// The cgroup.procs of a cgroup in another hierarchy (a v1 memory cgroup: host_memory.hpp)
  /// the child writes itself into before it execs, so nothing of it runs outside; -1 = none.
  int join_cgroup_procs = -1;
  /// Born in a cgroup namespace rooted at `cgroup`, where this process may create one. Off for a
  /// zygote, which starts its children in cgroups beside its own (a namespace would hide them).
  bool cgroup_namespace = true;
};

/// @brief Whether children with a cgroup are born in a cgroup namespace of their own: true until
///        the kernel refused one (no CAP_SYS_ADMIN). A zygote's children follow the same rule.
ISORUN_INTERNAL_API bool cgroup_namespaces_enabled() noexcept;

/// The process could not be started (exec failed, fork failed, bad options).
class ISORUN_INTERNAL_API spawn_error : public std::runtime_error {
 public:
  spawn_error(const std::string& what, int error) : std::runtime_error(what), error_{error} {}
  /// errno of the failure.
  [[nodiscard]] int error() const noexcept { return error_; }

 private:
  int error_;
};

/// One step of stopping a child: send `signal` to its process group (0: send nothing, only
/// wait), then allow it `timeout` to exit before the next step.
struct stop_step {
  int signal = 0;
  std::chrono::milliseconds timeout{0};
};

/// How a child is stopped, as data: its steps in order, each taken only while the child still
/// runs. Once they are used up the child is waited for without limit, so a plan should end with
/// SIGKILL. The escalation isorun uses everywhere is graceful(): SIGTERM, a grace period, SIGKILL.
struct ISORUN_INTERNAL_API stop_plan {
  std::vector<stop_step> steps;

  /// @brief `first_signal` (SIGTERM, or the signal the user sent), `grace` to exit, then SIGKILL.
  static stop_plan graceful(std::chrono::milliseconds grace, int first_signal = SIGTERM);
  /// @brief SIGKILL at once.
  static stop_plan immediate();
};

class child;

/// Carries out a stop_plan from an event loop, one step per call; child::stop() is the
/// blocking form. Calling advance() before a step's timeout is up (a second Ctrl-C, a second
/// cancel) takes the next step at once.
class ISORUN_INTERNAL_API stop_escalation {
 public:
  explicit stop_escalation(stop_plan plan) : plan_{std::move(plan)} {}

  /// @brief True once a step has been taken.
  [[nodiscard]] bool started() const noexcept { return next_ > 0; }

  /// @brief Takes the next step on `c`.
  /// @return when the step after it is due; time_point::max() once no step is left.
  std::chrono::steady_clock::time_point advance(const child& c) noexcept;

 private:
  stop_plan plan_;
  std::size_t next_ = 0;
};

/// A started child process, owned: destroying a still-running child kills its group and reaps it.
class ISORUN_INTERNAL_API child {
 public:
  child() = default;
  child(pid_t pid, int pidfd, bool group, std::string cgroup = {}) noexcept
      : pid_{pid}, pidfd_{pidfd}, group_{group}, cgroup_{std::move(cgroup)} {}
  child(child&& other) noexcept;
  child& operator=(child&& other) noexcept;
  child(const child&) = delete;
  child& operator=(const child&) = delete;
  ~child();

  [[nodiscard]] pid_t pid() const noexcept { return pid_; }
  /// A pidfd: readable once the process has exited. -1 after reap().
  [[nodiscard]] int pidfd() const noexcept { return pidfd_; }
  [[nodiscard]] bool valid() const noexcept { return pid_ > 0; }

  /// @brief The exit status if the process has exited, without reaping it (its pid and process
  ///        group stay reserved until reap(), so signalling the group cannot hit a stranger).
  std::optional<exit_status> peek() const noexcept;

  /// @brief Waits up to `timeout` for the process to exit. @return true once it has exited.
  bool wait_for(std::chrono::milliseconds timeout) const noexcept;

  /// @brief Sends `sig` to the child's process group (or to the child alone without one).
  void signal(int sig) const noexcept;

  /// @brief Kills whatever is left of the process group, reaps the child, then kills whatever is
  ///        left in its cgroup (descendants that left the group with setsid()) and removes the
  ///        cgroup. Blocks until the child itself has exited and its cgroup is empty.
  exit_status reap() noexcept;

  /// The peak memory of the child's cgroup (memory.peak), once reaped, where it reports one.
  [[nodiscard]] std::optional<std::uint64_t> memory_peak() const noexcept { return memory_peak_; }
  /// The child's largest resident set (its own, and its waited-for descendants'), bytes, once
  /// reaped: the peak where no cgroup reports one.
  [[nodiscard]] std::uint64_t max_rss() const noexcept { return max_rss_; }
  /// The child's cgroup directory until it is reaped; "" without one.
  [[nodiscard]] const std::string& cgroup() const noexcept { return cgroup_; }

  /// @brief Stops the child by `plan` (blocking), then reaps it.
  exit_status stop(const stop_plan& plan) noexcept;

 private:
  pid_t pid_ = -1;
  int pidfd_ = -1;
  bool group_ = false;
  std::string cgroup_;
  std::optional<std::uint64_t> memory_peak_;
  std::uint64_t max_rss_ = 0;
};

/// @brief Starts a process. Uses vfork, so the cost does not grow with the parent's memory.
/// @throws spawn_error if it cannot be started; no zombie is left behind in that case.
ISORUN_INTERNAL_API child spawn(const spawn_options& options);

/// What a program printed, and how it ended (its exit status in the shell's convention).
struct program_output {
  int code = -1;
  std::string out, err;
};

/// @brief Reads a started program's stdout and stderr to their ends (`out`, `err`: the read
///        ends of its pipes, closed here), then reaps it.
ISORUN_INTERNAL_API program_output collect_output(child& c, int out, int err);

/// @brief Runs `executable` with `args` (argv[1..]) and the whole environment `env` to its end,
///        capturing what it printed (spawn, then collect_output).
/// @throws spawn_error if it cannot be started.
ISORUN_INTERNAL_API program_output run_to_end(const std::string& executable, std::vector<std::string> args,
                                              std::vector<std::string> env);

/// @brief Resolves `name` like execvp would (a name with '/' is taken as a path).
/// @return the path, or nullopt if nothing executable is found.
ISORUN_INTERNAL_API std::optional<std::string> find_executable(const std::string& name);

/// @brief The running program's own executable (/proc/self/exe resolved).
ISORUN_INTERNAL_API std::string self_executable();

}  // namespace isorun::runner
