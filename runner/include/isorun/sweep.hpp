#pragma once
/// @file sweep.hpp
/// Hyperparameter sweeps: a spec (YAML or flags) expands into trials; trials run isolated and
/// capped on slots packed per GPU; every finished trial is journaled durably, so re-running the
/// same command resumes.

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "isorun/gpu_inventory.hpp"
#include "isorun/outcome.hpp"

namespace isorun::sweeps {

using runner::gpu_info;
using runner::gpu_inventory;

/// A sweep spec or flag that is wrong; `line` is the YAML line (1-based) or 0 for flags.
class spec_error : public std::invalid_argument {
 public:
  spec_error(const std::string& what, int line) : std::invalid_argument(what), line_{line} {}
  [[nodiscard]] int line() const noexcept { return line_; }

 private:
  int line_;
};

struct metric_spec {
  std::string name;       ///< field of the task's result object
  bool maximize = true;
};

struct spec {
  std::string task;
  metric_spec metric;
  std::vector<nlohmann::json> trials;   ///< expanded parameter sets, in order
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

/// One place a trial can run.
struct slot {
  std::optional<gpu_info> gpu;  ///< nullopt: a CPU slot
  int index = 0;                ///< slot number
};

/// @brief The slots for a sweep: per listed GPU, `per_gpu` or floor(free memory / mem_limit)
///        slots, so that the caps on a GPU never add up to more than its free memory (a trial's
///        cap includes its CUDA context); CPU slots when no GPU is listed.
/// @throws spec_error when a cap exceeds every GPU, GPUs are asked for but absent, or no slot fits.
std::vector<slot> plan_slots(const spec& s, const gpu_inventory& inventory);

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
  int top_k = 5;
  std::chrono::milliseconds grace{5000};
};

struct sweep_summary {
  std::size_t total = 0, skipped = 0, succeeded = 0, failed = 0, cancelled = 0;
  bool interrupted = false;
  std::vector<trial_record> records;  ///< every trial's latest record
};

/// @brief Runs (or resumes) a sweep. Writes OUT/results.jsonl (fsync'ed per trial),
///        OUT/results.csv, OUT/logs/ID.{out,err} and OUT/sweep.json.
/// @throws spec_error / usage_error for bad input before anything starts (e.g. OUT holds a
///         different sweep); internal_error if the journal cannot be written.
sweep_summary run(const spec& s, const std::vector<slot>& slots, const run_options& options);

/// @brief Asks a running sweep to stop (as Ctrl-C): no new trials, running ones cancelled; a
///        second call kills them at once. Async-signal-safe.
void request_stop() noexcept;

/// @brief The top-k table, sorted by the metric.
std::string top_table(const spec& s, const std::vector<trial_record>& records, int k);

}  // namespace isorun::sweeps
