#pragma once
/// @file scheduler.hpp
/// The sweep's scheduler: it takes trials from a source (trial_source.hpp) and its own retries,
/// starts them on a backend as lanes come free, tells the source each final record, and decides what an attempt's end
/// means: a retry (the spec's retries per outcome class, or out-of-memory retries at a larger cap, whose attempts are
/// journaled), a final record for the journal writer, or a stop of the whole sweep (fail-fast, a metric the results
/// lack, a backend or journal failure, a stop request). Backends only run attempts.

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "isorun/sweep/journal_writer.hpp"
#include "isorun/sweep/spec.hpp"
#include "isorun/sweep/stop_source.hpp"
#include "isorun/sweep/trial_backend.hpp"
#include "isorun/sweep/trial_source.hpp"

namespace isorun::sweep {

/// How the scheduler decides, beyond the spec's retries, fail_fast and metric.
struct scheduler_options {
  /// The metric was checked against the task's result type up front; otherwise the first
  /// success decides whether its result has it.
  bool metric_checked = false;
  /// A Slurm array task: a stop there is Slurm's scancel, which signals every process of the
  /// task, so an attempt that did not succeed after a stop request ended with the stop.
  bool stop_fails_as_cancelled = false;
  /// Journal the attempts of trials that keep checkpoints which a stop preempted. Not on a Slurm
  /// node: the array task, requeued, runs them again (a record would say they were done).
  bool journal_preempted = true;
  /// Early stopping's hook: whether a running trial should be stopped, given a report it made
  /// (called for every report of a running trial, one at a time, in the order it judges them).
  /// A trial it stops is *pruned*: journaled as such with its last report, never retried. It
  /// may throw spec_error for a report the sweep cannot use (one without the metric): the sweep
  /// stops as for a metric the results lack (metric_error()); any other exception stops it as
  /// a failure (error()).
  std::function<bool(const trial&, std::int64_t step, const nlohmann::json& metrics)> should_stop;
  /// Trials an earlier run left to be retried at a larger cap after running out of memory (their
  /// last journaled record has retry_mem_limit): their next attempt, by trial id (whatever
  /// source gives them again). Each starts at that attempt and cap instead of the spec's first.
  std::map<std::string, trial> resumed;
  /// Called for each attempt about to start, before the backend starts it (under no lock); what
  /// it throws stops the sweep as a backend's failure to start would.
  std::function<void(const trial&)> starting;
  /// Called as a running trial's checkpoint is committed (trial_sink::on_checkpoint).
  std::function<void(const trial&, std::int64_t step)> checkpointed;
  /// Called (under no lock of the backend's) whenever the number of running trials changes.
  std::function<void(std::size_t running)> running_changed;
};

class scheduler final : private trial_sink {
 public:
  /// @param s      the sweep (its retries, fail_fast, metric); outlives the scheduler
  /// @param source where the trials come from (the spec's list, or a source that adds trials as
  ///               results come); outlives the scheduler
  scheduler(const sweep_spec& s, trial_source& source, trial_backend& backend, journal_writer& writer,
            const stop_source& stop, scheduler_options options = {});

  /// @brief Runs the sweep: starts trials while lanes are free and nothing says stop, until the
  ///        source gives no more and every trial started has ended; then finishes the backend.
  ///        With `detach`, returns once the source is exhausted and every trial has been
  ///        started, leaving them running (a detached Slurm sweep). Call once. Errors are not
  ///        thrown: see error() and metric_error().
  void run(bool detach = false);

  /// @brief A stop request: no new trials; every running one is cancelled (again: killed).
  void interrupt();

  /// @brief Stops one running trial; it ends as cancelled, not journaled.
  void stop(const trial& t);
  /// @brief Stops one running trial as early stopping does: it ends pruned (unless it succeeded
  ///        first), journaled with its last report, and is not retried.
  void prune(const trial& t);

  /// Trials running now.
  [[nodiscard]] std::size_t running() const;
  /// Attempts that ended cancelled (and so were not journaled).
  [[nodiscard]] std::size_t cancelled() const;
  /// Why the metric is not in the results ("" if it is, or is not known yet).
  [[nodiscard]] std::string metric_error() const;
  /// What stopped the sweep from the backend or the journal writer (null: nothing).
  [[nodiscard]] std::exception_ptr error() const;
  /// @brief The sweep cannot go on (the journal writer failed): stops it as fail-fast does.
  void fail(std::exception_ptr error);

 private:
  struct totals {  // a trial's attempts so far, for its final record
    double start_s = 0, wall_s = 0;
  };
  void on_finished(std::vector<finished_trial> batch) override;
  void on_report(const trial& t, std::int64_t step, const nlohmann::json& metrics) override;
  void on_checkpoint(const trial& t, std::int64_t step) override;
  void on_error(std::exception_ptr error) override;
  bool stopping() const;        // under mutex_
  std::optional<trial> take();  // under mutex_
  // Under mutex_: what one attempt's end means (its kind, another attempt, or an end); true if
  // the sweep must stop. Its steps follow.
  bool settle(finished_trial& f, std::vector<trial_record>& final);
  void reclassify(finished_trial& f);
  void after_cancel(finished_trial& f, std::vector<trial_record>& final);
  bool retried_at_larger_cap(finished_trial& f, std::vector<trial_record>& final);
  bool retried(finished_trial& f);
  void halt_and_cancel(std::unique_lock<std::mutex>& lk);

  const sweep_spec& s_;
  trial_source& source_;
  trial_backend& backend_;
  journal_writer& writer_;
  const stop_source& stop_;
  scheduler_options options_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<trial> retries_;              // attempts to start again, before the source's next trial
  std::set<std::size_t> running_, ended_;  // by trial index
  std::set<std::size_t> stopped_;          // stopped one by one (stop())
  std::set<std::size_t> pruned_;           // stopped by early stopping (prune())
  std::map<std::size_t, std::pair<std::int64_t, nlohmann::json>> last_report_;  // running trials' last reports
  std::mutex judging_;                                                          // should_stop sees one report at a time
  std::map<std::size_t, totals> totals_;
  std::size_t cancelled_ = 0;
  bool halted_ = false, metric_checked_ = false;
  bool source_failed_ = false;  // the source threw: the sweep stops (error_)
  std::string metric_error_;
  std::exception_ptr error_;
};

}  // namespace isorun::sweep
