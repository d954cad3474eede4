#pragma once
/// @file outcome.hpp
/// How an isolated task ended, as a value. Every worker ends in exactly one class.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "isorun/export.hpp"

namespace isorun {

namespace runner {
/// How a process ended.
struct exit_status {
  int code = -1;   ///< exit code when it exited normally, else -1
  int signal = 0;  ///< terminating signal, or 0
  bool core_dumped = false;
  [[nodiscard]] bool exited() const noexcept { return signal == 0; }
  [[nodiscard]] bool success() const noexcept { return signal == 0 && code == 0; }
  /// Shell convention: the code, or 128 + signal.
  [[nodiscard]] int shell_code() const noexcept { return signal ? 128 + signal : code; }
};

/// @brief "SIGSEGV" for 11; "signal 64" for one without a name.
ISORUN_API std::string signal_name(int sig);

/// @brief "exited with code 3" / "killed by SIGSEGV (core dumped)".
ISORUN_API std::string describe(const exit_status& status);

}  // namespace runner

enum class outcome_kind {
  success,         ///< result delivered and validated
  task_error,      ///< the task threw
  out_of_memory,   ///< the task hit its memory cap
  crashed,         ///< killed by a signal, or exited without a result
  timeout,         ///< stopped after its timeout
  cancelled,       ///< stopped by the caller (cancel(), Ctrl-C)
  invalid_result,  ///< handshake or result failed validation
  internal_error,  ///< the supervisor could not run it
};

/// Every outcome class, in declaration order.
inline constexpr outcome_kind all_outcome_kinds[] = {
    outcome_kind::success, outcome_kind::task_error, outcome_kind::out_of_memory,  outcome_kind::crashed,
    outcome_kind::timeout, outcome_kind::cancelled,  outcome_kind::invalid_result, outcome_kind::internal_error};

/// @brief "success", "task_error", ...
ISORUN_API std::string_view to_string(outcome_kind kind) noexcept;

/// @brief The class named `name` (as to_string writes it); nullopt for any other text.
ISORUN_API std::optional<outcome_kind> outcome_kind_named(std::string_view name) noexcept;

/// @brief The CLI exit code of each class (see README): 0, 1, 3, 4, 124, 130, 5, 125.
ISORUN_API int exit_code(outcome_kind kind) noexcept;

struct ISORUN_API outcome {
  outcome_kind kind = outcome_kind::internal_error;
  std::string error_type;                ///< exception type for task_error / out_of_memory
  std::string message;                   ///< human-readable detail
  runner::exit_status exit;              ///< how the worker process ended
  std::vector<std::string> stderr_tail;  ///< last lines of the worker's stderr
  std::chrono::milliseconds timeout{0};
  std::uint64_t peak_allocated = 0;  ///< worker allocator peaks, bytes (0 when unknown)
  std::uint64_t peak_reserved = 0;
  /// Peak host memory of the worker and its descendants (their cgroup's memory.peak), bytes; 0
  /// when unknown (no cgroup containment, or no memory controller there).
  std::uint64_t host_memory_peak = 0;
  std::chrono::nanoseconds wall{0};  ///< assignment to reap (to hand-over with exit_pending)
  /// The result was handed over before the worker had exited (isolated_options::early_result):
  /// `exit` is not known; the worker is still being stopped and reaped in the background.
  bool exit_pending = false;
  std::chrono::nanoseconds run{0};  ///< inside the task function
  std::string device;               ///< "cpu" or the GPU's UUID

  [[nodiscard]] bool ok() const noexcept { return kind == outcome_kind::success; }
  /// @brief One line: "task_error: std::runtime_error: bad lr".
  [[nodiscard]] std::string describe() const;
  /// @brief Throws the exception matching `kind` (task_error, worker_crashed, ...). Does nothing
  ///        on success.
  void rethrow() const;
};

}  // namespace isorun
