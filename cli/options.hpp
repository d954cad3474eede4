#pragma once
// The `isorun` command line: one table of options (options.cpp), parsed with CLI11 for every
// command, so that each flag is spelled, checked and described in one place, `--flag value` and
// `--flag=value` work everywhere, and an unknown flag gets a "did you mean" in every command.
// Bad input throws usage_error (exit code 2) before anything is started.

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "isorun/sweep/spec.hpp"

namespace isorun::cli {

/// What the command line asks for.
enum class mode {
  run_task,     ///< isorun [OPTIONS] TASK [key=value ...]
  run_command,  ///< isorun [OPTIONS] -- CMD [ARGS ...]
  list_tasks,   ///< isorun tasks
  list_gpus,    ///< isorun gpus
  sweep,        ///< isorun sweep ...
  report,       ///< isorun report OUT
  status,       ///< isorun status OUT
  help,         ///< --help: the help of `help_of` on stdout, exit 0
  nothing,      ///< no arguments at all: usage on stderr, exit 2
  version,      ///< --version
};

/// The flags only `isorun sweep` takes; each overrides what the spec says.
struct sweep_flags {
  std::string target;                                                  ///< SPEC.yaml or TASK; "" with -- CMD
  std::vector<std::pair<std::string, std::vector<std::string>>> grid;  ///< --grid key=v1,v2 (in order)
  std::string out;                                                     ///< --out DIR
  std::optional<std::vector<int>> gpus;                                ///< --gpus 0,1 (all: empty and all_gpus)
  bool all_gpus = false;                                               ///< --gpus all
  int per_gpu = -1;                                                    ///< --per-gpu N (-1: not given)
  int gpus_per_trial = 0;                                              ///< --gpus-per-trial N (0: not given)
  std::string gpus_per_trial_param;                                    ///< --gpus-per-trial {name}
  int cpu_slots = -1;                                                  ///< --cpu-slots N
  int standby = -1;                                                    ///< --standby N
  bool cold_standby = false;                                           ///< --no-warm-context
  std::map<std::string, int> retries;                                  ///< --retry CLASS=N
  std::optional<sweep::oom_retry_spec> oom_retry;                      ///< --oom-retry FACTOR:MAX
  bool rerun_failed = false;                                           ///< --rerun-failed
  bool fail_fast = false;                                              ///< --fail-fast
  std::optional<sweep::metric_spec> metric;                            ///< --metric NAME[:min|max]
  std::optional<sweep::early_stopping_spec> scheduler;                 ///< --scheduler TYPE[:key=value,...]
  int top = 5;                                                         ///< --top K
  bool wait = false;                                                   ///< --wait
  bool progress = true;                                                ///< --no-progress
  std::string backend;                                                 ///< --backend local|slurm
  bool detach = false;                                                 ///< --detach
  std::vector<std::pair<std::string, std::string>> track;              ///< --track NAME[=URI]
  std::string node;  ///< --node FILE:TASK, what a Slurm array task runs (isorun passes it)
};

/// --serve and its address: the live report (isorun report OUT --serve, isorun sweep --serve).
struct serve_flags {
  bool on = false;                 ///< --serve
  std::string bind = "127.0.0.1";  ///< --bind ADDR
  int port = -1;                   ///< --port N (-1: not given; served on a free port)
  bool addressed = false;          ///< --bind or --port given (they need --serve)
};

/// Everything the command line says, checked.
struct cli_options {
  mode what = mode::run_task;
  mode help_of = mode::run_task;         ///< with mode::help: whose help
  std::optional<int> gpu;                ///< --gpu N
  std::vector<int> gpus;                 ///< --gpus 0,1
  int gpu_count = 0;                     ///< --gpus any:N
  bool cpu = false;                      ///< --cpu
  std::uint64_t mem_limit = 0;           ///< --mem-limit (also a sweep flag: the cap per trial)
  bool mem_limit_advisory = false;       ///< --mem-limit-mode advisory (-- CMD only)
  std::uint64_t host_mem_limit = 0;      ///< --host-mem-limit (also a sweep flag: per trial)
  std::chrono::milliseconds timeout{0};  ///< --timeout (also a sweep flag: per trial)
  std::chrono::milliseconds grace{5000};
  std::vector<std::string> task_libraries;  ///< --tasks
  std::string alloc_conf;
  std::uint64_t max_result = 0;  // 0: the machine's physical memory
  bool json = false;
  bool quiet = false;
  std::string memory_timeline;       ///< --memory-timeline FILE.html
  std::string task;                  ///< TASK
  std::vector<std::string> params;   ///< key=value after TASK
  std::vector<std::string> command;  ///< after -- (the program to run, or to sweep)
  std::string out;                   ///< OUT of `isorun report` and `isorun status`
  sweep_flags sweep;                 ///< after `isorun sweep`
  serve_flags serve;                 ///< report and sweep: --serve, --bind, --port
  std::vector<std::string> argv;     ///< the whole command line, as given
};

/// @brief Parses argv. @throws usage_error naming the offending argument and what to do.
cli_options parse_command_line(int argc, char** argv);

/// @brief The --help text of a command (mode::run_task: isorun's own), every line within
///        100 columns: its usage, then its options as the option table describes them.
std::string help_text(mode of);

/// @brief True if argv asks for JSON output (--json before any `--`), so that even a usage
///        error, which stops parse_command_line before it has set anything, is reported as a
///        JSON record.
bool wants_json(int argc, char** argv);

}  // namespace isorun::cli
