#pragma once
/// @file run.hpp
/// Running a sweep: every input checked and the output folder locked before anything starts;
/// then trials run isolated and capped on the planned slots, each final outcome journaled before
/// it counts, so re-running the same command resumes.

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "isorun/runner/errors.hpp"
#include "isorun/sweep/journal.hpp"
#include "isorun/sweep/spec.hpp"

namespace isorun::runner {
class admission;
}

namespace isorun::sweep {

class trial_source;
class list_source;

/// The searcher (`search:`) failed: it could not be started, exited, answered what is not an
/// answer, or took longer than its timeout; or OUT/search.jsonl, which a resumed search replays,
/// holds a line isorun does not write. The message names the searcher and OUT/search.err (or the
/// file and line). The sweep stopped; what was journaled stays, and running it again resumes it.
/// The CLI exits with 1 (docs/sweeps.md).
class search_error : public isorun::error {
 public:
  using error::error;
};

/// How a sweep runs, beyond its spec.
struct sweep_options {
  std::vector<std::string> task_libraries;
  std::string executable;  ///< worker program; empty = this program
  bool rerun_failed = false;
  bool progress = true;        ///< live progress line on a terminal, plain lines otherwise
  bool wait_for_lock = false;  ///< wait for another sweep using the output folder instead of failing
  std::chrono::milliseconds grace{5000};
  /// With the Slurm backend: the command each array task runs on its node, in `submit_dir`
  /// (the isorun command line that made this sweep; `--node FILE:K` is added).
  std::vector<std::string> node_command;
  std::string submit_dir = ".";
  /// With the Slurm backend: submit, and return without waiting (`isorun status OUT` shows
  /// progress; running the same command again follows the arrays and journals their results).
  bool detach = false;
  /// This process is array task K of a Slurm submission ("FILE:K"): it runs the trials listed
  /// for K here, and leaves each one's record in OUT/slurm/results/ for the submitter to journal.
  std::string node;
  /// Where the trials come from, where not the spec's list alone (trial_source.hpp): made with
  /// the spec's trials still to run as a list_source, which it may give out among its own. Not
  /// with the Slurm backend, whose arrays are submitted for the spec's list.
  std::function<std::unique_ptr<trial_source>(std::unique_ptr<list_source> listed)> source;
  /// The source's name and settings, part of which sweep an output folder holds: resuming with
  /// another source is refused.
  std::string source_name;
  /// Where each trial is admitted before it starts, beside the other calls of this process
  /// (runner/admission.hpp); null: the process's, runner::admission::process().
  runner::admission* admission = nullptr;
};

/// Workers a group of slots keeps on standby: while a slot's trial runs, its next worker is
/// launched and waits, so trials do not wait for process starts. Each is used for one trial.
struct standby_group {
  std::optional<gpu_info> gpu;  ///< the GPU the group's slots share; nullopt: the CPU slots
  std::size_t waiting = 0;      ///< workers kept waiting: resources.standby per slot
  bool warm = false;            ///< they create their CUDA context and capped allocator while waiting
};

/// How a sweep keeps workers on standby, and in words (the CLI prints it).
struct standby_plan {
  std::vector<standby_group> groups;
  std::string how;  ///< e.g. "standby: 1 per slot, warm on GPU 0"
};

/// @brief One group per GPU (and one for CPU slots): `s.standby` workers per slot, warm on a GPU
///        when `s.warm_context` and their contexts fit beside the slots' caps
///        (runner::warm_standby_fits), cold (exec'd, no context) otherwise.
standby_plan plan_standby(const sweep_spec& s, const std::vector<slot>& slots);

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

  struct state;

 private:
  std::unique_ptr<state> state_;
};

/// @brief Asks a running sweep to stop (as Ctrl-C): no new trials, running ones cancelled; a
///        second call kills them at once. Says so on stderr at once. Async-signal-safe.
void request_stop() noexcept;

}  // namespace isorun::sweep
