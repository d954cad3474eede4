#pragma once
// A sweep run as array task K of a Slurm submission (`--node FILE:K`): the submitter holds the
// folder and its journal, so a node runs the trials listed for it on its own slots and talks to
// the submitter through OUT/slurm/ (remote_folder.hpp): its records go there to be journaled,
// its reports and checkpoints go there where the submitter judges them (early stopping, PBT) or
// its trackers want them, and the submitter's verdicts come back from there.

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/run_state.hpp"
#include "isorun/sweep/remote_folder.hpp"

namespace isorun::sweep {

class scheduler;

class node_session {
 public:
  explicit node_session(const run_state& st);
  ~node_session();
  node_session(const node_session&) = delete;
  node_session& operator=(const node_session&) = delete;

  // The trials this node owes: its listed trials whose records are not already waiting to be
  // journaled. A trial a source made comes with its id and parameters in the submission file.
  static void queue_trials(run_state& st);

  // Where its records go: OUT/slurm/results/, for the submitter to journal.
  [[nodiscard]] std::unique_ptr<record_store> records() const;

  // Whether the submitter wants its trials' reports: it decides on them (early stopping, PBT) or
  // its trackers are given them. Then each report goes to it through OUT/slurm/reports/ID.jsonl
  // (report_forwarder), each committed checkpoint too (checkpoint_forwarder), and its verdicts
  // come back as OUT/slurm/stop/ID (watch_verdicts).
  [[nodiscard]] bool forwards() const noexcept { return forwards_; }
  [[nodiscard]] std::function<bool(const trial&, std::int64_t, const nlohmann::json&)> report_forwarder() const;
  // Null where the node does not forward.
  [[nodiscard]] std::function<void(const trial&, std::int64_t)> checkpoint_forwarder() const;

  // While `sched` runs (until stop_watching or destruction): each verdict stops that trial
  // alone, as pruned. Nothing where the submitter does not judge the reports.
  void watch_verdicts(scheduler& sched);
  void stop_watching();

 private:
  class verdict_watch;
  void forward(const trial& t, const std::function<void()>& write) const;
  const run_state& st_;
  remote_folder shared_;
  bool judged_;    // early stopping or PBT: the submitter's verdicts come back
  bool forwards_;  // judged_, or trackers
  std::unique_ptr<verdict_watch> verdicts_;
  mutable std::mutex mutex_;
  mutable std::set<std::string> unforwarded_;  // trials whose lines were lost, said once each
};

}  // namespace isorun::sweep
