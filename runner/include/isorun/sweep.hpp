#pragma once
/// @file sweep.hpp
/// Hyperparameter sweeps: a spec (YAML or flags) expands into trials; trials run isolated and
/// capped on slots packed per GPU; every finished trial is journaled durably, so re-running the
/// same command resumes.

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <thread>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "isorun/gpu_inventory.hpp"
#include "isorun/outcome.hpp"
#include "isorun/placement.hpp"

namespace isorun::sweeps {

using runner::gpu_info;
using runner::gpu_inventory;

/// A sweep spec or flag that is wrong; `line` is the YAML line (1-based) or 0 for flags. The
/// message names the spec file (once) and the line where they are known.
class spec_error : public std::invalid_argument {
 public:
  spec_error(const std::string& what, int line) : std::invalid_argument(what), line_{line} {}
  [[nodiscard]] int line() const noexcept { return line_; }

 private:
  int line_;
};

struct metric_spec {
  std::string name;       ///< numeric field of the task's result object; "" = rank by wall time
  bool maximize = true;
  int line = 0;           ///< YAML line of `metric:` (0 for flags)
};

/// @brief Parses `--metric NAME[:min|max]` (max when no goal is given).
/// @throws spec_error for an empty name or another goal.
metric_spec parse_metric_flag(const std::string& text);

struct spec {
  std::string source;                   ///< where it came from, for messages: "FILE.yaml", "--grid" or ""
  std::string task;
  metric_spec metric;
  std::vector<nlohmann::json> trials;   ///< expanded parameter sets, in order
  std::map<std::string, int> param_lines;  ///< YAML line where each parameter is given
  std::vector<int> gpus;                ///< GPU indices; empty = CPU slots
  bool all_gpus = false;
  std::uint64_t mem_limit = 0;
  int per_gpu = 0;                      ///< 0 = floor(free memory / mem_limit)
  int cpu_slots = 0;                    ///< 0 = number of cores
  std::chrono::milliseconds timeout{0};
  std::map<std::string, int> retries;   ///< outcome class -> extra attempts
  bool fail_fast = false;
  std::string out;                      ///< output folder
  std::string alloc_conf;
};

/// @brief Parses a YAML sweep spec and expands its trials (library isorun::sweep_spec).
/// @throws spec_error with the YAML line of the problem.
spec parse_spec(const std::string& yaml_text, const std::string& source_name);

/// @brief Builds a spec from `TASK --grid k=v1,v2 ...` style flags (values already split;
///        library isorun::sweep_spec).
/// @throws spec_error.
spec spec_from_grid(const std::string& task, const std::vector<std::pair<std::string, std::vector<std::string>>>& grid);

/// @brief Stable id of a trial: 16 hex digits of XXH3 over the task and canonical parameters.
std::string trial_id(const std::string& task, const nlohmann::json& params);

using runner::slot;
using runner::slot_plan;

/// @brief The GPUs, cap and packing a sweep asks for, for runner::plan_slots.
[[nodiscard]] inline runner::slot_request resources(const spec& s) {
  return {.gpus = s.gpus, .all_gpus = s.all_gpus, .mem_limit = s.mem_limit, .per_gpu = s.per_gpu, .cpu_slots = s.cpu_slots};
}

/// @brief The slots for a sweep's trials: runner::plan_slots for what the spec asks for.
/// @throws usage_error when a cap exceeds a GPU, GPUs are asked for but absent, or no slot fits.
inline slot_plan plan_slots(const spec& s, const gpu_inventory& inventory,
                            unsigned cores = std::thread::hardware_concurrency()) {
  return runner::plan_slots(resources(s), inventory, cores);
}

/// How a finished trial ended, as journaled.
struct trial_record {
  std::string id;
  nlohmann::json params;
  outcome_kind kind = outcome_kind::success;
  nlohmann::json result;  ///< the task's result (success) or null
  std::string error;      ///< description for failures
  double wall_s = 0;
  std::string device;
  int slot = 0;
  int attempts = 0;
  std::uint64_t peak_reserved = 0;
  [[nodiscard]] nlohmann::json to_json() const;
  static trial_record from_json(const nlohmann::json& j);
};

struct run_options {
  std::vector<std::string> task_libraries;
  std::string executable;  ///< worker program; empty = this program
  bool rerun_failed = false;
  bool progress = true;    ///< live progress line on a terminal, plain lines otherwise
  bool wait_for_lock = false;  ///< wait for another sweep using the output folder instead of failing
  std::chrono::milliseconds grace{5000};
};

struct sweep_summary {
  std::size_t total = 0, skipped = 0, succeeded = 0, failed = 0, cancelled = 0;
  bool interrupted = false;
  std::vector<trial_record> records;  ///< every trial's latest record
};

/// A sweep whose every input has been checked and whose output folder is locked, with nothing
/// run yet: each trial's arguments against the task, the metric against the task's result
/// type (where the task's result is default-constructible; otherwise at the first success),
/// the folder against a different sweep. The lock (flock on OUT/sweep.lock) is held while this
/// object lives; the kernel releases it if the process dies, so kill -9 and resume still work.
class sweep_run {
 public:
  /// @throws spec_error naming the spec line where one is known, or usage_error, for bad input
  ///         (nothing is created for it); usage_error if another sweep holds OUT (unless
  ///         options.wait_for_lock); internal_error if OUT cannot be written.
  sweep_run(const spec& s, std::vector<slot> slots, run_options options);
  ~sweep_run();
  sweep_run(sweep_run&&) noexcept;
  sweep_run& operator=(sweep_run&&) noexcept;

  /// Trials the run will start (not yet journaled, or failed with rerun_failed).
  [[nodiscard]] std::size_t pending() const noexcept;
  /// The output folder.
  [[nodiscard]] const std::string& out() const noexcept;
  /// Problems found reading an existing journal (lines that are not records), one per line.
  [[nodiscard]] const std::vector<std::string>& warnings() const noexcept;

  /// @brief Runs the pending trials; call once. Writes OUT/results.jsonl (fsync'ed per trial),
  ///        OUT/results.csv and OUT/logs/ID.{out,err}.
  /// @throws usage_error if the metric turns out not to be a numeric field of the result (first
  ///         success; running trials are stopped); internal_error if the journal cannot be written.
  sweep_summary run();

  struct state;

 private:
  std::unique_ptr<state> state_;
};

/// @brief Checks, runs (or resumes) a sweep: sweep_run(s, slots, options).run().
sweep_summary run(const spec& s, const std::vector<slot>& slots, const run_options& options);

/// @brief Asks a running sweep to stop (as Ctrl-C): no new trials, running ones cancelled; a
///        second call kills them at once. Says so on stderr at once. Async-signal-safe.
void request_stop() noexcept;

/// @brief The top-k table, sorted by the metric (wall time when there is none), numbers aligned.
std::string top_table(const spec& s, const std::vector<trial_record>& records, int k);

}  // namespace isorun::sweeps
