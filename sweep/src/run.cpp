// Running a sweep: the constructor checks every input and locks the output folder; run() is a
// composition of the named parts: a backend where trials run (local slots or Slurm), the
// scheduler that decides what runs, one journal writer, the progress line and one stop source.
#include "isorun/sweep/run.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "early_stop.hpp"
#include "folder.hpp"
#include "isorun/alloc/config.hpp"
#include "isorun/runner/bounded_json.hpp"
#include "isorun/runner/errors.hpp"
#include "isorun/runner/gpu_packer.hpp"
#include "isorun/runner/job.hpp"
#include "isorun/runner/printable.hpp"
#include "isorun/runner/process.hpp"
#include "isorun/runner/suggest.hpp"
#include "isorun/runner/unique_fd.hpp"
#include "isorun/runner/units.hpp"
#include "isorun/runner/worker_env.hpp"
#include "isorun/sweep/html_report.hpp"
#include "isorun/sweep/journal_writer.hpp"
#include "isorun/sweep/pbt.hpp"
#include "isorun/sweep/remote_folder.hpp"
#include "isorun/sweep/report.hpp"
#include "isorun/sweep/report_log.hpp"
#include "isorun/sweep/scheduler.hpp"
#include "isorun/sweep/slurm.hpp"
#include "isorun/sweep/stop_rule.hpp"
#include "isorun/sweep/stop_source.hpp"
#include "isorun/sweep/trial_source.hpp"
#include "local_backend.hpp"
#include "progress.hpp"
#include "python_trials.hpp"
#include "searcher_source.hpp"
#include "slurm_backend.hpp"
#include "trial_program.hpp"

namespace isorun::sweep {

namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using clock = std::chrono::steady_clock;

// Which sweep a folder holds: the task or command, every trial id of the spec's, and the source
// of any others.
std::string fingerprint(const sweep_spec& s, const std::string& source) {
  const std::string what = subject(s);
  std::string all = what;
  for (const auto& t : s.trials) all += "\n" + trial_id(what, t);
  if (!source.empty()) all += "\nsource " + source;
  if (s.search) {  // which searcher, with what settings, chooses the trials
    const json objectives = [&] {
      json o = json::array();
      for (const auto& m : s.search.objectives) o.push_back({m.name, m.maximize});
      return o;
    }();
    all += "\nsearch " + json{{"type", s.search.type},          {"command", s.search.command},
                              {"sampler", s.search.sampler},    {"seed", s.search.seed ? json(*s.search.seed) : json()},
                              {"params", s.search.params},      {"objectives", objectives},
                              {"constants", s.search_constants}}
                             .dump();
  }
  return trial_id(what, json(all));
}

// Each trial's GPU count (spans_gpus(s)), checked: a whole number from 1 to the GPUs the sweep
// has. gpus_per_trial: "{name}" takes it from parameter `name`.
std::vector<std::size_t> gpus_per_trial(const sweep_spec& s, const std::vector<slot>& slots) {
  const std::size_t have = runner::gpu_packer(slots).gpus();
  const int line = s.gpus_per_trial_line;
  if (have == 0)
    throw located(s, line,
                  "gpus_per_trial needs GPUs, and the sweep has none; list them (resources: gpus: [0, 1], "
                  "or --gpus 0,1)");
  const std::string& name = s.gpus_per_trial_param;
  if (!name.empty() && !s.trials.empty() && !s.trials.front().contains(name)) {
    std::vector<std::string> names;
    for (const auto& [k, v] : s.trials.front().items()) names.push_back(k);
    throw located(s, line,
                  "gpus_per_trial takes parameter '" + name + "', which the sweep does not have" +
                      did_you_mean(name, names) + "; its parameters: " + name_list(names));
  }
  std::vector<std::size_t> counts;
  counts.reserve(s.trials.size());
  for (const auto& t : s.trials) {
    int k = s.gpus_per_trial;
    if (!name.empty()) {
      const json& v = t[name];
      if (!v.is_number_integer() || v.get<long long>() < 1 || v.get<long long>() > 1024)
        throw located(s, line,
                      "gpus_per_trial takes parameter '" + name + "', whose value " + v.dump() +
                          " is not a number of GPUs (1 or more)");
      k = v.get<int>();
    }
    if (static_cast<std::size_t>(k) > have)
      throw located(s, line,
                    "a trial asks for " + std::to_string(k) + " GPUs (gpus_per_trial), but the sweep has " +
                        std::to_string(have) + "; list more GPUs or ask for fewer");
    counts.push_back(static_cast<std::size_t>(k));
  }
  return counts;
}

// What out-of-memory retries need: a cap to grow, a max above it, and GPUs where a trial at the
// max fits (else a trial would wait for room that never comes). Not on Slurm: a node's records
// reach the journal only as each trial's end, so neither the attempts' caps nor a resume at the
// larger cap would hold there.
void check_oom_retry(const sweep_spec& s, const std::vector<slot>& slots, const std::vector<std::size_t>& gpu_counts) {
  const oom_retry_spec& r = s.oom_retry;
  const std::string what = (r.line ? "oom_retry" : "--oom-retry") + std::string(" (max ") + format_size(r.max) + ")";
  // At its spec line; the flag's errors name the flag, not the spec file.
  auto refused = [&](const std::string& why) { return r.line ? located(s, r.line, why) : spec_error(why, 0); };
  if (s.slurm)
    throw refused(what +
                  " runs on this machine only, not with backend: slurm; remove it, or run the sweep here "
                  "(backend: local)");
  if (!s.mem_limit) {
    // A cap the first retry can grow from: max / factor, as the spec would write it.
    std::string first = format_size(std::max<std::uint64_t>(1, static_cast<std::uint64_t>(r.max / r.factor)));
    first.erase(std::remove(first.begin(), first.end(), ' '), first.end());  // one word on a command line
    throw refused(what +
                  " retries a trial at a larger cap, and the sweep has no cap to start from; set one below max "
                  "(resources: mem_limit: " +
                  first + ", or --mem-limit " + first + ")");
  }
  if (r.max <= s.mem_limit)
    throw refused(what + ": max is not above mem_limit " + format_size(s.mem_limit) +
                  ", so no retry could have a larger cap; raise max");
  const auto memory = trial_memory(s, slots);
  if (memory.empty()) return;  // CPU slots: nothing to pack against
  std::size_t widest = 1, fit = 0;
  for (std::size_t k : gpu_counts) widest = std::max(widest, k);
  std::string room;
  for (const auto& [gpu, bytes] : memory) {
    fit += bytes >= r.max;
    room += (room.empty() ? "" : ", ") + ("GPU " + std::to_string(gpu) + ": " + format_size(bytes));
  }
  if (fit < widest)
    throw refused(what + ": a trial at the max needs " + format_size(r.max) + " on " + std::to_string(widest) + " GPU" +
                  (widest == 1 ? "" : "s") + ", more than the sweep's GPUs have for trials (" + room +
                  "; free memory less room for warm standby contexts); lower max");
}

}  // namespace

struct sweep_run::state {
  sweep_spec s;
  std::unique_ptr<trial_program> program;  // what the trials run
  std::string subject;                     // subject(s): what trial ids are derived from
  std::vector<slot> slots;
  sweep_options opt;
  fs::path out;
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

sweep_run::sweep_run(sweep_run&&) noexcept = default;
sweep_run& sweep_run::operator=(sweep_run&&) noexcept = default;
sweep_run::~sweep_run() = default;

std::size_t sweep_run::pending() const noexcept { return state_->queue.size(); }
const std::string& sweep_run::out() const noexcept { return state_->out_text; }
const std::vector<std::string>& sweep_run::warnings() const noexcept {
  static const std::vector<std::string> none;
  return state_->journal ? state_->journal->warnings() : none;
}

namespace {

// Early stopping, the metric, where the trials run and what they may take, checked.
void check_resources(sweep_run::state& st) {
  const sweep_spec& s = st.s;
  if (s.early_stopping) {
    // Early stopping: what it judges by, and trials that can report steps, known before anything starts.
    const int line = s.early_stopping.line;
    if (const std::string why = early_stopping_problem(s.early_stopping); !why.empty())
      throw located(s, line, "scheduler: " + why);
    if (s.metric.name.empty())
      throw located(s, line,
                    "scheduler: " + s.early_stopping.type +
                        " judges trials by a metric, and the sweep has none; add "
                        "metric: {name: loss, goal: minimize} (or --metric loss:min)");
  }
  if (const auto shape = s.metric.name.empty() ? std::nullopt : st.program->result_shape()) {
    if (auto problem = metric_problem(s, *shape, "task '" + s.task + "'"); !problem.empty())
      throw located(s, s.metric.line, problem);
    st.metric_known = true;
  }
  const bool submitter = s.slurm && st.opt.node.empty();  // its slots are on the nodes
  if (spans_gpus(s) && !submitter) st.gpu_counts = gpus_per_trial(s, st.slots);
  if (s.oom_retry) check_oom_retry(s, st.slots, st.gpu_counts);
  // Where the trials run, a cgroup must enforce the host cap (the submitter's machine is not theirs).
  if (s.host_mem_limit && !submitter) runner::check_host_mem_limit(s.host_mem_limit);
  try {
    st.timelines = st.program->uses_isorun_allocator() && alloc::alloc_config::parse(s.alloc_conf).history > 0;
  } catch (const alloc::config_error&) {
  }  // (check_job_spec below says what is wrong with it)
  for (const auto& sl : st.slots) {
    runner::job_spec probe;
    probe.gpus = sl.gpus;
    probe.mem_limit = s.mem_limit;
    probe.alloc_conf = s.alloc_conf;
    runner::check_job_spec(probe);
  }
}

// The output folder and its logs folder, created (or found).
void open_out(sweep_run::state& st) {
  const sweep_spec& s = st.s;
  st.out = s.out.empty() ? fs::path("isorun-sweep-" + st.program->short_name()) : fs::path(s.out);
  st.out_text = st.out.string();
  std::error_code ec;
  fs::create_directories(st.out / "logs", ec);
  if (ec) throw internal_error("cannot create " + (st.out / "logs").string() + ": " + ec.message());
  const unique_fd out_dir = detail::open_folder(st.out);
  if (!out_dir) throw internal_error("cannot open " + st.out_text + ": not a folder");
  st.logs = detail::open_subfolder(out_dir.get(), "logs", true, st.out / "logs");
  if (s.checkpoints) {  // refused now, before anything starts, if it cannot hold them
    const unique_fd checkpoints = detail::open_subfolder(out_dir.get(), "checkpoints", true, st.out / "checkpoints");
    // Tried, not asked (access() says yes to root whatever the folder's attributes).
    const std::string probe = ".probe-" + std::to_string(::getpid());
    if (::mkdirat(checkpoints.get(), probe.c_str(), 0700) != 0)
      throw usage_error("the checkpoint folder " + (st.out / "checkpoints").string() + " is not writable (" +
                        std::strerror(errno) + "): the trials' checkpoints could not be saved; fix its permissions");
    ::unlinkat(checkpoints.get(), probe.c_str(), AT_REMOVEDIR);
  }
}

// Trial `i` of the run: one a source made, or the spec's.
new_trial trial_at(const sweep_run::state& st, std::size_t i) {
  if (const auto it = st.made.find(i); it != st.made.end()) return it->second;
  return {i, trial_id(st.subject, st.s.trials[i]), st.s.trials[i]};
}

// The trials this run owes as an array task of a Slurm submission (the submitter holds the folder
// and its journal): its listed trials whose records are not already waiting to be journaled. A
// trial a source made comes with its id and parameters in the submission file.
void queue_node_trials(sweep_run::state& st) {
  const sweep_spec& s = st.s;
  const slurm::assignment a = slurm::node_trials(st.opt.node);
  for (std::size_t i : a.trials) {
    if (const auto made = a.made.find(i); made != a.made.end())
      st.made[i] = {i, made->second.id, made->second.params, made->second.origin};
    else if (i >= s.trials.size())
      throw usage_error("--node " + st.opt.node + " lists trial " + std::to_string(i) + ", but the sweep has " +
                        std::to_string(s.trials.size()));
    if (!remote_folder(st.out, "slurm").has_record(trial_at(st, i).id)) st.queue.push_back(i);
  }
}

// Whether a journaled trial is done: it ended (a pruned trial too: early stopping decided, and a
// rerun would be decided again), and not as a failure to run again (rerun_failed). An attempt
// retried at a larger cap is not an end: the trial goes on at that cap.
bool is_done(const sweep_run::state& st, const trial_record& r) {
  return final_record(r) && (done_well(r) || !st.opt.rerun_failed);
}

// The trials this run owes here: those the journal has no final record of (or whose last
// attempt failed, with --rerun-failed), once each; sweep.json written or checked first.
void queue_trials(sweep_run::state& st) {
  const sweep_spec& s = st.s;
  st.lock.emplace(st.out, st.opt.wait_for_lock);

  const json identity = {
      {"task", st.subject}, {"trials", s.trials.size()}, {"fingerprint", fingerprint(s, st.opt.source_name)}};
  if (fs::exists(st.out / "sweep.json")) {
    std::ifstream in(st.out / "sweep.json");
    json old = parse_bounded_json(in);
    if (old.is_discarded() || old.value("fingerprint", "") != identity["fingerprint"])
      throw usage_error("output folder " + st.out_text + " holds a different sweep (task " +
                        (old.is_discarded() ? std::string("?") : old.value("task", "?")) + ", " +
                        (old.is_discarded() ? std::string("?") : std::to_string(old.value("trials", 0))) +
                        " trials); choose another --out, or remove it");
  } else {
    write_file_durably(st.out / "sweep.json", identity.dump(2) + "\n");
  }

  st.journal.emplace(st.out);
  st.reports.emplace(st.out);
  for (const auto& [id, r] : st.journal->latest()) {
    // An attempt that ran out of memory and was to run again at a larger cap: the trial goes on
    // at it, whichever source gives it again. (A spec changed since, with a lower max or a higher
    // mem_limit, bounds the cap it resumes at.)
    if (const std::uint64_t cap = s.oom_retry && !is_done(st, r) ? std::min(r.retry_mem_limit, s.oom_retry.max) : 0;
        cap > s.mem_limit)
      st.resumed[id] = {.id = id, .attempt = r.attempts + 1, .mem_limit = cap, .oom_retries = r.attempts};
  }
  if (s.search) {  // its searcher gives the trials (make_source); the spec's one is a sample
    for (const auto& [id, r] : st.journal->latest()) st.skipped += is_done(st, r);
    return;
  }
  std::set<std::string> queued;
  for (std::size_t i = 0; i < s.trials.size(); ++i) {
    const std::string id = trial_id(st.subject, s.trials[i]);
    auto it = st.journal->latest().find(id);
    const bool known = it != st.journal->latest().end();
    const bool done = known && is_done(st, it->second);
    if (done || !queued.insert(id).second) {
      ++st.skipped;
      continue;
    }
    st.queue.push_back(i);
  }
}

}  // namespace

sweep_run::sweep_run(const sweep_spec& sp, std::vector<slot> slots, sweep_options options)
    : state_{std::make_unique<state>()} {
  state& st = *state_;
  st.s = sp;
  st.slots = std::move(slots);
  st.opt = std::move(options);
  st.program = program_of(st.s);
  st.subject = st.program->subject();
  if (st.slots.empty()) throw usage_error("a sweep needs at least one slot");
  if (st.opt.source && st.s.slurm)
    throw usage_error(
        "a sweep whose trials come from a source of their own runs here; Slurm arrays are submitted "
        "for the spec's list of trials (drop backend: slurm)");
  // Everything is checked before anything is created or started: what the trials run, and
  // whether each of the spec's trials fits it.
  if (st.s.search && st.s.slurm && st.s.slurm->max_running < 1)
    throw located(st.s, st.s.search.line,
                  "search: on Slurm needs resources: max_running: N, the array tasks that run at once (its searcher "
                  "chooses each trial from the results of those before, so they are submitted as slots come free)");
  if (st.s.search && st.opt.source) throw usage_error("a sweep with search: takes its trials from its searcher alone");
  if (st.s.pbt && st.opt.source) throw usage_error("a sweep with scheduler pbt takes its trials from its population");
  st.program->check();
  if (st.opt.node.empty()) check_searcher(st.s);  // (an array task runs the trials it is given)
  check_resources(st);
  open_out(st);
  if (st.opt.node.empty()) queue_trials(st);
  else queue_node_trials(st);
}

namespace {

// Adds this run to sweep.json: what the report says about where and how the trials ran.
// Returns what sweep.json then holds (not written on a Slurm node: that is not a run).
json record_run(const sweep_run::state& st, bool node);

// Where the trials of `st` run: Slurm job arrays for a submitter, slots here otherwise (a Slurm
// array task's share of the trials too).
std::unique_ptr<trial_backend> make_backend(const sweep_run::state& st, int run, clock::time_point run_start);

// After a run that was neither a node's nor detached: the records in spec order, results.csv,
// this run's wall time in sweep.json, and the report.
void tabulate(const sweep_run::state& st, json& identity, clock::time_point run_start, sweep_summary& summary);

}  // namespace

namespace {

// What a resumed sweep's early stopping replays: the reports of this sweep's trials that are
// done, up to the step each record says it reached (a trial run again reports afresh). With
// checkpoints, those of the trials not done too: they go on from a checkpoint rather than afresh,
// and each step is counted once, the first time it was reported (early_stopper).
std::map<std::string, std::int64_t> replayed_reports(const sweep_run::state& st) {
  std::map<std::string, std::int64_t> replayed;
  if (!st.journal) return replayed;
  constexpr std::int64_t every = std::numeric_limits<std::int64_t>::max();
  if (st.s.checkpoints) {
    for (const auto& t : st.s.trials) replayed[trial_id(st.subject, t)] = every;
    for (const auto& [id, r] : st.journal->latest()) replayed[id] = every;
  }
  // Every report: trials a source or a searcher made that never got a record too (and PBT's
  // children, made by the replay itself); a done trial's up to the step its record says.
  if (st.s.checkpoints && st.reports)
    for (const auto& r : st.reports->earlier()) replayed.try_emplace(r.trial, every);
  for (const auto& [id, r] : st.journal->latest())
    if (is_done(st, r)) replayed[id] = r.step;
  return replayed;
}

// A trial source that leaves out trials the journal holds as done: the sweep's own source, told
// every journaled record first (in journal order), may give them again.
class resumed_source final : public trial_source {
 public:
  resumed_source(std::unique_ptr<trial_source> inner, std::set<std::string> done)
      : inner_{std::move(inner)}, done_{std::move(done)} {}
  std::optional<new_trial> next() override {
    while (std::optional<new_trial> t = inner_->next())
      if (!done_.count(t->id)) return t;
    return std::nullopt;
  }
  [[nodiscard]] bool exhausted() const override { return inner_->exhausted(); }
  void tell(const trial_record& record) override { inner_->tell(record); }
  [[nodiscard]] bool busy() const override { return inner_->busy(); }
  void on_ready(const std::function<void()>& wake) override { inner_->on_ready(wake); }

 private:
  std::unique_ptr<trial_source> inner_;
  std::set<std::string> done_;
};

// Where the scheduler takes its trials from: the spec's trials still to run, given out by the
// sweep's own source where it has one (which is first told every journaled record); `lanes`
// trials run at once.
std::unique_ptr<trial_source> make_source(const sweep_run::state& st, pbt_population* pbt, std::size_t lanes) {
  std::vector<new_trial> listed;
  listed.reserve(st.queue.size());
  for (std::size_t i : st.queue) listed.push_back(trial_at(st, i));
  auto list = std::make_unique<list_source>(std::move(listed));
  // (An array task runs the trials it was given: its submitter's source chose them.)
  if ((!st.opt.source && !st.s.search && !pbt) || !st.opt.node.empty()) return list;
  std::unique_ptr<trial_source> source;
  if (pbt) source = pbt->source(std::move(list));
  else if (st.s.search)
    source = std::make_unique<searcher_source>(searcher_setup{.spec = &st.s,
                                                              .subject = st.subject,
                                                              .out = st.out,
                                                              .argv = searcher_command(st.s),
                                                              .slots = lanes,
                                                              .first_index = st.s.trials.size()});
  else source = st.opt.source(std::move(list));
  if (!source) throw internal_error("the sweep's trial source factory made no source");
  std::set<std::string> done;
  for (const auto& id : st.journal->order()) {
    const trial_record& r = st.journal->latest().at(id);
    if (!final_record(r)) continue;  // an attempt to go on at a larger cap: not an end
    if (is_done(st, r)) done.insert(id);
    source->tell(r);
  }
  return std::make_unique<resumed_source>(std::move(source), std::move(done));
}

// On a Slurm node: the submitter's verdicts, OUT/slurm/stop/ID, each stopping that trial alone
// as pruned. Looked for every 100 ms (a shared file system need not tell another node of a new
// file), until destroyed.
class verdict_watch {
 public:
  verdict_watch(const sweep_run::state& st, scheduler& sched) : thread_{[this, &st, &sched] { watch(st, sched); }} {}
  verdict_watch(const verdict_watch&) = delete;
  verdict_watch& operator=(const verdict_watch&) = delete;
  ~verdict_watch() {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }

 private:
  void watch(const sweep_run::state& st, scheduler& sched) {
    const remote_folder folder(st.out, "slurm");
    std::set<std::size_t> stopped;
    for (;;) {
      {
        std::unique_lock lock(mutex_);
        if (wake_.wait_for(lock, std::chrono::milliseconds(100), [&] { return done_; })) return;
      }
      for (std::size_t i : st.queue) {
        const std::string id = trial_at(st, i).id;
        if (!stopped.count(i) && folder.stop_requested(id)) {
          stopped.insert(i);
          sched.prune({i, id, 1});
        }
      }
    }
  }
  std::mutex mutex_;
  std::condition_variable wake_;
  bool done_ = false;
  std::thread thread_;
};

// After the scheduler's run: what stopped the sweep, thrown; what it counted, in the summary.
void conclude(const sweep_run::state& st, const scheduler& sched, const stop_source& stop, progress& live,
              sweep_summary& summary) {
  if (const auto error = sched.error()) std::rethrow_exception(error);
  live.end();
  if (const auto problem = sched.metric_error(); !problem.empty())
    throw located(st.s, st.s.metric.line, problem + "; the sweep was stopped");
  summary.cancelled = sched.cancelled();
  summary.interrupted = stop.requests() > 0;
}

}  // namespace

sweep_summary sweep_run::run() {
  state& st = *state_;
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

  std::unique_ptr<record_store> store;
  const remote_folder shared(st.out, "slurm");  // a node's records, reports and verdicts
  if (node) store = shared.records_store();
  else store = std::make_unique<journal_store>(*st.journal, st.reports ? &*st.reports : nullptr);
  progress live(s, st.opt.progress, st.queue.size(), st.slots.size());
  std::unique_ptr<trial_backend> backend = make_backend(st, run_number, run_start);
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
  // Every report is made durable; with a scheduler, also judged (a node has no folder of its own).
  std::optional<early_stopper> stopper;
  // Population-based training: its decisions are made on reports, its children given out as trials.
  std::optional<pbt_population> pbt;
  if (s.pbt && !node) pbt.emplace(s, st.out, st.subject);
  if (st.reports) stopper.emplace(s, *st.reports, replayed_reports(st), pbt ? pbt->rule() : nullptr);
  // On a Slurm node with early stopping, the submitter decides: each report goes to it through
  // OUT/slurm/reports/ID.jsonl, and its verdicts come back as OUT/slurm/stop/ID (watched below).
  const bool forwards = node && (s.early_stopping || s.pbt);
  std::function<bool(const trial&, std::int64_t, const json&)> should_stop;
  if (stopper)
    should_stop = [&](const trial& t, std::int64_t step, const json& metrics) {
      return stopper->judge(t.id, step, metrics);
    };
  else if (forwards)
    should_stop = [&](const trial& t, std::int64_t step, const json& metrics) {
      shared.report(t.id, step, metrics);
      return false;
    };
  const std::unique_ptr<trial_source> source = make_source(st, pbt ? &*pbt : nullptr, backend->lanes());
  scheduler sched(s, *source, *backend, writer, stop,
                  {.metric_checked = st.metric_known,
                   .stop_fails_as_cancelled = node,
                   .journal_preempted = !node,
                   .should_stop = std::move(should_stop),
                   .resumed = st.resumed,
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

  const bool detach = st.opt.detach && s.slurm && !node;
  std::optional<verdict_watch> verdicts;  // a node's trials stopped by the submitter
  if (forwards) verdicts.emplace(st, sched);
  sched.run(detach);
  verdicts.reset();
  if (detach) {
    summary.detached = true;
    summary.jobs = backend->jobs();
  }
  stop.close();
  writer.close();
  try {  // the reports of trials that ended without a record (Ctrl-C): durable too, for a resume
    if (st.reports) st.reports->sync();
  } catch (...) {
    if (!sched.error()) throw;  // (an earlier error is the one to tell)
  }
  conclude(st, sched, stop, live, summary);
  if (node || summary.detached) return summary;  // the submitter journals and tabulates
  tabulate(st, identity, run_start, summary);
  return summary;
}

namespace {

json record_run(const sweep_run::state& st, bool node) {
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

std::unique_ptr<trial_backend> make_backend(const sweep_run::state& st, int run, clock::time_point run_start) {
  const sweep_spec& s = st.s;
  if (s.slurm && st.opt.node.empty()) {
    std::set<std::string> journaled;
    for (const auto& [id, r] : st.journal->latest())
      if (is_done(st, r)) journaled.insert(id);  // (a failure to run again with --rerun-failed is not)
    return std::make_unique<slurm_backend>(slurm_setup{.spec = &s,
                                                       .options = &st.opt,
                                                       .subject = st.subject,
                                                       .out = st.out,
                                                       .queue = st.queue,
                                                       .journaled = std::move(journaled),
                                                       .job_name = "isorun-" + st.program->short_name()});
  }
  return std::make_unique<local_backend>(
      local_setup{.spec = &s,
                  .program = st.program.get(),
                  .options = &st.opt,
                  .slots = st.slots,
                  .out = st.out,
                  .logs = st.logs.get(),
                  .timelines = st.timelines,
                  .run = run,
                  .run_start = run_start,
                  // (A sweep whose source makes every trial still makes its workers like the spec's.)
                  .first = !st.queue.empty()  ? std::optional<json>(trial_at(st, st.queue.front()).params)
                           : s.trials.empty() ? std::nullopt
                                              : std::optional<json>(s.trials.front())});
}

void tabulate(const sweep_run::state& st, json& identity, clock::time_point run_start, sweep_summary& summary) {
  const fs::path& out = st.out;
  if (st.s.slurm) {  // the array tasks' records that are now durable in the journal
    const remote_folder shared(out, "slurm");
    for (const auto& found : shared.records())
      if (st.journal->latest().count(found.record.id)) shared.remove_record(found.file);
  }
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
