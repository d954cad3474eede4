#pragma once
// Population-based training (Jaderberg et al. 2017), as a sweep runs it: the spec's trials are
// the first population. Once every member running (it has reported) has reported a step that is a
// multiple of the interval, they are ranked by their metric there, and each member in the bottom
// quantile is stopped at its next report (journaled as pruned; one that has ended is left alone)
// and replaced by a new trial, a child of a member drawn from the top quantile. A member that
// reaches the step after its decision (it started later: a population larger than the slots
// runs in turns) is ranked there on arrival, among every member's value at the step, and
// replaced where it falls in the bottom quantile. A child is: the parent's
// parameters mutated (perturbed x 0.8 or x 1.2, or drawn afresh), and the parent's latest
// committed checkpoint copied into the child's checkpoint folder, which the child's first attempt
// then resumes from. The child's record carries its lineage ("origin": parent, the member it
// replaced, the parent's step, its generation).
//
// The copies are made on a thread of the population's, one at a time, in the order the children
// were made (checkpoint_copy.hpp: holes kept, bounded), never under its lock: while a parent's
// checkpoint is copied, reports are judged and the sweep's other trials given out. A child is
// given out once its copy is done (it resumes from it), the children in the order they were
// made; the sweep waits for a copy under way as for a searcher thinking (trial_source::busy()).
//
// The decisions are made in report order with a seeded generator and nothing else, so a resumed
// sweep, which replays every report it journaled (early_stop.hpp), makes them again: the same
// children, with the same ids and parameters; a child's checkpoint is copied once.

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "isorun/sweep/spec.hpp"
#include "isorun/sweep/stop_rule.hpp"
#include "isorun/sweep/trial_source.hpp"

namespace isorun::sweep {

class pbt_population {
 public:
  /// How a parent's checkpoint is copied into its child's staging folder: copy_checkpoint
  /// (checkpoint_copy.hpp); a test's may hold a copy up. `stop` turns true when the population
  /// is destroyed.
  using copy_fn = std::function<void(const std::filesystem::path& from, const std::filesystem::path& to,
                                     const std::atomic<bool>& stop)>;

  /// @param out the sweep's folder (its checkpoints); `subject` makes the children's ids
  pbt_population(const sweep_spec& s, std::filesystem::path out, std::string subject, copy_fn copy = {});
  /// Stops a copy under way (its child is not given out) and waits for the copying thread.
  ~pbt_population();
  pbt_population(const pbt_population&) = delete;
  pbt_population& operator=(const pbt_population&) = delete;

  /// @brief A member's report: true if it is to stop now (it was replaced).
  bool report(const std::string& id, std::int64_t step, double value);

  /// @brief The rule the sweep's early stopping judges reports by: report() of this population
  ///        (which outlives it).
  std::unique_ptr<stop_rule> rule();

  /// @brief The sweep's trial source: the spec's trials still to run (those not replaced), then
  ///        each child as it is made. This population outlives it.
  std::unique_ptr<trial_source> source(std::unique_ptr<list_source> listed);

 private:
  struct member {
    std::string id;
    nlohmann::json params;
    int generation = 0;
    std::map<std::int64_t, double> at;  // its value at each decision step it reported (lower is better)
    std::int64_t first_step = 0;        // it reports the steps after this (a child: its parent's checkpoint's)
    bool reported = false;              // it has reported a step: it runs (or ran), and decisions wait for it
    bool ended = false;                 // its final record came
  };
  // A child not given out yet.
  struct newborn {
    new_trial trial;     // its origin's step: the checkpoint it starts from, as planned until copied
    std::string parent;  // whose checkpoint it gets
    bool copying;        // its parent's checkpoint is still to be copied (by copier_)
  };
  friend class pbt_source;
  void ended(const std::string& id);
  void decide_ready();                                     // under mutex_
  void decide(std::int64_t step);                          // under mutex_
  void decide_late(std::size_t place, std::int64_t step);  // under mutex_
  // Under mutex_: the members with a value at `step`, best first (ties in an order drawn now),
  // and k, the size of the top and bottom quantiles of them.
  std::pair<std::vector<std::size_t>, std::size_t> ranking(std::int64_t step);
  void replace(std::size_t place, const member& parent);           // under mutex_: by a child of `parent`
  newborn child_of(const member& parent, const member& replaced);  // under mutex_
  nlohmann::json mutate(const nlohmann::json& params);
  // Under mutex_: the step the child will start from, as the folders say now: the checkpoint
  // its own folder holds (copied by an earlier run of the sweep), else its parent's latest, to
  // be copied (`copy`); -1: none, it starts afresh.
  std::int64_t plan_hand_down(const std::string& parent, const std::string& child, bool& copy) const;
  // No lock held: the parent's latest checkpoint, copied into the child's folder; its step (-1:
  // none copied, the child starts afresh; the sweep is told why).
  std::int64_t hand_down(const std::string& parent, const std::string& child) const;
  void copy_children();  // copier_: the newborns' copies, in order
  void on_ready(const std::function<void()>& wake);
  void wake();

  const sweep_spec& s_;
  std::filesystem::path out_;
  std::string subject_;
  copy_fn copy_;
  std::vector<member> members_;               // the population now, by place
  std::map<std::string, std::size_t> place_;  // a member's id -> its place
  // Reports come on the scheduler's report path, trials are taken on its loop, copies end on
  // copier_: one lock for all three, never held during a copy.
  mutable std::mutex mutex_;
  std::set<std::string> replaced_;  // members replaced by a child
  std::set<std::string> doomed_;    // of them, those to stop at their next report
  std::set<std::int64_t> decided_;  // the decision steps done
  std::deque<newborn> born_;        // children not given out yet, in the order made
  std::size_t next_index_;
  std::mt19937_64 random_;
  std::condition_variable copy_queued_;  // a newborn to copy for, or quit_
  std::atomic<bool> quit_{false};        // set under mutex_: the population is going (stops a copy)
  std::mutex wake_mutex_;                // held while the wake is called: a scheduler clears it before it goes
  std::function<void()> wake_;
  std::thread copier_;  // last: started once everything above is
};

}  // namespace isorun::sweep
