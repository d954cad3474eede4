#pragma once
/// @file trial_backend.hpp
/// Where a sweep's trials run, as the scheduler sees it: a backend starts attempts of trials the
/// scheduler hands it, stops one or all of them when told, and hands every attempt's end (and
/// any intermediate report) to one sink. What to run next, whether to retry, and when to stop
/// are the scheduler's; how a trial runs (a worker on a slot, a Slurm array task) the backend's.

#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "isorun/sweep/journal.hpp"
#include "isorun/sweep/spec.hpp"

namespace isorun::sweep {

/// One attempt of one trial.
struct trial {  // NOLINT(bugprone-exception-escape): its moves are std::string's and nlohmann::json's, which do not
                // throw
  std::size_t index = 0;  ///< its source's number for it (new_trial::index): its place in the spec's trials
  std::string id;         ///< trial_id(subject, params)
  int attempt = 1;        ///< 1 for the first, 2 for the first retry, ...
  /// This attempt's cap per GPU: larger than the spec's after an out-of-memory retry; 0: the spec's.
  std::uint64_t mem_limit = 0;
  int oom_retries = 0;              ///< attempts before this one that were retried at a larger cap
  nlohmann::json params;            ///< the trial's parameters
  nlohmann::json origin = nullptr;  ///< new_trial::origin, for its records
};

/// @brief An attempt's cap per GPU: its own after an out-of-memory retry, else the spec's.
[[nodiscard]] inline std::uint64_t cap_of(const trial& t, const sweep_spec& s) noexcept {
  return t.mem_limit ? t.mem_limit : s.mem_limit;
}

/// How an attempt ended: the trial, and its record as the backend made it (`record.attempts`
/// may say more than `t.attempt` where the backend retried by itself, as a Slurm node does).
struct finished_trial {
  trial t;
  trial_record record;
};

/// What a backend tells the scheduler. Called from any of the backend's threads, never while
/// the backend holds a lock of its own: the scheduler may call back into the backend.
class trial_sink {
 public:
  virtual ~trial_sink() = default;
  /// @brief Attempts that ended, in one batch (delivered together, so that their retries can
  ///        start together). Every attempt started ends here exactly once, as `cancelled`
  ///        if it was stopped or never got to run.
  virtual void on_finished(std::vector<finished_trial> batch) = 0;
  /// @brief A running trial's intermediate report: its `step` and the metrics it had then.
  ///        What early stopping (ASHA, median stopping) decides on.
  virtual void on_report(const trial& t, std::int64_t step, const nlohmann::json& metrics) = 0;
  /// @brief Checkpoint `step` of a running trial is committed: by the trial itself (its
  ///        `{"checkpoint": STEP}` line says so after the fact), or by the backend for a command
  ///        that announced it. For the trackers; the same call rules as on_report.
  virtual void on_checkpoint(const trial& t, std::int64_t step) = 0;
  /// @brief The backend cannot go on (a usage error a Slurm node reported, ...): the sweep stops
  ///        as fail-fast does, and run() throws `error` once everything has ended.
  virtual void on_error(std::exception_ptr error) = 0;
};

/// Runs attempts of trials. Its methods are called from the scheduler's threads, never while
/// the scheduler holds its lock.
class trial_backend {
 public:
  virtual ~trial_backend() = default;

  /// @brief Attempts the backend runs at once; the scheduler starts no more than this.
  [[nodiscard]] virtual std::size_t lanes() const = 0;

  /// @brief Begins delivering to `sink`; called once, before any start(). Returns the trials it
  ///        already runs, left by an earlier run of the sweep (Slurm arrays it follows again):
  ///        the scheduler counts them as started. Records such a run left finished may reach
  ///        `sink` before this returns.
  virtual std::vector<trial> begin(trial_sink& sink) = 0;

  /// @brief Starts `batch` (at most lanes() minus what runs), without waiting for any to end.
  /// @throws usage_error if they cannot be started at all (sbatch refusing an array).
  virtual void start(std::vector<trial> batch) = 0;

  /// @brief Stops one running (or starting) attempt: it ends, through the sink, as it ends.
  virtual void stop(const trial& t) = 0;

  /// @brief Stops everything running and starting: each attempt still ends through the sink.
  ///        A second call is more forceful (SIGKILL at once, not after the grace period).
  virtual void cancel_all() = 0;

  /// @brief Waits for the backend's threads once nothing runs; no sink call comes after it.
  virtual void finish() = 0;
  /// @brief What the backend left running elsewhere for a detached sweep (a cluster's job
  ///        ids); none for a backend that runs trials here.
  [[nodiscard]] virtual std::vector<std::string> jobs() { return {}; }
  /// @brief After finish(), once the run's records are durable in `j`: what the backend kept
  ///        elsewhere until they were (a cluster's nodes' records) can go.
  virtual void journaled(const journal& j) { (void)j; }
};

}  // namespace isorun::sweep
