#pragma once
/// @file command.hpp
/// Any program, isolated: what `isorun -- CMD` and command sweeps run. The program runs under a
/// small shim (command_shim.hpp) that shares the program's process group, kills the group if the
/// supervisor disappears and reports the program's own exit status. Under a memory cap the shim preloads the driver-API
/// cap library (libisorun_cuda_cap.so) into the program, with a shared region that counts the device memory of all the
/// program's processes.

#include <sys/types.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "isorun/internal_api.hpp"
#include "isorun/runner/gpu_inventory.hpp"
#include "isorun/runner/outcome.hpp"

namespace isorun::runner {

/// What to run, where, and under which limits.
struct command_spec {
  std::vector<std::string> argv;  ///< argv[0]: a path, or a name looked up in PATH
  std::vector<gpu_info> gpus;     ///< visible as CUDA devices 0, 1, ...; empty: none
  std::uint64_t mem_limit = 0;    ///< bytes, 0 = none
  /// Hard cap on the host memory of the command and everything it starts (host_memory.hpp);
  /// 0 = none. Past it the command ends out_of_memory.
  std::uint64_t host_mem_limit = 0;
  bool enforce_cap = true;                ///< false: the cap is only exported (advisory)
  std::chrono::milliseconds timeout{0};   ///< 0 = none
  std::chrono::milliseconds grace{5000};  ///< first signal → SIGKILL delay
  /// The first signal at the timeout (a sweep whose trials keep checkpoints sends its warning).
  int timeout_signal = SIGTERM;
  std::vector<std::string> extra_env;  ///< "KEY=VALUE" added to the program's environment
  int stdin_fd = 0;                    ///< -1: /dev/null
  int stdout_fd = 1;
  /// Where the program's stderr goes. With `stderr_tail_lines` > 0 it passes through the
  /// supervisor (a pipe), which keeps its last lines for the outcome; else it goes straight there.
  int stderr_fd = 2;
  std::size_t stderr_tail_lines = 0;
  /// With stderr_tail_lines > 0: bytes of its stderr copied to stderr_fd at most, then a line
  /// saying it was cut (for a file: a sweep's trial log); 0: no bound.
  std::uint64_t stderr_limit = 0;
  /// With an enforced cap: keep the last this many changes of what the command's processes hold
  /// (command_result::memory_timeline); 0: none.
  std::size_t memory_events = 0;
};

/// How a command ended.
struct command_result {
  /// success (exit 0), task_error (another exit code), out_of_memory (failed after its cap
  /// refused an allocation), crashed (killed by a signal), timeout, cancelled, internal_error.
  outcome status;
  /// The program's own end, as the shim saw it; nullopt if the shim could not say (it was
  /// killed with the group before it could report).
  std::optional<exit_status> program;
  /// What the cap refused, in one line ("" if nothing, or no cap).
  std::string cap_report;
  /// The signal of the first cancel(), 0 if none.
  int stopped_by = 0;
  /// With `memory_events`: what the command held on each device over time, as JSON
  /// (driver_cap::memory_timeline); "" otherwise.
  std::string memory_timeline;
};

/// One running command. Destroying it before wait() returned stops the group at once.
class ISORUN_INTERNAL_API command {
 public:
  /// @brief Resolves argv[0] and starts the shim with the program.
  /// @throws usage_error if argv is empty or argv[0] is not an executable file nor found in
  ///         PATH (nothing is started); internal_error if the process cannot be created.
  static std::unique_ptr<command> start(command_spec spec);
  ~command();
  command(const command&) = delete;
  command& operator=(const command&) = delete;

  /// @brief Blocks until the shim is gone (enforcing the timeout, carrying out cancels) and
  ///        classifies the end. Call from one thread; later calls return the same result.
  const command_result& wait();

  /// @brief Stops the command: the first call sends `sig` to its process group, then SIGKILL
  ///        after the grace period; a later SIGINT or SIGTERM takes the next step at once (a
  ///        second Ctrl-C, a second cancel), any other signal is passed on to the group.
  ///        Async-signal-safe; returns at once.
  void cancel(int sig = SIGTERM) noexcept;

  /// The shim's pid, which is also the program's process group.
  [[nodiscard]] pid_t pid() const noexcept;

  struct state;

 private:
  explicit command(std::unique_ptr<state> s);
  std::unique_ptr<state> state_;
};

}  // namespace isorun::runner
