#pragma once
// Command-line parsing for `isorun`. Bad input throws usage_error (exit code 2) before anything
// is started.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace isorun::cli {

enum class mode {
  run_task,
  run_command,
  list_tasks,
  list_gpus,
  help,     ///< --help: usage on stdout, exit 0
  nothing,  ///< no arguments at all: usage on stderr, exit 2
  version,
  sweep,
  report,  ///< isorun report OUT
  status,  ///< isorun status OUT
};

struct cli_options {
  mode what = mode::help;
  std::optional<int> gpu;  ///< --gpu N
  std::vector<int> gpus;   ///< --gpus 0,1
  int gpu_count = 0;       ///< --gpus any:N
  bool cpu = false;        ///< --cpu
  std::uint64_t mem_limit = 0;
  bool mem_limit_advisory = false;  ///< --mem-limit-mode advisory (-- CMD only)
  std::chrono::milliseconds timeout{0};
  std::chrono::milliseconds grace{5000};
  std::vector<std::string> task_libraries;  ///< --tasks
  std::string alloc_conf;
  std::uint64_t max_result = 1ULL << 40;
  bool json = false;
  bool quiet = false;
  std::string memory_timeline;  ///< --memory-timeline FILE.html
  std::string task;                 ///< TASK
  std::vector<std::string> params;  ///< key=value after TASK
  std::vector<std::string> command; ///< after --
  std::vector<std::string> rest;    ///< arguments of subcommands (sweep)
  std::vector<std::string> argv;    ///< the whole command line, as given
};

/// @brief Parses argv. @throws usage_error naming the offending argument.
cli_options parse_command_line(int argc, char** argv);

/// The --help text.
const char* usage_text();

/// @brief True if argv asks for JSON output (--json before any `--`), so that even a usage
///        error is reported as a JSON record.
bool wants_json(int argc, char** argv);

}  // namespace isorun::cli
