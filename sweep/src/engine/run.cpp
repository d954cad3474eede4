// Running a sweep: the constructor checks every input and locks the output folder; run() is a
// composition of the named parts: a backend where trials run (local slots or Slurm), the
// scheduler that decides what runs, one journal writer, the progress line and one stop source.
#include "isorun/sweep/run.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <utility>

#include "backends/backends.hpp"
#include "backends/node_session.hpp"
#include "engine/progress.hpp"
#include "engine/run_state.hpp"
#include "isorun/runner/bounded_json.hpp"
#include "isorun/runner/errors.hpp"
#include "isorun/runner/printable.hpp"
#include "isorun/runner/worker_env.hpp"
#include "isorun/sweep/html_report.hpp"
#include "isorun/sweep/journal_writer.hpp"
#include "isorun/sweep/pbt.hpp"
#include "isorun/sweep/report.hpp"
#include "isorun/sweep/report_log.hpp"
#include "isorun/sweep/scheduler.hpp"
#include "isorun/sweep/stop_source.hpp"
#include "search/early_stop.hpp"
#include "search/searcher_source.hpp"
#include "track/sinks.hpp"
#include "trials/trial_program.hpp"

namespace isorun::sweep {

namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using clock = std::chrono::steady_clock;

// Adds this run to sweep.json: what the report says about where and how the trials ran.
// Returns what sweep.json then holds (not written on a Slurm node: that is not a run).
json record_run(const run_state& st, bool node);

// The sweep as its trackers' first event has it, and as their last.
json tracked_sweep(const run_state& st, const json& identity);
json tracked_end(const run_state& st, const sweep_summary& summary);

// After a run that was neither a node's nor detached: the records in spec order, results.csv,
// this run's wall time in sweep.json, and the report.
void tabulate(const run_state& st, json& identity, clock::time_point run_start, sweep_summary& summary);

// What a running trial's reports meet. Where this process holds the sweep's folder, each is made
// durable and judged by early stopping (an early_stopper, which also feeds population-based
// training, whose children it gives out as trials); on a Slurm node that forwards them, the
// submitter judges. Not movable: the scheduler's hook refers to it.
class report_judge {
 public:
  report_judge(run_state& st, const node_session* node_role) {
    if (st.s.pbt && !node_role) pbt_.emplace(st.s, st.out, st.subject);
    if (st.reports) stopper_.emplace(st.s, *st.reports, replayed_reports(st), pbt_ ? pbt_->rule() : nullptr);
    else if (node_role && node_role->forwards()) forward_ = node_role->report_forwarder();
  }
  report_judge(const report_judge&) = delete;
  report_judge& operator=(const report_judge&) = delete;

  [[nodiscard]] pbt_population* population() { return pbt_ ? &*pbt_ : nullptr; }
  [[nodiscard]] std::function<bool(const trial&, std::int64_t, const json&)> should_stop() {
    if (!stopper_) return forward_;
    return
        [this](const trial& t, std::int64_t step, const json& metrics) { return stopper_->judge(t.id, step, metrics); };
  }

 private:
  std::optional<pbt_population> pbt_;
  std::optional<early_stopper> stopper_;
  std::function<bool(const trial&, std::int64_t, const json&)> forward_;
};

// After the scheduler's run: the reports made durable; what stopped the sweep, thrown; what it
// counted, in the summary.
void conclude(run_state& st, const scheduler& sched, const stop_source& stop, progress& live, sweep_summary& summary) {
  try {  // the reports of trials that ended without a record (Ctrl-C): durable too, for a resume
    if (st.reports) st.reports->sync();
  } catch (...) {
    if (!sched.error()) throw;  // (an earlier error is the one to tell)
  }
  if (const auto error = sched.error()) std::rethrow_exception(error);
  live.end();
  if (const auto problem = sched.metric_error(); !problem.empty())
    throw located(st.s, st.s.metric.line, problem + "; the sweep was stopped");
  summary.cancelled = sched.cancelled();
  summary.interrupted = stop.requests() > 0;
}

}  // namespace

sweep_run::sweep_run(sweep_run&&) noexcept = default;
sweep_run& sweep_run::operator=(sweep_run&&) noexcept = default;
sweep_run::~sweep_run() = default;

std::size_t sweep_run::pending() const noexcept { return state_->queue.size(); }
const std::string& sweep_run::out() const noexcept { return state_->out_text; }
const std::vector<std::string>& sweep_run::warnings() const noexcept {
  static const std::vector<std::string> none;
  return state_->journal ? state_->journal->warnings() : none;
}

sweep_run::sweep_run(const sweep_spec& sp, std::vector<slot> slots, sweep_options options)
    : state_{std::make_unique<run_state>()} {
  run_state& st = *state_;
  st.s = sp;
  st.slots = std::move(slots);
  st.opt = std::move(options);
  st.program = program_of(st.s);
  st.subject = st.program->subject();
  if (st.slots.empty()) throw usage_error("a sweep needs at least one slot");
  // Everything is checked before anything is created or started: what the backend can run, what
  // the trials run, and whether each of the spec's trials fits it.
  const backend_kind& backend = backend_of(st.s, st.opt);
  if (st.opt.source && !backend.traits.caller_sources)
    throw usage_error("a sweep whose trials come from a source of their own runs here; backend " +
                      std::string(backend.name) +
                      " runs the spec's list of trials (drop backend: " + std::string(backend.name) + ")");
  if (st.opt.detach && !backend.traits.detach)
    throw usage_error("--detach: backend " + std::string(backend.name) +
                      " runs its trials in this process, which cannot return before they end; backends that can: " +
                      backends_that(&backend_traits::detach));
  if (backend.check) backend.check(st.s);
  if (st.s.search && st.opt.source) throw usage_error("a sweep with search: takes its trials from its searcher alone");
  if (st.s.pbt && st.opt.source) throw usage_error("a sweep with scheduler pbt takes its trials from its population");
  st.program->check();
  if (st.opt.node.empty()) check_searcher(st.s);  // (an array task runs the trials it is given)
  check_resources(st);
  open_out(st);
  if (st.opt.node.empty()) queue_trials(st);
  else node_session::queue_trials(st);
}

namespace {
// For the trackers: each attempt's start and each checkpoint committed, a line in OUT/events.jsonl.
std::function<void(const trial&)> log_start(run_state& st) {
  return [&st](const trial& t) {
    if (st.reports) st.reports->append_start(t.id, t.attempt, t.params);
  };
}
std::function<void(const trial&, std::int64_t)> log_checkpoint(run_state& st) {
  return [&st](const trial& t, std::int64_t step) {
    if (st.reports) st.reports->append_checkpoint(t.id, t.attempt, step);
  };
}
}  // namespace

sweep_summary sweep_run::run() {
  run_state& st = *state_;
  if (st.ran) throw std::logic_error("sweep_run::run() called twice");
  st.ran = true;
  const sweep_spec& s = st.s;
  const bool node = !st.opt.node.empty();
  sweep_summary summary;
  summary.total = s.trials.size();
  summary.skipped = st.skipped;
  json identity = record_run(st, node);
  const int run_number = node ? 0 : static_cast<int>(identity["runs"].size());  // a node's slots and clock are its own
  const auto run_start = clock::now();

  std::optional<node_session> node_role;  // this process as an array task of a Slurm submission
  if (node) node_role.emplace(st);
  // The trackers follow the journal from here on (the submitter's, on a cluster).
  std::optional<track_sinks> trackers;
  if (!node && !s.track.empty()) trackers.emplace(s.track, st.out, tracked_sweep(st, identity));
  const std::unique_ptr<record_store> store = node_role ? node_role->records()
                                                        : std::make_unique<journal_store>(
                                                              *st.journal, st.reports ? &*st.reports : nullptr);
  progress live(s, st.opt.progress, st.queue.size(), st.slots.size());
  const backend_kind& kind = backend_of(s, st.opt);
  const std::unique_ptr<trial_backend> backend = kind.make(st, run_number, run_start);
  stop_source stop;
  scheduler* sched_ptr = nullptr;  // the writer reports a failure to it (set before anything is written)
  journal_writer writer(
      *store,
      [&](const trial_record& r) {
        if (!final_record(r)) return;  // an attempt retried at a larger cap: the trial goes on
        ++(r.kind == outcome_kind::success ? summary.succeeded : r.pruned ? summary.pruned : summary.failed);
        live.durable(r);
      },
      [&](std::exception_ptr e) { sched_ptr->fail(std::move(e)); });
  report_judge judge(st, node_role ? &*node_role : nullptr);
  const std::unique_ptr<trial_source> source = make_source(st, judge.population(), backend->lanes());
  scheduler sched(s, *source, *backend, writer, stop,
                  {.metric_checked = st.metric_known,
                   .stop_fails_as_cancelled = node,
                   .journal_preempted = !node,
                   .should_stop = judge.should_stop(),
                   .resumed = st.resumed,
                   .starting = log_start(st),
                   .checkpointed = node_role ? node_role->checkpoint_forwarder() : log_checkpoint(st),
                   .running_changed = [&](std::size_t n) { live.running(n); }});
  sched_ptr = &sched;
  struct closer {  // nothing calls into the scheduler once it is gone
    stop_source& stop;
    journal_writer& writer;
    ~closer() {
      stop.close();
      writer.close();
    }
  } close_all{stop, writer};
  stop.watch([&](int requests) {
    live.stopping(requests, sched.running(), st.opt.grace);
    sched.interrupt();
  });

  const bool detach = st.opt.detach && kind.traits.detach;
  if (node_role) node_role->watch_verdicts(sched);  // its trials stopped by the submitter
  sched.run(detach);
  if (node_role) node_role->stop_watching();
  if (detach) {
    summary.detached = true;
    summary.jobs = backend->jobs();
  }
  stop.close();
  writer.close();
  conclude(st, sched, stop, live, summary);
  if (node || summary.detached) return summary;  // the submitter journals and tabulates
  backend->journaled(*st.journal);
  tabulate(st, identity, run_start, summary);
  if (trackers) trackers->finish(tracked_end(st, summary));
  return summary;
}

namespace {

// What a tracker is told of the sweep as it starts: sweep.json's account (subject, metric,
// scheduler, runs) and the spec's parameters, each with the values its trials take (up to 32).
json tracked_sweep(const run_state& st, const json& identity) {
  json sweep = identity;
  json space = json::object();
  for (const auto& t : st.s.trials)
    for (const auto& [name, value] : t.items()) {
      json& values = space[name];
      if (values.is_null()) values = json::array();
      if (values.size() < 32 && std::find(values.begin(), values.end(), value) == values.end()) values.push_back(value);
    }
  sweep["params"] = space;
  sweep["trials"] = st.s.trials.size();
  sweep["out"] = st.out_text;
  return sweep;
}

json tracked_end(const run_state& st, const sweep_summary& summary) {
  return {{"succeeded", summary.succeeded},
          {"failed", summary.failed},
          {"pruned", summary.pruned},
          {"cancelled", summary.cancelled},
          {"interrupted", summary.interrupted},
          {"report", (st.out / "report.html").string()},
          {"results", (st.out / "results.csv").string()}};
}

json record_run(const run_state& st, bool node) {
  const sweep_spec& s = st.s;
  json identity;
  {
    std::ifstream in(st.out / "sweep.json");
    identity = parse_bounded_json(in);
    if (!identity.is_object()) identity = json::object();
  }
  if (!identity.contains("runs") || !identity["runs"].is_array()) identity["runs"] = json::array();
  const int run_number = static_cast<int>(identity["runs"].size()) + 1;
  json slot_list = json::array();
  for (const auto& sl : st.slots)
    slot_list.push_back(
        {{"index", sl.index}, {"device", sl.gpus.empty() ? "cpu" : runner::visible_devices_for(sl.gpus)}});
  identity["subject"] = st.subject;
  identity["metric"] = s.metric.name.empty() ? json() : json{{"name", s.metric.name}, {"maximize", s.metric.maximize}};
  if (s.search.objectives.size() > 1) {  // for the report's Pareto front
    identity["objectives"] = json::array();
    for (const auto& m : s.search.objectives)
      identity["objectives"].push_back({{"name", m.name}, {"maximize", m.maximize}});
  }
  identity["scheduler"] = early_stopping_json(s.early_stopping);  // for the report: the rungs and the budget
  identity["runs"].push_back({{"run", run_number},
                              {"slots", slot_list},
                              {"mem_limit", s.mem_limit},
                              {"gpus_per_trial", gpus_per_trial_text(s)},
                              {"trials", st.queue.size()}});
  if (!node) write_file_durably(st.out / "sweep.json", identity.dump(2) + "\n");
  return identity;
}

void tabulate(const run_state& st, json& identity, clock::time_point run_start, sweep_summary& summary) {
  const fs::path& out = st.out;
  // Results in spec order, then those of trials a source added, in journal order; then results.csv.
  const auto& latest = st.journal->latest();
  std::set<std::string> listed;
  for (const auto& t : st.s.trials) {
    auto it = latest.find(trial_id(st.subject, t));
    if (it != latest.end() && listed.insert(it->first).second) summary.records.push_back(it->second);
  }
  for (const auto& id : st.journal->order())
    if (listed.insert(id).second) summary.records.push_back(latest.at(id));
  for (const auto& r : summary.records) summary.steps += r.step > 0 ? static_cast<std::uint64_t>(r.step) : 0;
  write_file_durably(out / "results.csv", results_csv(summary.records));
  identity["runs"].back()["wall_s"] = std::chrono::duration<double>(clock::now() - run_start).count();
  write_file_durably(out / "sweep.json", identity.dump(2) + "\n");
  try {
    write_report(out);
    summary.report = (out / "report.html").string();
  } catch (const std::exception& e) {  // the results are safe; only the page is missing
    std::fprintf(stderr, "isorun: warning: no report: %s\n", printable(e.what()).c_str());
  }
}

}  // namespace

}  // namespace isorun::sweep
