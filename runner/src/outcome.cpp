#include "isorun/runner/outcome.hpp"

#include "isorun/runner/errors.hpp"

#include <string.h>

namespace isorun {

namespace runner {
std::string signal_name(int sig) {
  if (const char* abbrev = ::sigabbrev_np(sig)) return std::string("SIG") + abbrev;
  return "signal " + std::to_string(sig);
}

std::string describe(const exit_status& status) {
  if (status.signal) return "killed by " + signal_name(status.signal) + (status.core_dumped ? " (core dumped)" : "");
  return "exited with code " + std::to_string(status.code);
}

}  // namespace runner

std::string_view to_string(outcome_kind kind) noexcept {
  switch (kind) {
    case outcome_kind::success: return "success";
    case outcome_kind::task_error: return "task_error";
    case outcome_kind::out_of_memory: return "out_of_memory";
    case outcome_kind::crashed: return "crashed";
    case outcome_kind::timeout: return "timeout";
    case outcome_kind::cancelled: return "cancelled";
    case outcome_kind::invalid_result: return "invalid_result";
    case outcome_kind::internal_error: return "internal_error";
  }
  return "unknown";
}

std::optional<outcome_kind> outcome_kind_named(std::string_view name) noexcept {
  for (auto kind : all_outcome_kinds)
    if (to_string(kind) == name) return kind;
  return std::nullopt;
}

int exit_code(outcome_kind kind) noexcept {
  switch (kind) {
    case outcome_kind::success: return 0;
    case outcome_kind::task_error: return 1;
    case outcome_kind::out_of_memory: return 3;
    case outcome_kind::crashed: return 4;
    case outcome_kind::invalid_result: return 5;
    case outcome_kind::timeout: return 124;
    case outcome_kind::internal_error: return 125;
    case outcome_kind::cancelled: return 130;
  }
  return 125;
}

std::string outcome::describe() const {
  std::string s(to_string(kind));
  if (!error_type.empty()) s += ": " + error_type;
  if (!message.empty()) s += ": " + message;
  return s;
}

void outcome::rethrow() const {
  switch (kind) {
    case outcome_kind::success: return;
    case outcome_kind::task_error: throw task_error(error_type, message);
    case outcome_kind::out_of_memory: throw out_of_memory(message);
    case outcome_kind::crashed: {
      std::string what = message;
      if (!stderr_tail.empty()) {
        what += "; last stderr lines:";
        for (const auto& line : stderr_tail) what += "\n  " + line;
      }
      throw worker_crashed(what, exit.signal, exit.signal ? -1 : exit.code, stderr_tail);
    }
    case outcome_kind::timeout: throw task_timeout(message, timeout);
    case outcome_kind::cancelled: throw cancelled(message);
    case outcome_kind::invalid_result: throw invalid_result(message);
    case outcome_kind::internal_error: throw internal_error(message);
  }
}

}  // namespace isorun
