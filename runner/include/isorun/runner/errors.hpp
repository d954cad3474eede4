#pragma once
/// @file errors.hpp
/// Exceptions thrown to callers of isolated tasks, one per outcome class. Each is also
/// available as a value: see outcome.hpp.

#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

#include "isorun/alloc/out_of_memory.hpp"
#include "isorun/export.hpp"

namespace isorun {

/// Base of every isorun error except `out_of_memory` (which derives from std::runtime_error so
/// that the allocator does not depend on the runner).
class ISORUN_API error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Bad input from the caller: unknown task, bad argument, impossible resource request. Nothing
/// was started. The CLI exits with code 2.
class ISORUN_API usage_error : public error {
 public:
  using error::error;
};

/// The task threw. Carries the original exception's (demangled) type name and message.
class ISORUN_API task_error : public error {
 public:
  task_error(std::string type_name, std::string message)
      : error(type_name + ": " + message), type_name_{std::move(type_name)}, message_{std::move(message)} {}
  [[nodiscard]] const std::string& type_name() const noexcept { return type_name_; }
  [[nodiscard]] const std::string& message() const noexcept { return message_; }

 private:
  std::string type_name_, message_;
};

/// The worker died (signal) or exited without delivering a result.
class ISORUN_API worker_crashed : public error {
 public:
  worker_crashed(const std::string& what, int signal, int exit_code, std::vector<std::string> stderr_tail)
      : error(what), signal_{signal}, exit_code_{exit_code}, stderr_tail_{std::move(stderr_tail)} {}
  /// Terminating signal, or 0 if the worker exited.
  [[nodiscard]] int signal() const noexcept { return signal_; }
  /// Exit code, or -1 if killed by a signal.
  [[nodiscard]] int exit_code() const noexcept { return exit_code_; }
  /// The last lines the worker wrote to stderr.
  [[nodiscard]] const std::vector<std::string>& stderr_tail() const noexcept { return stderr_tail_; }

 private:
  int signal_, exit_code_;
  std::vector<std::string> stderr_tail_;
};

/// The task ran past its timeout and was stopped (with its whole process group).
class ISORUN_API task_timeout : public error {
 public:
  task_timeout(const std::string& what, std::chrono::milliseconds timeout) : error(what), timeout_{timeout} {}
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return timeout_; }

 private:
  std::chrono::milliseconds timeout_;
};

/// The task was cancelled by the caller.
class ISORUN_API cancelled : public error {
 public:
  using error::error;
};

/// The worker delivered something that failed validation (bad handshake, corrupt, truncated or
/// oversized result, malformed control message). It was discarded.
class ISORUN_API invalid_result : public error {
 public:
  using error::error;
};

/// The supervisor itself failed (could not create shared memory, could not spawn).
class ISORUN_API internal_error : public error {
 public:
  using error::error;
};

}  // namespace isorun
