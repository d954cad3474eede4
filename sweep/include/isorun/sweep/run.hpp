#pragma once
/// @file run.hpp
/// Running a sweep: every input checked and the output folder locked before anything starts;
/// then trials run isolated and capped on the planned slots, each final outcome journaled before
/// it counts, so re-running the same command resumes.

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "isorun/sweep/errors.hpp"
#include "isorun/sweep/journal.hpp"
#include "isorun/sweep/spec.hpp"
#include "isorun/sweep/standby_plan.hpp"
#include "isorun/sweep/stop_request.hpp"
#include "isorun/sweep/sweep_options.hpp"

namespace isorun::sweep {

struct run_state;  // what the run's parts share (sweep/src/engine/run_state.hpp)

/// What a finished (or interrupted) sweep did.
struct sweep_summary {
  std::size_t total = 0, skipped = 0, succeeded = 0, failed = 0, cancelled = 0;
  std::size_t pruned = 0;   ///< stopped early by the scheduler (done, not failed)
  std::uint64_t steps = 0;  ///< steps the trials reached, summed over every trial's latest record
  bool interrupted = false;
  std::vector<trial_record> records;  ///< every trial's latest record
  std::string report;                 ///< OUT/report.html ("" if it could not be written)
  bool detached = false;              ///< submitted to Slurm and not waited for
  std::vector<std::string> jobs;      ///< the Slurm arrays in flight when it returned (detached)
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
  sweep_run(const sweep_spec& s, std::vector<slot> slots, sweep_options options);
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
  ///         success; running trials are stopped); search_error if the searcher failed;
  ///         internal_error if the journal cannot be written.
  sweep_summary run();

 private:
  std::unique_ptr<run_state> state_;
};

}  // namespace isorun::sweep
