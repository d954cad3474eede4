// Early stopping's rules on recorded curves: ASHA (Li et al., MLSys 2020, stopping form) and the
// median stopping rule (Golovin et al., KDD 2017), against references written here from the
// papers' definitions, and by hand on small cases: rung membership, promotions, the median rule,
// and a resume in the middle of a rung (a fresh rule fed the same reports decides the same).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "isorun/sweep/asha.hpp"
#include "isorun/sweep/hyperband.hpp"
#include "isorun/sweep/median_stopping.hpp"
#include "isorun/sweep/spec.hpp"
#include "isorun/sweep/stop_rule.hpp"

namespace sw = isorun::sweep;

namespace {

struct report {
  std::string trial;
  std::int64_t step;
  double value;
};

// ASHA from the paper, kept as plainly as it can be: rung k is at step r·η^k (below max_t); a
// trial reaching rung k is added to it, and is promoted (goes on) if it is in the top ⌊n/η⌋ of
// the rung's n members, by rank in the sorted rung (ties favour it); the first member of a rung,
// with ⌊1/η⌋ = 0, goes on (asynchronous: nobody waits for a rung to fill). One judgement per
// trial and rung; a report skipping rungs is judged at the highest it reaches; a stop is final.
class reference_asha {
 public:
  reference_asha(std::int64_t r, std::int64_t eta, std::int64_t max_t) : eta_{eta} {
    for (std::int64_t s = r; s < max_t; s *= eta) rung_steps_.push_back(s);
    rungs_.resize(rung_steps_.size());
  }
  bool report(const std::string& id, std::int64_t step, double v) {
    if (stopped_.count(id)) return true;
    int k = -1;
    for (std::size_t i = 0; i < rung_steps_.size(); ++i)
      if (rung_steps_[i] <= step) k = static_cast<int>(i);
    if (k < 0 || (highest_.count(id) && highest_[id] >= k)) return false;
    highest_[id] = k;
    auto& rung = rungs_[static_cast<std::size_t>(k)];
    rung.push_back(v);
    std::vector<double> sorted = rung;
    std::sort(sorted.begin(), sorted.end());
    const auto rank = static_cast<std::int64_t>(std::lower_bound(sorted.begin(), sorted.end(), v) - sorted.begin());
    const std::int64_t top = std::max<std::int64_t>(1, static_cast<std::int64_t>(rung.size()) / eta_);
    if (rank < top) return false;
    stopped_[id] = true;
    return true;
  }

 private:
  std::int64_t eta_;
  std::vector<std::int64_t> rung_steps_;
  std::vector<std::vector<double>> rungs_;
  std::map<std::string, int> highest_;
  std::map<std::string, bool> stopped_;
};

// The median stopping rule from the paper: at step t ≥ grace, stop a trial whose best value so
// far is worse than the median of the running averages at t of the other trials that reached t.
class reference_median {
 public:
  reference_median(std::int64_t grace, std::size_t min_samples) : grace_{grace}, min_{min_samples} {}
  bool report(const std::string& id, std::int64_t step, double v) {
    curves_[id][step] = v;
    if (step < grace_) return false;
    std::vector<double> avg;
    for (const auto& [other, c] : curves_) {
      if (other == id || c.rbegin()->first < step) continue;
      double sum = 0;
      int n = 0;
      for (const auto& [s, x] : c)
        if (s <= step) sum += x, ++n;
      avg.push_back(sum / n);
    }
    if (avg.size() < min_) return false;
    std::sort(avg.begin(), avg.end());
    const double median = avg.size() % 2 ? avg[avg.size() / 2] : (avg[avg.size() / 2 - 1] + avg[avg.size() / 2]) / 2;
    double best = INFINITY;
    for (const auto& [s, x] : curves_[id])
      if (s <= step) best = std::min(best, x);
    return best > median;
  }

 private:
  std::int64_t grace_;
  std::size_t min_;
  std::map<std::string, std::map<std::int64_t, double>> curves_;
};

// Recorded curves: `n` trials, each reporting every step to `max_t` (unless stopped), their
// reports interleaved as `lanes` trials running at once with random speeds would interleave
// them. Values: a floor per trial plus a decaying term, with noise, so curves cross.
template <class Rule, class Ref>
void replay_against_reference(Rule& rule, Ref& ref, unsigned seed, int n, std::int64_t max_t, int lanes) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<double> floor_(static_cast<std::size_t>(n)), rate(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i)
    floor_[static_cast<std::size_t>(i)] = u(rng), rate[static_cast<std::size_t>(i)] = 0.5 + u(rng);
  struct running {
    int trial;
    std::int64_t step;
  };
  std::vector<running> lanes_now;
  int next = 0;
  int decisions = 0, stops = 0;
  while (next < n || !lanes_now.empty()) {
    while (static_cast<int>(lanes_now.size()) < lanes && next < n) lanes_now.push_back({next++, 1});
    const std::size_t pick = std::uniform_int_distribution<std::size_t>(0, lanes_now.size() - 1)(rng);
    auto& r = lanes_now[pick];
    const auto i = static_cast<std::size_t>(r.trial);
    const double v = floor_[i] + rate[i] / std::sqrt(double(r.step)) + 0.05 * u(rng);
    const std::string id = "t" + std::to_string(r.trial);
    const bool got = rule.report(id, r.step, v);
    const bool want = ref.report(id, r.step, v);
    INFO("seed " << seed << ", trial " << id << " at step " << r.step);
    REQUIRE(got == want);
    ++decisions;
    stops += got;
    if (got || r.step >= max_t) lanes_now.erase(lanes_now.begin() + static_cast<std::ptrdiff_t>(pick));
    else r.step += 1 + static_cast<std::int64_t>(u(rng) < 0.2);  // now and then a step is skipped
  }
  CHECK(decisions > n);
  CHECK(stops > 0);  // the curves are such that some trials must stop...
  CHECK(stops < n);  // ...and not all
}

}  // namespace

TEST_CASE("asha: rungs at grace_period * reduction_factor^k below max_t", "[stop-rules][asha]") {
  CHECK(sw::asha_rule(1, 3, 81).rungs() == std::vector<std::int64_t>{1, 3, 9, 27});
  CHECK(sw::asha_rule(1, 3, 82).rungs() == std::vector<std::int64_t>{1, 3, 9, 27, 81});
  CHECK(sw::asha_rule(2, 2, 20).rungs() == std::vector<std::int64_t>{2, 4, 8, 16});
  CHECK(sw::asha_rule(5, 4, 5).rungs().empty());  // max_t at the grace period: nothing to judge
  CHECK_THROWS(sw::asha_rule(1, 1, 81));
  CHECK_THROWS(sw::asha_rule(10, 3, 5));
}

TEST_CASE("asha: a trial goes on from a rung only in the top 1/eta of those recorded there so far",
          "[stop-rules][asha]") {
  sw::asha_rule a(1, 3, 27);  // rungs 1, 3, 9
  // Below the first rung nothing is judged.
  CHECK_FALSE(a.report("x", 0, 100.0));
  CHECK(a.recorded(0).empty());
  // The first at a rung goes on: nothing to compare against, and no waiting.
  CHECK_FALSE(a.report("a", 1, 5.0));
  // n=2: top max(1, 2/3=0) = 1; b is worse than a: stops. c is better than a: goes on.
  CHECK(a.report("b", 1, 6.0));
  CHECK_FALSE(a.report("c", 1, 4.0));
  // n=4: top 1 (4/3); d is second best: stops even though it beats two of the three.
  CHECK(a.report("d", 1, 4.5));
  CHECK(a.recorded(0).size() == 4);
  // n=6: top 2. e is best; f is second best (behind e, ahead of c): goes on.
  CHECK_FALSE(a.report("e", 1, 1.0));
  CHECK_FALSE(a.report("f", 1, 3.0));
  // Reports between rungs do not judge; a stopped trial stays stopped.
  CHECK_FALSE(a.report("a", 2, 9.0));
  CHECK(a.report("b", 2, 0.0));
  CHECK(a.recorded(1).empty());
  // Promotion to rung 3: each trial judged there once, on the values at rung 3.
  CHECK_FALSE(a.report("c", 3, 2.0));   // first at rung 3
  CHECK(a.report("a", 3, 2.5));         // n=2, worse than c
  CHECK_FALSE(a.report("c", 4, 50.0));  // between rungs: goes on whatever it reports
  CHECK(a.recorded(1).size() == 2);
  // A report that skips rungs is judged at the highest it reaches, once.
  CHECK_FALSE(a.report("e", 9, 0.5));
  CHECK(a.recorded(1).size() == 2);
  CHECK(a.recorded(2).count("e") == 1);
  // At or past max_t there is no rung: a complete trial is never stopped by the rule.
  CHECK_FALSE(a.report("e", 27, 99.0));
  // NaN counts as the worst value.
  CHECK(a.report("f", 3, std::nan("")));
}

TEST_CASE("asha: maximizing is minimizing the negated metric; equal values do not count as better",
          "[stop-rules][asha]") {
  sw::asha_rule a(1, 2, 8);
  CHECK_FALSE(a.report("a", 1, -0.9));  // accuracy 0.9
  CHECK_FALSE(a.report("b", 1, -0.9));  // a tie: n=2, top 1, nobody strictly better
  CHECK(a.report("c", 1, -0.5));
}

TEST_CASE("asha: decisions match the paper's reference on recorded curves", "[stop-rules][asha]") {
  for (unsigned seed = 1; seed <= 20; ++seed) {
    const int eta = 2 + static_cast<int>(seed % 3);
    sw::asha_rule rule(1, eta, 64);
    reference_asha ref(1, eta, 64);
    replay_against_reference(rule, ref, seed, 60, 64, 1 + static_cast<int>(seed % 4));
  }
}

TEST_CASE("asha: resumed in the middle of a rung, a rule rebuilt from the reports decides as the first would",
          "[stop-rules][asha][resume]") {
  // One uninterrupted run, recorded; then at every cut, a fresh rule fed the reports before the
  // cut (what a resumed sweep replays from OUT/reports.jsonl) must make every later decision
  // the same, also for the trials that were running at the cut and report their steps again.
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<report> reports;
  {
    sw::asha_rule whole(1, 3, 27);
    std::vector<std::pair<int, std::int64_t>> running;  // (trial, step)
    for (int next = 0; next < 40 || !running.empty();) {
      while (running.size() < 3 && next < 40) running.emplace_back(next++, 1);
      const auto pick = std::uniform_int_distribution<std::size_t>(0, running.size() - 1)(rng);
      auto& [trial, step] = running[pick];
      reports.push_back({"t" + std::to_string(trial), step, u(rng) + 1.0 / double(step)});
      if (whole.report(reports.back().trial, step, reports.back().value) || step >= 27)
        running.erase(running.begin() + static_cast<std::ptrdiff_t>(pick));
      else ++step;
    }
  }
  std::vector<bool> verdicts;
  {
    sw::asha_rule whole(1, 3, 27);
    for (const auto& r : reports) verdicts.push_back(whole.report(r.trial, r.step, r.value));
  }
  std::size_t full_at_rung = 0;  // trials that reach rung 2 (step 9) in the whole run
  {
    sw::asha_rule full(1, 3, 27);
    for (const auto& r : reports) full.report(r.trial, r.step, r.value);
    full_at_rung = full.recorded(2).size();
  }
  int mid_rung_cuts = 0;
  for (std::size_t cut = 1; cut < reports.size(); cut += 5) {
    sw::asha_rule resumed(1, 3, 27);
    for (std::size_t i = 0; i < cut; ++i) resumed.report(reports[i].trial, reports[i].step, reports[i].value);
    const std::size_t at_rung = resumed.recorded(2).size();
    mid_rung_cuts += at_rung > 0 && at_rung < full_at_rung;  // the rung holds some, not all, of its trials
    // Each trial running at the cut starts again from step 1 (a stopped one is journaled and
    // not rerun, but if the sweep died between the decision and the journal, it is): its repeated
    // reports keep the verdict it had, whatever their values, and record nothing new.
    std::map<std::string, std::int64_t> reached;
    std::map<std::string, bool> stopped;
    for (std::size_t i = 0; i < cut; ++i) {
      reached[reports[i].trial] = reports[i].step;
      stopped[reports[i].trial] = stopped[reports[i].trial] || verdicts[i];
    }
    for (const auto& [trial, step] : reached)
      for (std::int64_t s = 1; s <= step; ++s) CHECK(resumed.report(trial, s, 123.0) == stopped[trial]);
    for (std::size_t i = cut; i < reports.size(); ++i) {
      INFO("cut at report " << cut << ", report " << i);
      CHECK(resumed.report(reports[i].trial, reports[i].step, reports[i].value) == verdicts[i]);
    }
  }
  CHECK(mid_rung_cuts > 0);
}

TEST_CASE("median: stops a trial whose best is worse than the median of the others' running averages",
          "[stop-rules][median]") {
  sw::median_stopping_rule m(2, 2);  // grace 2 steps, 2 other trials needed
  // a: 4, 2, 1 (running averages 4, 3, 2.33); b: 6, 4, 2 (6, 5, 4)
  for (auto [s, v] : {std::pair{1, 4.0}, {2, 2.0}, {3, 1.0}}) CHECK_FALSE(m.report("a", s, v));
  for (auto [s, v] : {std::pair{1, 6.0}, {2, 4.0}, {3, 2.0}}) CHECK_FALSE(m.report("b", s, v));  // one other only
  // c at step 1: within the grace period, whatever it reports.
  CHECK_FALSE(m.report("c", 1, 100.0));
  // c at step 2: best so far 3.5; others' averages at 2: a 3, b 5 -> median 4: goes on.
  CHECK_FALSE(m.report("c", 2, 3.5));
  // c at step 3: best 3.5; averages at 3: a 2.33, b 4 -> median 3.17: stops.
  CHECK(m.report("c", 3, 3.6));
  // d reaches step 3 with a best of 3.0 < 3.17... but c now counts too (it reached step 3):
  // averages a 2.33, b 4, c 35.7 -> median 4: goes on.
  CHECK_FALSE(m.report("d", 3, 3.0));
  // A trial that has not reached the step is not among the others: e at step 4 has only a
  // and b... and neither reached 4, so too few others: goes on.
  CHECK_FALSE(m.report("e", 4, 1000.0));
}

TEST_CASE("median: decisions match the paper's reference on recorded curves", "[stop-rules][median]") {
  for (unsigned seed = 1; seed <= 20; ++seed) {
    const int min_samples = 1 + static_cast<int>(seed % 4);
    sw::median_stopping_rule rule(3, min_samples);
    reference_median ref(3, static_cast<std::size_t>(min_samples));
    replay_against_reference(rule, ref, seed, 40, 30, 1 + static_cast<int>(seed % 5));
  }
}

TEST_CASE("stop rules: the spec names the rule", "[stop-rules]") {
  sw::early_stopping_spec e = sw::default_early_stopping(*sw::find_stop_rule("asha"));
  e.settings["max_t"] = 27;
  CHECK(dynamic_cast<sw::asha_rule*>(sw::make_stop_rule(e).get()) != nullptr);
  e = sw::default_early_stopping(*sw::find_stop_rule("median"));
  CHECK(dynamic_cast<sw::median_stopping_rule*>(sw::make_stop_rule(e).get()) != nullptr);
  e = sw::default_early_stopping(*sw::find_stop_rule("hyperband"));
  CHECK(dynamic_cast<sw::hyperband_rule*>(sw::make_stop_rule(e).get()) != nullptr);
  e.type = "bohb";
  CHECK_THROWS(sw::make_stop_rule(e));
}

TEST_CASE("the registry: defaults, ranges, unknown settings, sweep.json both ways", "[stop-rules][registry]") {
  CHECK(sw::stop_rule_names() == "asha, median, hyperband");
  CHECK(sw::find_stop_rule("bohb") == nullptr);
  for (const auto& kind : sw::stop_rule_kinds()) {
    INFO(kind.name);
    const sw::early_stopping_spec d = sw::default_early_stopping(kind);
    CHECK(sw::early_stopping_problem(d).empty());  // every rule's defaults make a valid rule
    CHECK(sw::make_stop_rule(d) != nullptr);
    CHECK(d.settings.size() == kind.settings.size());
    // Through sweep.json and back: the same rule, the same settings.
    const sw::early_stopping_spec back = sw::early_stopping_from_json(sw::early_stopping_json(d));
    CHECK(back.type == d.type);
    CHECK(back.settings == d.settings);
    for (const auto& setting : kind.settings) {
      sw::early_stopping_spec e = d;
      CHECK_THAT(sw::set_early_stopping(e, setting.name, setting.least - 1),
                 Catch::Contains(std::string(setting.name) + " must be a whole number, at least"));
      CHECK(sw::set_early_stopping(e, setting.name, setting.least + 5).empty());
      CHECK(e.get(setting.name) == setting.least + 5);
    }
    sw::early_stopping_spec e = d;
    CHECK_THAT(sw::set_early_stopping(e, "max_tt", 3), Catch::Contains("unknown setting 'max_tt' for " + d.type));
  }
  auto h = sw::default_early_stopping(*sw::find_stop_rule("hyperband"));
  h.settings["max_t"] = 3;
  h.settings["grace_period"] = 5;
  CHECK_THAT(sw::early_stopping_problem(h), Catch::Contains("max_t (3) is below grace_period (5)"));
  CHECK(sw::early_stopping_from_json(nullptr).type.empty());
  CHECK(sw::early_stopping_from_json({{"type", "bohb"}}).type.empty());
  // A sweep.json from before a setting existed: the rule with that setting at its default.
  const auto old = sw::early_stopping_from_json({{"type", "asha"}, {"max_t", 27}, {"min_samples", 3}});
  CHECK((old.type == "asha" && old.max_t() == 27 && old.get("reduction_factor") == 3 &&
         !old.settings.count("min_samples")));
  CHECK(sw::stop_rule_rungs(sw::early_stopping_from_json({{"type", "asha"}, {"max_t", 27}})) ==
        std::vector<std::int64_t>{1, 3, 9});
  CHECK(sw::stop_rule_rungs(sw::default_early_stopping(*sw::find_stop_rule("median"))).empty());
}

namespace {

// Hyperband from the paper (Li et al., JMLR 2018, Algorithm 1) with the minimum resource r as
// its unit: s_max = ⌊log_η(R/r)⌋; the bracket with k halvings starts
// n_k = ⌈(s_max+1)/(k+1)·η^k⌉ configurations at resource R·η^(−k). Run asynchronously (Li et al.,
// MLSys 2020, §3.3): each bracket is ASHA whose first rung is that resource, and configurations
// go to brackets in proportion to n_k, in turn (smooth weighted round robin: each bracket earns
// n_k per configuration, the one with the most credit takes it and pays Σn).
class reference_hyperband {
 public:
  reference_hyperband(std::int64_t r, std::int64_t eta, std::int64_t R) {
    s_max_ = static_cast<int>(std::floor(std::log(double(R) / double(r)) / std::log(double(eta)) + 1e-9));
    for (int k = s_max_; k >= 0; --k) {  // the most aggressive bracket first, as the rule lists them
      const double eta_k = std::pow(double(eta), k);
      n_.push_back(static_cast<std::int64_t>(std::ceil(double(s_max_ + 1) / double(k + 1) * eta_k)));
      first_.push_back(static_cast<std::int64_t>(std::llround(double(R) / eta_k)));
      brackets_.emplace_back(first_.back(), eta, R);
    }
    credit_.assign(n_.size(), 0);
  }
  bool report(const std::string& id, std::int64_t step, double v) {
    if (!bracket_.count(id)) {
      std::int64_t total = 0;
      for (std::size_t b = 0; b < n_.size(); ++b) credit_[b] += n_[b], total += n_[b];
      std::size_t richest = 0;
      for (std::size_t b = 1; b < n_.size(); ++b)
        if (credit_[b] > credit_[richest]) richest = b;
      credit_[richest] -= total;
      bracket_[id] = richest;
    }
    return brackets_[bracket_[id]].report(id, step, v);
  }
  int s_max_ = 0;
  std::vector<std::int64_t> n_, first_;
  std::vector<reference_asha> brackets_;
  std::vector<std::int64_t> credit_;
  std::map<std::string, std::size_t> bracket_;
};

}  // namespace

TEST_CASE("hyperband: brackets and their budgets as in the paper", "[stop-rules][hyperband]") {
  // R = 81, η = 3 (the paper's table): s_max = 4, n = 81, 34, 15, 8, 5 at r = 1, 3, 9, 27, 81.
  for (const auto& [r, eta, R] : std::vector<std::tuple<std::int64_t, int, std::int64_t>>{
           {1, 3, 81}, {1, 2, 64}, {2, 3, 54}, {1, 4, 256}, {5, 3, 5}}) {
    INFO("r " << r << ", eta " << eta << ", R " << R);
    const sw::hyperband_rule rule(r, eta, R);
    const reference_hyperband ref(r, eta, R);
    REQUIRE(rule.brackets().size() == static_cast<std::size_t>(ref.s_max_ + 1));
    for (std::size_t s = 0; s < rule.brackets().size(); ++s) {
      CHECK(rule.brackets()[s].share == ref.n_[s]);
      const auto& rungs = rule.brackets()[s].rule.rungs();
      if (ref.first_[s] < R) CHECK((!rungs.empty() && rungs.front() == ref.first_[s]));
      else CHECK(rungs.empty());  // the bracket that runs every trial to R
    }
  }
  const sw::hyperband_rule paper(1, 3, 81);
  std::vector<std::int64_t> shares;
  for (const auto& b : paper.brackets()) shares.push_back(b.share);
  CHECK(shares == std::vector<std::int64_t>{81, 34, 15, 8, 5});
  CHECK(paper.rungs() == std::vector<std::int64_t>{1, 3, 9, 27});
  // R/r not a power of η: the first rungs are r·η^s, the last bracket's at or below R.
  const sw::hyperband_rule odd(1, 3, 100);
  REQUIRE(odd.brackets().size() == 5);
  CHECK(odd.brackets().back().rule.rungs() == std::vector<std::int64_t>{81});
}

TEST_CASE("hyperband: every bracket gets exactly its share of trials, interleaved", "[stop-rules][hyperband]") {
  sw::hyperband_rule rule(1, 3, 81);
  std::map<int, int> count;
  std::vector<int> first_ten;
  for (int i = 0; i < 143; ++i) {  // Σ shares
    const std::string id = "t" + std::to_string(i);
    rule.report(id, 1, 0.5);
    count[rule.bracket_of(id)]++;
    if (i < 10) first_ten.push_back(rule.bracket_of(id));
  }
  CHECK(count == std::map<int, int>{{0, 81}, {1, 34}, {2, 15}, {3, 8}, {4, 5}});
  CHECK(std::set<int>(first_ten.begin(), first_ten.end()).size() >= 3);  // not 81 of one bracket first
  CHECK(rule.bracket_of("never reported") == -1);
  // A trial keeps its bracket when it reports again (a resumed sweep's rerun).
  const int b = rule.bracket_of("t7");
  rule.report("t7", 2, 0.1);
  CHECK(rule.bracket_of("t7") == b);
}

TEST_CASE("hyperband: decisions match the paper's reference on recorded curves", "[stop-rules][hyperband]") {
  for (unsigned seed = 1; seed <= 20; ++seed) {
    const int eta = 2 + static_cast<int>(seed % 2);
    const std::int64_t R = eta == 2 ? 32 : 27;
    sw::hyperband_rule rule(1, eta, R);
    reference_hyperband ref(1, eta, R);
    replay_against_reference(rule, ref, seed, 60, R, 1 + static_cast<int>(seed % 6));
  }
}
