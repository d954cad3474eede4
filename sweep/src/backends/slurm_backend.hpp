#pragma once
// Trials run on a Slurm cluster: each batch the scheduler starts goes out as one job array
// (slurm::submit); each array task's isorun leaves its trials' records in OUT/slurm/results/,
// which a polling thread hands to the scheduler. An array task that ended without a trial's
// record is asked about (scontrol) and the trial's attempt ends as Slurm says it ended (the
// scheduler retries it, in a new array, by the sweep's policy). Arrays an earlier run left
// queued or running (it was killed, or detached) are followed, not submitted again.

#include <condition_variable>
#include <cstddef>
#include <filesystem>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "isorun/sweep/remote_folder.hpp"
#include "isorun/sweep/slurm.hpp"
#include "isorun/sweep/sweep_options.hpp"
#include "isorun/sweep/trial_backend.hpp"

namespace isorun::sweep {

struct slurm_setup {
  const sweep_spec* spec = nullptr;        ///< with spec->slurm; outlives the backend
  const sweep_options* options = nullptr;  ///< node_command, submit_dir
  std::string subject;                     ///< subject(*spec)
  std::filesystem::path out;
  std::vector<std::size_t> queue;   ///< the trials this run owes (indices into spec->trials)
  std::set<std::string> journaled;  ///< the ids of trials the journal holds as done
  std::string job_name;             ///< sbatch --job-name
};

class slurm_backend final : public trial_backend {
 public:
  explicit slurm_backend(slurm_setup setup);
  ~slurm_backend() override;

  /// Slurm queues what it cannot run yet: everything is submitted at once; but a searcher's
  /// trials, max_running at once (a searcher chooses each from those before).
  [[nodiscard]] std::size_t lanes() const override;
  std::vector<trial> begin(trial_sink& sink) override;
  void start(std::vector<trial> batch) override;
  /// Stops `t` alone (early stopping's verdict): leaves OUT/slurm/stop/ID, which the node
  /// running it watches; it stops that trial and leaves its record, as for any trial.
  void stop(const trial& t) override;
  void cancel_all() override;
  void finish() override;

  /// The arrays in flight now (what a detached sweep leaves running).
  [[nodiscard]] std::vector<std::string> jobs() override;
  /// Removes the array tasks' records that are now durable in the journal.
  void journaled(const journal& j) override;

 private:
  void poll();
  void deliver_reports();  // poller: the lines nodes appended to OUT/slurm/reports/ID.jsonl
  void deliver_rest(const std::vector<finished_trial>& ended);  // poller: all the lines left of ended trials
  void read_reports(const trial& t, int looks);                 // poller: what a trial's file holds past the last look
  std::vector<finished_trial> merge();                          // poller (or begin): records array tasks left
  std::vector<finished_trial> check_ended();                    // poller: arrays that ended, their lost trials
  std::vector<finished_trial> lost(const slurm::submission& sub, const std::map<int, slurm::task_end>& states);
  std::vector<finished_trial> cancelled_rest();
  void forget_delivered();                            // poller: arrays whose every trial was delivered
  void save_jobs();                                   // under mutex_
  void learn(const slurm::made_trial& made);          // under mutex_
  [[nodiscard]] bool knows(std::size_t index) const;  // under mutex_: a trial of the spec's or a made one
  trial make_trial(std::size_t index);                // under mutex_

  slurm_setup setup_;
  std::filesystem::path dir_;                    // OUT/slurm: jobs.json, batch files, logs/
  remote_folder folder_;                         // OUT/slurm: records, reports, verdicts, errors
  std::map<std::string, std::size_t> index_of_;  // under mutex_: trial id -> index
  std::map<std::size_t, trial> made_;            // under mutex_: the trials a source made, by index
  trial_sink* sink_ = nullptr;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::map<std::string, slurm::submission> inflight_;  // under mutex_
  std::map<std::size_t, int> attempt_;                 // under mutex_: each trial's attempt in flight
  // Under mutex_: with checkpoints, each trial's latest checkpoint step when it was submitted.
  std::map<std::size_t, std::int64_t> checkpoint_at_start_;
  // With checkpoints, the latest step trial `id` committed (-1: none).
  [[nodiscard]] std::int64_t latest_checkpoint(const std::string& id) const;
  std::set<std::size_t> done_trials_;  // under mutex_: delivered, and not started again
  bool cancelled_ = false, done_ = false;
  std::set<std::string> warned_;                        // poller: report files unusable or skipped in, said once
  std::map<std::size_t, std::uint64_t> report_offset_;  // under mutex_: how much of each trial's reports was read
  std::thread poller_;
};

}  // namespace isorun::sweep
