// Resuming a sweep from its folder: which sweep the folder holds, which trials its journal
// already has as done, what early stopping replays, and the trial source that leaves the done
// ones out.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <utility>

#include "engine/folder.hpp"
#include "engine/run_state.hpp"
#include "isorun/runner/bounded_json.hpp"
#include "isorun/runner/errors.hpp"
#include "isorun/sweep/pbt.hpp"
#include "search/searcher_source.hpp"

namespace isorun::sweep {

namespace {
namespace fs = std::filesystem;
using nlohmann::json;

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

}  // namespace

void queue_trials(run_state& st) {
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
                        " trials); remove it, or " + std::string(detail::another_out));
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

// Replayed: the reports of this sweep's trials that are done, up to the step each record says
// it reached (a trial run again reports afresh). With checkpoints, those of the trials not done
// too: they go on from a checkpoint rather than afresh, and each step is counted once, the first
// time it was reported (early_stopper).
std::map<std::string, std::int64_t> replayed_reports(const run_state& st) {
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

std::unique_ptr<trial_source> make_source(const run_state& st, pbt_population* pbt, std::size_t lanes) {
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

}  // namespace isorun::sweep
