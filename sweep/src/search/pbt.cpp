// Population-based training (pbt.hpp).
#include "isorun/sweep/pbt.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <mutex>

#include "isorun/runner/printable.hpp"
#include "isorun/sweep/checkpoint_copy.hpp"
#include "isorun/sweep/journal.hpp"
#include "isorun/worker/checkpoint.hpp"

namespace isorun::sweep {

namespace {
namespace fs = std::filesystem;
using nlohmann::json;

// The population's rule, for the early stopper: its decisions are the population's.
class pbt_rule final : public stop_rule {
 public:
  explicit pbt_rule(pbt_population& p) : p_{p} {}
  bool report(const std::string& id, std::int64_t step, double value) override { return p_.report(id, step, value); }

 private:
  pbt_population& p_;
};

// Uniform in [0, 1) from the generator: one draw, the same on every platform (unlike
// std::uniform_real_distribution, whose algorithm the standard leaves open).
double unit(std::mt19937_64& g) { return static_cast<double>(g() >> 11) * 0x1.0p-53; }
}  // namespace

class pbt_source final : public trial_source {
 public:
  pbt_source(pbt_population& p, std::unique_ptr<list_source> listed) : p_{p}, listed_{std::move(listed)} {}
  std::optional<new_trial> next() override {
    std::lock_guard lock(p_.mutex_);
    while (std::optional<new_trial> t = listed_->next())
      if (!p_.replaced_.count(t->id)) return t;  // (a member replaced before a stop is not run again)
    // (In the order made: the next child waits for its copy, the ones after it for it.)
    if (p_.born_.empty() || p_.born_.front().copying) return std::nullopt;
    new_trial t = std::move(p_.born_.front().trial);
    p_.born_.pop_front();
    return t;
  }
  [[nodiscard]] bool exhausted() const override {
    std::lock_guard lock(p_.mutex_);
    return listed_->exhausted() && p_.born_.empty();
  }
  void tell(const trial_record& record) override { p_.ended(record.id); }
  // A copy under way: the sweep waits for its child, even with nothing running.
  [[nodiscard]] bool busy() const override {
    std::lock_guard lock(p_.mutex_);
    return std::any_of(p_.born_.begin(), p_.born_.end(), [](const auto& b) { return b.copying; });
  }
  void on_ready(const std::function<void()>& wake) override { p_.on_ready(wake); }

 private:
  pbt_population& p_;
  std::unique_ptr<list_source> listed_;
};

pbt_population::pbt_population(const sweep_spec& s, fs::path out, std::string subject, copy_fn copy)
    : s_{s},
      out_{std::move(out)},
      subject_{std::move(subject)},
      copy_{copy ? std::move(copy) : copy_fn(copy_checkpoint)},
      next_index_{s.trials.size()},
      random_{s.pbt.seed} {
  for (const auto& params : s.trials) {
    place_[trial_id(subject_, params)] = members_.size();
    members_.push_back({trial_id(subject_, params), params, 0, {}, 0, false});
  }
  copier_ = std::thread([this] { copy_children(); });
}

pbt_population::~pbt_population() {
  {
    std::lock_guard lock(mutex_);
    quit_ = true;
  }
  copy_queued_.notify_all();
  copier_.join();
}

void pbt_population::on_ready(const std::function<void()>& wake) {
  std::lock_guard lock(wake_mutex_);
  wake_ = wake;
}

void pbt_population::wake() {
  std::lock_guard lock(wake_mutex_);
  if (wake_) wake_();
}

std::unique_ptr<stop_rule> pbt_population::rule() { return std::make_unique<pbt_rule>(*this); }

std::unique_ptr<trial_source> pbt_population::source(std::unique_ptr<list_source> listed) {
  return std::make_unique<pbt_source>(*this, std::move(listed));
}

bool pbt_population::report(const std::string& id, std::int64_t step, double value) {
  std::lock_guard lock(mutex_);
  if (doomed_.count(id)) return true;  // replaced at a decision: it stops at its next report
  const auto at = place_.find(id);
  if (at == place_.end()) return false;
  member& m = members_[at->second];
  m.reported = true;
  // (A step reported again, by a retried attempt, was judged the first time.)
  if (step <= 0 || step % s_.pbt.interval != 0 || m.at.count(step)) return false;
  m.at[step] = std::isnan(value) ? std::numeric_limits<double>::infinity() : value;
  if (decided_.count(step)) decide_late(at->second, step);
  else decide_ready();
  return false;
}

void pbt_population::ended(const std::string& id) {
  std::lock_guard lock(mutex_);
  if (const auto at = place_.find(id); at != place_.end()) members_[at->second].ended = true;
  decide_ready();  // a step that waited for it only may be decided now
}

// Each decision step every member that will report it has reported, in order: a step a member
// that ended never reaches does not wait for it, nor one a child started past, nor one that has
// not reported yet (waiting for a slot, or starting): that one is judged as it reaches the step.
void pbt_population::decide_ready() {
  std::set<std::int64_t> steps;
  for (const auto& m : members_)
    for (const auto& [step, value] : m.at)
      if (!decided_.count(step)) steps.insert(step);
  for (const std::int64_t step : steps) {
    const bool waiting = std::any_of(members_.begin(), members_.end(), [&](const member& m) {
      return m.reported && !m.ended && m.first_step < step && !m.at.count(step);
    });
    if (waiting) return;  // (later steps wait their turn: decisions are made in step order)
    decided_.insert(step);
    decide(step);
  }
}

std::pair<std::vector<std::size_t>, std::size_t> pbt_population::ranking(std::int64_t step) {
  struct ranked_member {
    std::size_t place;
    double value;
    std::uint64_t tie;
  };
  std::vector<ranked_member> ranked;
  for (std::size_t i = 0; i < members_.size(); ++i)
    if (const auto v = members_[i].at.find(step); v != members_[i].at.end()) ranked.push_back({i, v->second, 0});
  if (ranked.size() < 2) return {{}, 0};
  for (auto& r : ranked) r.tie = random_();
  std::sort(ranked.begin(), ranked.end(), [](const ranked_member& a, const ranked_member& b) {
    return a.value != b.value ? a.value < b.value : a.tie < b.tie;
  });
  const std::size_t n = ranked.size();
  const std::size_t k = std::min(
      n / 2, std::max<std::size_t>(1, static_cast<std::size_t>(std::floor(static_cast<double>(n) * s_.pbt.quantile))));
  std::vector<std::size_t> places(n);
  std::transform(ranked.begin(), ranked.end(), places.begin(), [](const ranked_member& r) { return r.place; });
  return {std::move(places), k};
}

// At `step`: the members that reported it, by their metric there (ties in an order drawn for
// this decision, so that equal members take turns); each of the bottom k is replaced by a child
// of one of the top k, k the quantile of them (at least 1, at most half).
void pbt_population::decide(std::int64_t step) {
  const auto [ranked, k] = ranking(step);
  if (ranked.empty()) return;
  std::vector<member> top;  // (copies: a replaced member's place takes its child)
  for (std::size_t i = 0; i < k; ++i) top.push_back(members_[ranked[i]]);
  for (std::size_t i = ranked.size() - k; i < ranked.size(); ++i) {
    if (members_[ranked[i]].ended) continue;  // done already: nothing to replace
    replace(ranked[i], top[random_() % k]);
  }
}

// A member that reached `step` after its decision, ranked there among every value at the step.
// (A child is judged once it has run an interval of its own, as Ray Tune's PBT waits: one made
// at this step's decision, from a checkpoint just before it, is not replaced as it gets there.)
void pbt_population::decide_late(std::size_t place, std::int64_t step) {
  if (members_[place].first_step + s_.pbt.interval > step) return;
  const auto [ranked, k] = ranking(step);
  if (ranked.empty()) return;
  const auto at = std::find(ranked.begin(), ranked.end(), place);
  if (static_cast<std::size_t>(at - ranked.begin()) < ranked.size() - k) return;  // not in the bottom quantile
  const member parent = members_[ranked[random_() % k]];
  replace(place, parent);
}

void pbt_population::replace(std::size_t place, const member& parent) {
  const member replaced = members_[place];
  newborn child = child_of(parent, replaced);
  place_.erase(replaced.id);
  doomed_.insert(replaced.id);
  replaced_.insert(replaced.id);
  const std::int64_t from = child.trial.origin.value("step", std::int64_t{-1});
  members_[place] = {
      child.trial.id, child.trial.params, parent.generation + 1, {}, std::max<std::int64_t>(0, from), false, false};
  place_[child.trial.id] = place;
  born_.push_back(std::move(child));
  copy_queued_.notify_all();
}

json pbt_population::mutate(const json& params) {
  json out = params;
  for (const auto& [name, how] : s_.pbt.mutations.items()) {
    if (!out.contains(name)) continue;
    json& v = out[name];
    const bool draw = how.is_object() && unit(random_) < s_.pbt.resample_probability;
    if (draw && how.contains("choice")) {
      const json& choices = how["choice"];
      v = choices[random_() % choices.size()];
    } else if (draw && (how.contains("uniform") || how.contains("loguniform"))) {
      const bool log = how.contains("loguniform");
      const json& b = log ? how["loguniform"] : how["uniform"];
      const double lo = b[0].get<double>(), hi = b[1].get<double>(), u = unit(random_);
      v = log ? std::exp(std::log(lo) + u * (std::log(hi) - std::log(lo))) : lo + u * (hi - lo);
    } else if (v.is_number()) {
      const double factor = random_() % 2 ? 1.2 : 0.8;
      if (v.is_number_integer()) {
        // (A whole number stays one, and moves: 1 perturbed is 2 or 0... at least by one.)
        const auto x = v.get<std::int64_t>();
        const auto y = static_cast<std::int64_t>(std::llround(static_cast<double>(x) * factor));
        v = y != x ? y : x + (factor > 1 ? 1 : -1);
      } else {
        v = v.get<double>() * factor;
      }
    } else if (how.is_object() && how.contains("choice")) {  // not a number: perturbing is a draw
      const json& choices = how["choice"];
      v = choices[random_() % choices.size()];
    }
  }
  return out;
}

std::int64_t pbt_population::plan_hand_down(const std::string& parent, const std::string& child, bool& copy) const {
  copy = false;
  try {
    const checkpoint_folder to(out_ / "checkpoints" / child, s_.checkpoints.keep);
    if (const auto has = to.latest()) return has->step;  // copied before (a resumed sweep's replay)
    const checkpoint_folder from(out_ / "checkpoints" / parent, s_.checkpoints.keep);
    if (const auto latest = from.latest()) {
      copy = true;
      return latest->step;
    }
  } catch (const std::exception&) {  // (hand_down() meets it again, and says it)
    copy = true;
  }
  return -1;
}

std::int64_t pbt_population::hand_down(const std::string& parent, const std::string& child) const {
  std::string why = "it has none";
  // Twice at most: the parent, still running, may commit a newer one and remove this one while
  // it is copied (keep: 1); the copy is then made of the newer.
  for (int attempt = 0; attempt < 2; ++attempt) {
    fs::path staged;
    try {
      const checkpoint_folder from(out_ / "checkpoints" / parent, s_.checkpoints.keep);
      const auto latest = from.latest();
      if (!latest) break;
      checkpoint_folder to(out_ / "checkpoints" / child, s_.checkpoints.keep);
      to.clear_staging();
      staged = to.stage(latest->step);
      copy_(latest->path, staged, quit_);
      return to.commit(staged, latest->step).step;
    } catch (const std::exception& e) {
      why = e.what();
      std::error_code ec;
      if (!staged.empty()) fs::remove_all(staged, ec);  // nothing half copied is left
      if (quit_) return -1;                             // (the sweep is ending: the child is not given out)
    }
  }
  std::fprintf(stderr, "isorun: warning: pbt: trial %s starts afresh, without its parent %s's checkpoint: %s\n",
               child.c_str(), parent.c_str(), printable(why).c_str());
  return -1;  // (its origin says so, step -1)
}

// Each newborn whose parent's checkpoint is to be copied, in the order they were made: copied
// with no lock held, then the child is ready to be given out (and the sweep woken for it). Where
// the copy is not the checkpoint planned (the parent committed a newer one meanwhile, or the
// copy failed), the child's origin and the steps it is waited for at follow what it got.
void pbt_population::copy_children() {
  std::unique_lock lock(mutex_);
  for (;;) {
    const auto next = [&] {
      return std::find_if(born_.begin(), born_.end(), [](const newborn& b) { return b.copying; });
    };
    copy_queued_.wait(lock, [&] { return quit_ || next() != born_.end(); });
    if (quit_) return;
    // (A reference stays valid while others are added behind it and given out before it, and it
    // is not given out itself while it is copying.)
    newborn& child = *next();
    const std::string parent = child.parent, id = child.trial.id;
    lock.unlock();
    const std::int64_t step = hand_down(parent, id);
    lock.lock();
    if (quit_) return;
    child.copying = false;
    if (step != child.trial.origin.value("step", std::int64_t{-1})) {
      child.trial.origin["step"] = step;
      if (const auto at = place_.find(id); at != place_.end()) {
        members_[at->second].first_step = std::max<std::int64_t>(0, step);
        decide_ready();  // (a step that waited for it only may be decided now)
      }
    }
    lock.unlock();
    wake();
    lock.lock();
  }
}

pbt_population::newborn pbt_population::child_of(const member& parent, const member& replaced) {
  const std::size_t index = next_index_++;
  json params = mutate(parent.params);
  // The index makes the id: two children may have the same parameters.
  std::string id = trial_id(subject_, json{{"pbt", index}, {"params", params}});
  bool copy = false;
  const std::int64_t step = plan_hand_down(parent.id, id, copy);
  json origin = {
      {"parent", parent.id}, {"replaces", replaced.id}, {"step", step}, {"generation", parent.generation + 1}};
  return {{index, std::move(id), std::move(params), std::move(origin)}, parent.id, copy};
}

}  // namespace isorun::sweep
