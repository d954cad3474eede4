#pragma once
// What the parts of a sweep_run share: its checked inputs, its output folder and journal, and
// the trials it owes. The parts: run_checks.cpp (every input checked, the folder opened),
// resume.cpp (what the journal says is left, and where trials come from), node_session.cpp (a
// Slurm array task's role) and run.cpp (their composition).

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/folder.hpp"
#include "isorun/sweep/journal.hpp"
#include "isorun/sweep/report_log.hpp"
#include "isorun/sweep/sweep_options.hpp"
#include "isorun/sweep/trial_backend.hpp"
#include "isorun/sweep/trial_source.hpp"
#include "trials/trial_program.hpp"

namespace isorun::sweep {

class pbt_population;

struct run_state {
  sweep_spec s;
  std::unique_ptr<trial_program> program;  // what the trials run
  std::string subject;                     // subject(s): what trial ids are derived from
  std::vector<slot> slots;
  sweep_options opt;
  std::filesystem::path out;
  std::string out_text;
  unique_fd logs;  // OUT/logs, where each trial's files are created by name
  std::optional<folder_lock> lock;
  std::optional<sweep::journal> journal;
  std::optional<report_log> reports;  // OUT/reports.jsonl (not on a Slurm node)
  std::vector<std::size_t> queue;     // the trials to run, by index (into s.trials, or of made)
  // On a Slurm node: the trials of its array task that a source made (a searcher's), by index.
  std::map<std::size_t, new_trial> made;
  std::map<std::string, trial> resumed;  // trials to start again at a larger cap (scheduler_options::resumed)
  std::vector<std::size_t> gpu_counts;   // spans_gpus(s): each trial's GPUs (by s.trials index)
  bool timelines = false;                // the allocator keeps a history: each trial's memory timeline is kept
  std::size_t skipped = 0;
  bool metric_known = false;  // checked against the result type up front
  bool ran = false;
};

// Trial `i` of the run: one a source made, or the spec's.
inline new_trial trial_at(const run_state& st, std::size_t i) {
  if (const auto it = st.made.find(i); it != st.made.end()) return it->second;
  return {i, trial_id(st.subject, st.s.trials[i]), st.s.trials[i]};
}

// Whether a journaled trial is done: it ended (a pruned trial too: early stopping decided, and a
// rerun would be decided again), and not as a failure to run again (rerun_failed). An attempt
// retried at a larger cap is not an end: the trial goes on at that cap.
inline bool is_done(const run_state& st, const trial_record& r) {
  return final_record(r) && (done_well(r) || !st.opt.rerun_failed);
}

// Early stopping, the metric, where the trials run and what they may take, checked
// (run_checks.cpp).
void check_resources(run_state& st);

// The output folder and its logs folder, created (or found); refused before anything starts if
// it cannot hold the trials' checkpoints (run_checks.cpp).
void open_out(run_state& st);

// The trials this run owes here: those the journal has no final record of (or whose last
// attempt failed, with --rerun-failed), once each; sweep.json written or checked first (resume.cpp).
void queue_trials(run_state& st);

// What a resumed sweep's early stopping replays: trial id -> the step up to which its reports
// are replayed (resume.cpp).
std::map<std::string, std::int64_t> replayed_reports(const run_state& st);

// Where the scheduler takes its trials from: the spec's trials still to run, given out by the
// sweep's own source where it has one (which is first told every journaled record); `lanes`
// trials run at once (resume.cpp).
std::unique_ptr<trial_source> make_source(const run_state& st, pbt_population* pbt, std::size_t lanes);

}  // namespace isorun::sweep
