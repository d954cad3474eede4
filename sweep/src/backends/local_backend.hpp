#pragma once
// Trials run here: one lane per slot, each attempt in a fresh capped worker (or the sweep's
// command) on the lane's slot, or on GPUs taken from a runner::gpu_packer when trials span
// GPUs; standby workers, one pool per GPU, launched ahead so that attempts do not wait for
// process starts. Also what a Slurm array task runs its share of trials on.
//
// Each attempt is admitted where the process's other calls are (runner/admission.hpp) before it
// starts: its cap on each GPU the admission knows, or a CPU slot; so isolated calls and executors
// in the same program never put more caps on a GPU than its memory beside the sweep's trials.
//
// Intermediate reports: lines of a trial's stdout log, which its worker or command writes
// directly (so that what it printed outlives the supervisor) and the backend follows
// (log_follower): they reach trial_sink::on_report while the trial runs.

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "isorun/runner/admission.hpp"
#include "isorun/runner/gpu_packer.hpp"
#include "isorun/runner/job.hpp"
#include "isorun/runner/standby.hpp"
#include "isorun/sweep/log_follower.hpp"
#include "isorun/sweep/standby_plan.hpp"
#include "isorun/sweep/sweep_options.hpp"
#include "isorun/sweep/trial_backend.hpp"
#include "isorun/worker/checkpoint.hpp"

namespace isorun::runner {
class command;
}

namespace isorun::sweep {

class trial_program;

/// What the local backend runs, and where its files go.
struct local_setup {
  const sweep_spec* spec = nullptr;        ///< outlives the backend
  const trial_program* program = nullptr;  ///< what the trials run; outlives the backend
  const sweep_options* options = nullptr;  ///< task libraries, worker program, grace
  std::vector<slot> slots;
  std::filesystem::path out;                        ///< the output folder
  int logs = -1;                                    ///< OUT/logs, opened (not owned)
  bool timelines = false;                           ///< keep each trial's memory timeline
  int run = 0;                                      ///< records' run number (0 on a Slurm node)
  std::chrono::steady_clock::time_point run_start;  ///< records' start_s is after this
  std::optional<nlohmann::json> first;              ///< the first trial's parameters (standby workers are made for it)
};

/// @brief The memory each GPU of `slots` has for its trials' caps together, by GPU index: its
///        free memory when the sweep started, less the room kept for warm standby workers'
///        contexts (plan_standby). What trials whose caps differ (out-of-memory retries at
///        larger caps) are packed against.
std::map<int, std::uint64_t> trial_memory(const sweep_spec& s, const std::vector<slot>& slots);

class local_backend final : public trial_backend {
 public:
  explicit local_backend(local_setup setup);
  ~local_backend() override;

  [[nodiscard]] std::size_t lanes() const override { return setup_.slots.size(); }
  std::vector<trial> begin(trial_sink& sink) override;
  void start(std::vector<trial> batch) override;
  void stop(const trial& t) override;
  void cancel_all() override;
  void finish() override;

 private:
  // What runs on a lane now, for cancelling: a place in the admission queue, a worker's job, or
  // a command.
  struct running_trial {
    std::size_t index = 0;
    std::shared_ptr<runner::admission::waiter> waiting;
    std::shared_ptr<runner::job> job;
    runner::command* command = nullptr;
    // SIGTERM, or the checkpoint warning before a planned stop (the sweep stopping).
    void cancel(int first_signal) const noexcept;
  };
  // An attempt's checkpoints: its folder, where it resumes, and the variables that say so.
  struct attempt_checkpoints {
    std::optional<checkpoint_folder> folder;
    std::vector<std::string> variables;  // KEY=VALUE, for the trial
    std::int64_t from = -1;              // the step it resumes from (-1: none)
  };
  struct standby_group_state {
    bool warm = false;
    std::unique_ptr<runner::standby_pool> pool;  // none without standby
    std::size_t planned = 0;                     // its workers in plan_standby
    std::size_t wanted = 0;                      // under mutex_
    bool started = false;                        // under mutex_: a trial has started on its GPU
  };
  void lane(std::size_t k);
  // The attempt's ticket (null where the admission knows none of its GPUs), or null with
  // `refused` set (it can never fit there), or null once the trial is stopped while it waits.
  std::shared_ptr<runner::admission::ticket> admit(std::size_t lane, const slot& sl, const trial& t, std::uint64_t cap,
                                                   std::string& refused, bool& stopped);
  trial_record attempt(const slot& sl, const trial& t, std::shared_ptr<const void> admitted);
  // @throws std::exception naming the folder where it cannot be used.
  attempt_checkpoints prepare_checkpoints(const trial& t, trial_record& rec) const;
  void run_worker(const slot& sl, const trial& t, trial_record& rec, int err, std::shared_ptr<const void> admitted,
                  const attempt_checkpoints& saved);
  std::shared_ptr<runner::job> start_job(const slot& sl, runner::job_spec spec);
  void run_command(const slot& sl, const trial& t, trial_record& rec, int err, attempt_checkpoints& saved);
  std::unique_ptr<runner::command> start_command(const slot& sl, const trial& t, trial_record& rec, int err,
                                                 const attempt_checkpoints& saved, unique_fd& log_in);
  void keep_timeline(const trial& t, trial_record& rec, const std::string& timeline);
  template <class Runs>
  auto await(const slot& sl, const trial& t, running_trial what, Runs& runs, trial_record& rec)
      -> decltype(runs.wait());
  // @throws usage_error for parameters the program refuses (a trial a source made).
  runner::job_spec trial_spec(const slot& sl, const nlohmann::json& params, std::uint64_t mem_limit) const;
  void make_standby_pools();
  // The first signal of a stop of the whole sweep: the checkpoint warning where trials keep
  // checkpoints (they then have the grace period to save), else SIGTERM.
  [[nodiscard]] int planned_stop_signal() const noexcept;

  local_setup setup_;
  trial_sink* sink_ = nullptr;
  runner::admission* admission_;
  std::shared_ptr<void> widened_;        // the admission's CPU slots, at least this sweep's
  std::map<int, std::size_t> slots_on_;  // the sweep's slots per GPU index
  log_follower follower_;                // workers' stdout logs; outlives the lanes, which end their followings
  std::optional<runner::gpu_packer> packer_;
  std::map<int, standby_group_state> groups_;  // by the slot's GPU (-1: CPU slots)
  std::vector<char> slot_started_;             // under mutex_
  std::mutex mutex_;
  std::condition_variable work_;
  std::deque<trial> pending_;
  std::vector<running_trial> running_;  // by lane
  std::set<std::size_t> stop_wanted_;   // trials stop() was called for
  bool cancelled_ = false, done_ = false;
  std::vector<std::thread> lanes_;
};

}  // namespace isorun::sweep
