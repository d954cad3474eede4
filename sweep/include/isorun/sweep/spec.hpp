#pragma once
/// @file spec.hpp
/// What a sweep is: a task and its expanded trials (from YAML or `--grid` flags), the resources
/// they run on, and the metric they are ranked by. Errors name the spec file once, and the line.

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "isorun/runner/gpu_inventory.hpp"
#include "isorun/runner/placement.hpp"

namespace isorun::sweep {

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
  std::string name;  ///< numeric field of the task's result object; "" = rank by wall time
  bool maximize = true;
  int line = 0;  ///< YAML line of `metric:` (0 for flags)
};

/// @brief Parses `--metric NAME[:min|max]` (max when no goal is given).
/// @throws spec_error for an empty name or another goal.
metric_spec parse_metric_flag(const std::string& text);

/// Early stopping (`scheduler:` in the spec, `--scheduler`): a rule from the registry of stop
/// rules (asha, median, hyperband: stop_rule.hpp in the engine) that stops bad trials on the
/// steps they report. `step` is the resource: a trial's reported step.
struct early_stopping_spec {
  std::string type;                              ///< "" (none) or a rule's name
  std::map<std::string, std::int64_t> settings;  ///< each of the rule's settings, defaults filled in
  int line = 0;                                  ///< YAML line of `scheduler:` (0 for the flag)

  explicit operator bool() const noexcept { return !type.empty(); }
  /// @brief The setting `key`; 0 if the rule has none of that name.
  [[nodiscard]] std::int64_t get(const std::string& key) const {
    const auto it = settings.find(key);
    return it == settings.end() ? 0 : it->second;
  }
  /// @brief The step a trial is complete at; the budget a sweep's steps are counted against
  ///        (0: the rule was given none).
  [[nodiscard]] std::int64_t max_t() const { return get("max_t"); }
};

/// @brief Parses `--scheduler TYPE[:key=value,...]` (a rule's name, or none), e.g.
///        `asha:max_t=81,reduction_factor=3`.
/// @throws spec_error naming what is wrong.
early_stopping_spec parse_scheduler_flag(const std::string& text);

/// @brief The --scheduler flag's help, from the registry of rules (stop_rule.hpp): each rule's
///        name, what it is and its settings.
const std::string& scheduler_flag_help();

/// @brief What is wrong with an early-stopping spec on its own ("" if nothing): an unknown rule,
///        a setting out of its range, max_t below the grace period.
std::string early_stopping_problem(const early_stopping_spec& s);

/// A tracker the sweep's events go to (`track: {NAME: {...}}`, `--track NAME[=URI]`): a process
/// that reads them as JSON lines on its stdin, started beside the sweep (docs/sweeps.md,
/// "Trackers"). Its folder, OUT/track/NAME/, is its own; its stdout and stderr go to
/// OUT/track/NAME.err.
struct track_spec {
  std::string name;
  /// What runs; empty: `python3 -m isorun.track.NAME`, for the built-in trackers (mlflow,
  /// tensorboard).
  std::vector<std::string> command;
  /// The rest of its mapping (an MLflow tracker's uri and experiment), given in its first event.
  nlohmann::json settings = nlohmann::json::object();
  int line = 0;
};

/// @brief Whether `name` can name a tracker: letters, digits, _ and - (it names OUT/track/NAME).
bool tracker_name_ok(std::string_view name);

/// @brief Whether isorun has a tracker of that name (`python3 -m isorun.track.NAME`).
bool builtin_tracker(std::string_view name);

/// @brief The trackers isorun has, for messages: "mlflow, tensorboard".
const std::string& builtin_tracker_names();

/// Out-of-memory retries (`policy: oom_retry:`, `--oom-retry`): a trial that ran out of memory is
/// run again with its cap multiplied by `factor`, up to `max` (the last attempt at exactly `max`),
/// at most `max_attempts` times in all. Each attempt is a process and a durable journal line: a
/// factor barely above 1 would make a trial creep up to `max` a byte at a time.
/// `checkpoints:`: each trial keeps its progress in OUT/checkpoints/ID (worker/checkpoint.hpp);
/// every later attempt (a retry, an out-of-memory retry, a resumed sweep) resumes from the
/// latest, and before a planned stop (a timeout, the sweep stopping) the trial is warned by
/// `signal` and has the grace period to save.
struct checkpoint_spec {
  bool on = false;
  int keep = 2;          ///< committed checkpoints kept per trial, the latest
  int signal = SIGUSR1;  ///< the warning
  /// On Slurm: how long before an array task's time limit the warning comes (Slurm sends it up
  /// to a minute early).
  std::chrono::seconds warn_before{120};
  int line = 0;  ///< YAML line of `checkpoints:`
  [[nodiscard]] explicit operator bool() const noexcept { return on; }
};

/// `search:`: trials chosen one by one from the results so far, by a searcher program speaking
/// isorun's searcher protocol (docs/sweeps.md#search; searcher_source.hpp): Optuna's samplers
/// (`type: optuna`, `python -m isorun.search.optuna`), or any program (`type: command`).
struct search_spec {
  std::string type;                  ///< "optuna" or "command"; "": no search
  std::vector<std::string> command;  ///< type command: the searcher program and its arguments
  std::string sampler = "tpe";       ///< type optuna: tpe, cmaes, gp, nsgaii, random, qmc
  std::optional<std::int64_t> seed;  ///< type optuna: the sampler's seed
  int trials = 0;                    ///< the budget: at most this many trials asked for
  /// The parameters it chooses: type optuna, name -> distribution ({float: [lo, hi], log, step},
  /// {int: [lo, hi], log, step}, {categorical: [...]}); type command, the names.
  nlohmann::json params = nlohmann::json::object();
  /// What it optimizes: the metric, or several (multi-objective): {name, maximize} each.
  std::vector<metric_spec> objectives;
  std::chrono::milliseconds timeout{60000};  ///< the longest an answer may take
  int line = 0;                              ///< YAML line of `search:`
  [[nodiscard]] explicit operator bool() const noexcept { return !type.empty(); }
};

/// `scheduler: {type: pbt, ...}`: population-based training (pbt.hpp). The spec's trials are the
/// first population; every `interval` steps a member in the bottom `quantile` is stopped and
/// replaced by a new trial that starts from a top member's latest checkpoint, its parameters
/// perturbed (`mutations`).
struct pbt_spec {
  std::int64_t interval = 0;           ///< steps between decisions; 0: no PBT
  double quantile = 0.25;              ///< the bottom and top fractions of the population
  double resample_probability = 0.25;  ///< a mutated parameter drawn afresh rather than perturbed
  std::uint64_t seed = 0;
  /// Which parameters change, and how: name -> "perturb" (x 0.8 or x 1.2), or a distribution to
  /// draw from ({uniform: [a, b]}, {loguniform: [a, b]}, {choice: [...]}; perturbed otherwise).
  nlohmann::json mutations = nlohmann::json::object();
  int line = 0;  ///< YAML line of `scheduler:`
  [[nodiscard]] explicit operator bool() const noexcept { return interval > 0; }
};

struct oom_retry_spec {
  static constexpr double min_factor = 1.1;  ///< each retry's cap at least this much larger
  static constexpr int default_max_attempts = 8;
  double factor = 0;                        ///< at least min_factor; 0: no out-of-memory retries
  std::uint64_t max = 0;                    ///< the largest cap an attempt gets, per GPU
  int max_attempts = default_max_attempts;  ///< attempts at growing caps, the first included
  int line = 0;                             ///< YAML line of `oom_retry:` (0 for the flag)
  [[nodiscard]] explicit operator bool() const noexcept { return factor > 0; }
};

/// @brief Parses `--oom-retry FACTOR:MAX[:ATTEMPTS]` (`2:16G`, `1.5:16G:12`).
/// @throws spec_error naming what is wrong: a factor that is not a number of at least
///         min_factor, a max that is not a size, attempts that are not a whole number from 2.
oom_retry_spec parse_oom_retry_flag(const std::string& text);

/// @brief The cap of the attempt after one that ran out of memory at `cap`: `cap` times the
///        factor, or `max` where that would pass it; 0 when `cap` is already `max` (or above) or
///        `r` retries nothing. The one place a retried cap is computed.
[[nodiscard]] std::uint64_t next_cap(const oom_retry_spec& r, std::uint64_t cap);

/// Running a sweep's trials on a Slurm cluster (resources: {backend: slurm, ...}): job arrays
/// through sbatch, each array task an `isorun` on its node running its trials isolated and capped
/// on the GPUs Slurm gave it.
struct slurm_spec {
  std::string partition;           ///< sbatch --partition ("" = the cluster's default)
  std::string account;             ///< --account
  std::string time;                ///< --time, per array task ("" = the partition's limit)
  int gpus_per_node = 0;           ///< --gres=gpu:N for each array task (0: no GPUs)
  int trials_per_task = 1;         ///< trials each array task runs (on its slots, as locally)
  int max_running = 0;             ///< array tasks at once (--array=...%N; 0 = no limit)
  std::vector<std::string> extra;  ///< more sbatch options, as given ("--qos=long")
  /// Trials that keep checkpoints: the warning Slurm sends the array task's isorun this long
  /// before its time limit (sbatch --signal), which then warns its trials and requeues the task
  /// (sbatch --requeue). 0: none, and Slurm never requeues an array task.
  int warning_signal = 0;
  std::chrono::seconds warning_lead{0};
};

/// A sweep: the task or command, its trials, where they run, and what to rank them by.
struct sweep_spec {
  std::string source;  ///< where it came from, for messages: "FILE.yaml", "--grid" or ""
  std::string task;    ///< a registered task; empty for a command sweep
  /// A command sweep: the program and its arguments, `{name}` standing for parameter `name`
  /// (`{{name}` for the literal text; other braces are literal). Its result is the last line of its stdout that is a
  /// JSON object, or the JSON object it writes to the file named by $ISORUN_RESULT.
  std::vector<std::string> command;
  int command_line = 0;  ///< YAML line of `command:` (0 for flags)
  /// A Python sweep: the function each trial calls, `module:function` or `path/file.py:function`
  /// (a path as given: relative to the current folder), with the trial's parameters as keyword
  /// arguments, in a fresh interpreter (python_trials.hpp); its returned dict is the result.
  std::string python;
  int python_line = 0;  ///< YAML line of `python:`
  /// Modules a Python sweep's standby interpreters import while they wait (`resources: preload:`).
  std::vector<std::string> preload;
  metric_spec metric;
  early_stopping_spec early_stopping;      ///< `scheduler:` (type "" for none)
  std::vector<nlohmann::json> trials;      ///< expanded parameter sets, in order
  std::map<std::string, int> param_lines;  ///< YAML line where each parameter is given
  std::vector<int> gpus;                   ///< GPU indices; empty = CPU slots
  bool all_gpus = false;
  std::uint64_t mem_limit = 0;
  std::uint64_t host_mem_limit = 0;  ///< host memory cap per trial (its cgroup); 0 = none
  int per_gpu = 0;                   ///< 0 = floor(free memory / mem_limit)
  /// GPUs each trial runs on at once (one place on each; `mem_limit` is per GPU), or, with
  /// `gpus_per_trial_param`, the value of that parameter in each trial.
  int gpus_per_trial = 1;
  std::string gpus_per_trial_param;  ///< `gpus_per_trial: "{name}"`: parameter `name` says
  int gpus_per_trial_line = 0;       ///< YAML line of `gpus_per_trial:` (0 for flags)
  int cpu_slots = 0;                 ///< 0 = number of cores
  std::chrono::milliseconds timeout{0};
  std::map<std::string, int> retries;  ///< outcome class -> extra attempts
  oom_retry_spec oom_retry;            ///< out-of-memory retries at larger caps (off by default)
  checkpoint_spec checkpoints;         ///< trials that keep their progress (off by default)
  std::vector<track_spec> track;       ///< where the sweep's events go besides OUT (none by default)
  search_spec search;                  ///< trials chosen from the results so far (off by default)
  pbt_spec pbt;                        ///< population-based training (off by default)
  /// With search: the spec's `params:`, constants every trial gets beside the searcher's choice.
  /// `trials` then holds one trial of them and the search's parameters (each at its low bound),
  /// for the checks made before anything starts; it never runs.
  nlohmann::json search_constants = nlohmann::json::object();
  bool fail_fast = false;
  std::string out;  ///< output folder
  std::string alloc_conf;
  int standby = 1;           ///< workers kept launched ahead per slot; 0 = none
  bool warm_context = true;  ///< GPU standby workers prepare their context where it fits
  /// `resources: start: zygote` (python: only): each trial's interpreter forked from one that
  /// imported the preloads and the trial's module, rather than exec'd.
  bool zygote = false;
  std::optional<slurm_spec> slurm;  ///< run the trials on Slurm (backend: slurm); here otherwise
};

/// @brief Sets where `s`'s trials run, by the backend's name (`resources: backend:`,
///        `--backend`); false, with `s` unchanged, for a name no backend has.
bool select_backend(sweep_spec& s, std::string_view name);

/// @brief The name of the backend `s` runs its trials on.
std::string_view backend_name(const sweep_spec& s);

/// @brief Every backend a spec can name, with what it is: "local (...) or slurm (...)", for
///        --backend's help and the message that refuses another name.
const std::string& backend_choices();

/// @brief Parses a YAML sweep spec and expands its trials (library isorun::sweep_spec).
/// @throws spec_error with the YAML line of the problem.
sweep_spec parse_spec(const std::string& yaml_text, const std::string& source_name);

using grid_flags = std::vector<std::pair<std::string, std::vector<std::string>>>;

/// @brief Builds a spec from `TASK --grid k=v1,v2 ...` style flags (values already split;
///        library isorun::sweep_spec).
/// @throws spec_error.
sweep_spec spec_from_grid(const std::string& task, const grid_flags& grid);

/// @brief The same for a command: `--grid k=v1,v2 ... -- PROGRAM ARGS...`.
/// @throws spec_error.
sweep_spec spec_from_grid(const std::vector<std::string>& command, const grid_flags& grid);

/// @brief What a sweep runs, in words: the task's name, or the command with its placeholders.
std::string subject(const sweep_spec& s);

/// @brief The parameter names a command's placeholders use, each once, in order of first use.
std::vector<std::string> placeholders(const std::vector<std::string>& command);

/// @brief A trial's command: every `{name}` replaced by the value of parameter `name` (a string
///        as it is, anything else as JSON: 0.01, 128, true).
/// @throws spec_error if a placeholder names no parameter of `params`.
std::vector<std::string> command_for(const std::vector<std::string>& command, const nlohmann::json& params);

/// @brief A parameter's value as a word: a string as it is, anything else as JSON.
std::string value_text(const nlohmann::json& value);

/// @brief The error for `what` at `line` of `s`: "FILE: line N: what" (as much as is known).
spec_error located(const sweep_spec& s, int line, const std::string& what);

/// @brief A trial's parameters as "key=value" words, in key order (how tasks take arguments).
std::vector<std::string> param_words(const nlohmann::json& params);

using runner::slot;
using runner::slot_plan;

/// @brief Whether a trial may run on more than one GPU at once (gpus_per_trial above 1, or taken
///        from a parameter): such trials are packed by runner::gpu_packer, not on fixed slots.
[[nodiscard]] inline bool spans_gpus(const sweep_spec& s) {
  return s.gpus_per_trial > 1 || !s.gpus_per_trial_param.empty();
}

/// @brief The GPUs a trial of `params` takes: gpus_per_trial, or its parameter's value (checked
///        before the sweep starts for the spec's trials).
/// @throws spec_error for a parameter that is not a number of GPUs (a trial a source made).
[[nodiscard]] inline std::size_t gpus_of_trial(const sweep_spec& s, const nlohmann::json& params) {
  if (s.gpus_per_trial_param.empty()) return static_cast<std::size_t>(std::max(1, s.gpus_per_trial));
  const auto v = params.find(s.gpus_per_trial_param);
  if (v == params.end() || !v->is_number_integer() || v->get<long long>() < 1 || v->get<long long>() > 1024)
    throw spec_error("gpus_per_trial takes parameter '" + s.gpus_per_trial_param + "', whose value " +
                         (v == params.end() ? std::string("is missing") : v->dump()) +
                         " is not a number of GPUs (1 or more)",
                     s.gpus_per_trial_line);
  return v->get<std::size_t>();
}

/// @brief gpus_per_trial as a spec writes it: "2", or "{g}" for parameter g's value.
[[nodiscard]] inline std::string gpus_per_trial_text(const sweep_spec& s) {
  return s.gpus_per_trial_param.empty() ? std::to_string(s.gpus_per_trial) : "{" + s.gpus_per_trial_param + "}";
}

/// @brief The GPUs, cap and packing a sweep asks for, for runner::plan_slots.
[[nodiscard]] inline runner::slot_request resources(const sweep_spec& s) {
  return {
      .gpus = s.gpus, .all_gpus = s.all_gpus, .mem_limit = s.mem_limit, .per_gpu = s.per_gpu, .cpu_slots = s.cpu_slots};
}

/// @brief The slots for a sweep's trials: runner::plan_slots for what the spec asks for.
/// @throws usage_error when a cap exceeds a GPU, GPUs are asked for but absent, or no slot fits.
/// @param cores as for runner::plan_slots (0: the cores this process may run on)
inline slot_plan plan_slots(const sweep_spec& s, const gpu_inventory& inventory, unsigned cores = 0) {
  return runner::plan_slots(resources(s), inventory, cores);
}

}  // namespace isorun::sweep
