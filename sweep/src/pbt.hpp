#pragma once
// Population-based training (Jaderberg et al. 2017), as a sweep runs it: the spec's trials are
// the first population. Once every member still running has reported a step that is a multiple
// of the interval, they are ranked by their metric there, and each member in the bottom quantile
// is stopped at its next report (journaled as pruned; one that has ended is left alone) and
// replaced by a new trial, a child of a member drawn from the top quantile: the parent's
// parameters mutated (perturbed x 0.8 or x 1.2, or drawn afresh), and the parent's latest
// committed checkpoint copied into the child's checkpoint folder, which the child's first attempt
// then resumes from. The child's record carries its lineage ("origin": parent, the member it
// replaced, the parent's step, its generation).
//
// The decisions are made in report order with a seeded generator and nothing else, so a resumed
// sweep, which replays every report it journaled (early_stop.hpp), makes them again: the same
// children, with the same ids and parameters; a child's checkpoint is copied once.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "isorun/sweep/spec.hpp"
#include "isorun/sweep/stop_rule.hpp"
#include "isorun/sweep/trial_source.hpp"

namespace isorun::sweep {

class pbt_population {
 public:
  /// @param out the sweep's folder (its checkpoints); `subject` makes the children's ids
  pbt_population(const sweep_spec& s, std::filesystem::path out, std::string subject);

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
    bool ended = false;                 // its final record came
  };
  friend class pbt_source;
  void ended(const std::string& id);
  void decide_ready();             // under mutex_
  void decide(std::int64_t step);  // under mutex_
  new_trial child_of(const member& parent, const member& replaced);
  nlohmann::json mutate(const nlohmann::json& params);
  // The parent's latest checkpoint, copied into the child's folder once; its step (-1: none).
  std::int64_t hand_down(const std::string& parent, const std::string& child) const;

  const sweep_spec& s_;
  std::filesystem::path out_;
  std::string subject_;
  std::vector<member> members_;               // the population now, by place
  std::map<std::string, std::size_t> place_;  // a member's id -> its place
  // Reports come on the scheduler's report path, trials are taken on its loop: one lock for both.
  mutable std::mutex mutex_;
  std::set<std::string> replaced_;            // members replaced by a child
  std::set<std::string> doomed_;              // of them, those to stop at their next report
  std::set<std::int64_t> decided_;            // the decision steps done
  std::deque<new_trial> born_;                // children not given out yet
  std::size_t next_index_;
  std::mt19937_64 random_;
};

}  // namespace isorun::sweep
