// Population-based training (pbt.hpp).
#include "pbt.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

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
    while (std::optional<new_trial> t = listed_->next())
      if (!p_.replaced_.count(t->id)) return t;  // (a member replaced before a stop is not run again)
    if (p_.born_.empty()) return std::nullopt;
    new_trial t = std::move(p_.born_.front());
    p_.born_.pop_front();
    return t;
  }
  [[nodiscard]] bool exhausted() const override { return listed_->exhausted() && p_.born_.empty(); }
  void tell(const trial_record& /*record*/) override {}

 private:
  pbt_population& p_;
  std::unique_ptr<list_source> listed_;
};

pbt_population::pbt_population(const sweep_spec& s, fs::path out, std::string subject)
    : s_{s}, out_{std::move(out)}, subject_{std::move(subject)}, next_index_{s.trials.size()}, random_{s.pbt.seed} {
  for (const auto& params : s.trials) {
    place_[trial_id(subject_, params)] = members_.size();
    members_.push_back({trial_id(subject_, params), params, 0, {}});
  }
}

std::unique_ptr<stop_rule> pbt_population::rule() { return std::make_unique<pbt_rule>(*this); }

std::unique_ptr<trial_source> pbt_population::source(std::unique_ptr<list_source> listed) {
  return std::make_unique<pbt_source>(*this, std::move(listed));
}

bool pbt_population::report(const std::string& id, std::int64_t step, double value) {
  const auto at = place_.find(id);
  if (at == place_.end()) return false;  // replaced already, or not of this sweep
  if (step <= 0 || step % s_.pbt.interval != 0) return false;
  member& m = members_[at->second];
  m.at[step] = std::isnan(value) ? std::numeric_limits<double>::infinity() : value;
  // The members that reached this step, compared by what each reported at it (a member ahead
  // has a better value later on, one behind has none yet): best first, ties in an order drawn
  // for this decision (so that equal members take turns at the bottom).
  struct ranked_member {
    std::size_t place;
    double value;
    std::uint64_t tie;
  };
  std::vector<ranked_member> ranked;
  for (std::size_t i = 0; i < members_.size(); ++i)
    if (const auto v = members_[i].at.find(step); v != members_[i].at.end()) ranked.push_back({i, v->second, 0});
  if (ranked.size() < 2) return false;
  for (auto& r : ranked) r.tie = random_();
  std::sort(ranked.begin(), ranked.end(), [](const ranked_member& a, const ranked_member& b) {
    return a.value != b.value ? a.value < b.value : a.tie < b.tie;
  });
  const std::size_t k = std::max<std::size_t>(
      1, static_cast<std::size_t>(std::floor(static_cast<double>(ranked.size()) * s_.pbt.quantile)));
  const auto rank = static_cast<std::size_t>(
      std::find_if(ranked.begin(), ranked.end(), [&](const ranked_member& r) { return r.place == at->second; }) -
      ranked.begin());
  if (rank + k < ranked.size() || rank < k) return false;  // not in the bottom (or in the top too: too few)
  const member parent = members_[ranked[random_() % k].place];
  const member replaced = m;
  new_trial child = child_of(parent, replaced);
  const std::size_t place = at->second;
  place_.erase(replaced.id);
  replaced_.insert(replaced.id);
  members_[place] = {child.id, child.params, parent.generation + 1, {}};
  place_[child.id] = place;
  born_.push_back(std::move(child));
  return true;
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

std::int64_t pbt_population::hand_down(const std::string& parent, const std::string& child) const {
  try {
    const checkpoint_folder from(out_ / "checkpoints" / parent, s_.checkpoints.keep);
    const auto latest = from.latest();
    if (!latest) return -1;
    checkpoint_folder to(out_ / "checkpoints" / child, s_.checkpoints.keep);
    if (const auto has = to.latest()) return has->step;  // copied before (a resumed sweep's replay)
    const fs::path staged = to.stage(latest->step);
    fs::copy(latest->path, staged, fs::copy_options::recursive | fs::copy_options::copy_symlinks);
    return to.commit(staged, latest->step).step;
  } catch (const std::exception&) {
    return -1;  // (the child then starts afresh: its origin says so, step -1)
  }
}

new_trial pbt_population::child_of(const member& parent, const member& replaced) {
  const std::size_t index = next_index_++;
  json params = mutate(parent.params);
  // The index makes the id: two children may have the same parameters.
  std::string id = trial_id(subject_, json{{"pbt", index}, {"params", params}});
  const std::int64_t step = hand_down(parent.id, id);
  json origin = {
      {"parent", parent.id}, {"replaces", replaced.id}, {"step", step}, {"generation", parent.generation + 1}};
  return {index, std::move(id), std::move(params), std::move(origin)};
}

}  // namespace isorun::sweep
