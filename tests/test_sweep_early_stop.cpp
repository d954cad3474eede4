// Early stopping end to end: a synthetic learning-curve command (tests/helpers/curve.py, whose
// loss at step t is a known function of its parameters) swept with ASHA and the median rule;
// pruned trials journaled once and never rerun, a resume after kill -9, and the bad inputs.
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <cmath>

#include "sweep_test_support.hpp"

namespace {

// The curve script's loss (tests/helpers/curve.py), for the grid's best worked out here.
double curve_loss(double x, double y, int t) {
  return (x - 0.3) * (x - 0.3) + (y - 0.6) * (y - 0.6) + (1 + std::abs(x - 0.3) + std::abs(y - 0.6)) * 2.0 / (t + 1);
}

const std::vector<double> xs = {0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8};
const std::vector<double> ys = {0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0};

std::string list(const std::vector<double>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + json(v[i]).dump();
  return s + "]";
}

// A spec sweeping the curve over x and y, each start appended to `runs`.
std::string curve_spec(const std::string& dir, const std::string& scheduler, int max_t = 81,
                       const std::vector<double>& x = xs, const std::vector<double>& y = ys) {
  // 3 ms a step: a stop decision (a few ms) lands within a step or two of its report.
  return "command: [python3, " CURVE_SCRIPT ", --x, \"{x}\", --y, \"{y}\", --max-t, " + std::to_string(max_t) +
         ", --sleep-ms, 3, --runs, \"" + dir +
         "/runs\"]\n"
         "metric: {name: loss, goal: minimize}\n" +
         (scheduler.empty() ? "" : "scheduler: " + scheduler + "\n") + "params:\n  x: " + list(x) +
         "\n  y: " + list(y) + "\nresources: {cpu_slots: 2}\nout: \"" + dir + "/out\"\n";
}

struct outcome_counts {
  std::size_t records = 0, pruned = 0, succeeded = 0;
  std::uint64_t steps = 0;
  json best;  // the success with the least loss
};

outcome_counts count(const fs::path& journal) {
  outcome_counts c;
  const json records = read_journal(journal);  // (held: items() refers to it)
  for (const auto& [params, rec] : records.items()) {
    ++c.records;
    c.steps += rec.value("step", 0);
    if (rec["outcome"] == "pruned") ++c.pruned;
    if (rec["outcome"] != "success") continue;
    ++c.succeeded;
    if (c.best.is_null() || rec["result"]["loss"] < c.best["result"]["loss"]) c.best = rec;
  }
  return c;
}

}  // namespace

TEST_CASE(
    "ASHA on learning curves finds the grid's best at a third of its steps or less; pruned trials are "
    "journaled once, with their last step, and never rerun",
    "[sweep][early-stopping]") {
  const std::string dir = temp_dir();
  std::ofstream(dir + "/spec.yaml") << curve_spec(dir, "{type: asha, max_t: 81, grace_period: 1, reduction_factor: 3}");
  auto r = isorun::test::run_captured(ISORUN_CLI, {"sweep", dir + "/spec.yaml", "--no-progress"});
  INFO(r.err);
  REQUIRE(r.code == 0);  // pruned trials are done, not failed

  // The grid's best, from the known curves: every configuration run to max_t.
  double grid_best = INFINITY;
  json grid_best_params;
  for (double x : xs)
    for (double y : ys)
      if (curve_loss(x, y, 81) < grid_best) grid_best = curve_loss(x, y, 81), grid_best_params = {{"x", x}, {"y", y}};

  const auto c = count(dir + "/out/results.jsonl");
  CHECK(c.records == 81);
  CHECK(lines(dir + "/out/results.jsonl").size() == 81);  // each journaled once
  CHECK(c.pruned > 0);
  CHECK(c.pruned + c.succeeded == 81);
  REQUIRE(c.best.is_object());
  CHECK(c.best["params"] == grid_best_params);
  CHECK(c.best["result"]["loss"].get<double>() == Approx(grid_best));
  CHECK(c.steps <= 81 * 81 / 3);  // at most a third of the full grid's steps
  CHECK_THAT(r.err, Catch::Contains(std::to_string(c.pruned) + " pruned") && Catch::Contains("of the full budget"));

  // Pruned trials: their last step and loss journaled. Reports were delivered while they ran:
  // each was stopped soon after the rung it failed, before max_t (its log holds as much).
  std::size_t stopped_before_end = 0;
  const json records = read_journal(dir + "/out/results.jsonl");
  for (const auto& [params, rec] : records.items()) {
    if (rec["outcome"] != "pruned") continue;
    const auto step = rec["step"].get<int>();
    stopped_before_end += step < 81;  // (a stop that came late finds the trial at its end)
    const auto p = json::parse(params);
    CHECK(rec["result"]["loss"].get<double>() == Approx(curve_loss(p["x"], p["y"], step)));
    const auto log = lines(dir + "/out/logs/" + rec["id"].get<std::string>() + ".out");
    REQUIRE_FALSE(log.empty());
    CHECK(json::parse(log.back()).value("step", 81) >= step);
    CHECK_FALSE(rec.contains("error"));
  }
  CHECK(stopped_before_end > 0);
  // Every report is durable, in OUT/reports.jsonl: as many as the steps the trials reached.
  CHECK(lines(dir + "/out/reports.jsonl").size() >= c.steps);
  // results.csv has the step each trial reached.
  const auto csv = lines(dir + "/out/results.csv");
  REQUIRE(csv.size() == 82);
  CHECK_THAT(csv.front(), Catch::StartsWith("id,outcome,attempts,wall_s,device,peak_reserved,mem_limit,step,"));
  CHECK(std::count_if(csv.begin(), csv.end(), [](const std::string& l) {
          return l.find(",pruned,") != std::string::npos;
        }) == static_cast<long>(c.pruned));

  // The report draws the learning curves, pruned trials faded, the rungs marked, and says how
  // much of the budget was used.
  const std::string html = read_file(dir + "/out/report.html");
  CHECK_THAT(html, Catch::Contains("<section id=\"curves\">") && Catch::Contains("budget used"));
  CHECK(occurrences(html, "<polyline class=\"pruned\"") == c.pruned);
  CHECK(occurrences(html, "<polyline class=\"full\"") == 81 - c.pruned);
  CHECK(occurrences(html, "<line class=\"rung\"") == 4);  // steps 1, 3, 9, 27
  CHECK_THAT(html, Catch::Contains("<b>pruned<") || Catch::Contains(">pruned<b>" + std::to_string(c.pruned)));

  // The same command again: nothing reruns, pruned trials included.
  CHECK(lines(dir + "/runs").size() == 81);
  auto again = isorun::test::run_captured(ISORUN_CLI, {"sweep", dir + "/spec.yaml", "--no-progress"});
  CHECK(again.code == 0);
  CHECK(lines(dir + "/runs").size() == 81);
  CHECK(lines(dir + "/out/results.jsonl").size() == 81);
  // --rerun-failed reruns failures only: a pruned trial is not one.
  auto rerun = isorun::test::run_captured(ISORUN_CLI, {"sweep", dir + "/spec.yaml", "--no-progress", "--rerun-failed"});
  CHECK(rerun.code == 0);
  CHECK(lines(dir + "/runs").size() == 81);
  fs::remove_all(dir);
}

// When a stop lands, without a clock: the pruned trial waits after the report that gets it
// pruned and goes no further by itself, so that it ends only if the stop comes while it waits.
// A stop that waited for anything more of the trial (its next line, its exit) would find it
// still waiting. The spec's timeout only ends such a wait, failing the test rather than hanging
// it: a trial it stops is journaled pruned all the same, but with its 2 minutes as its wall time.
// With 2 slots the other slot is busy while the stop is decided: its trial reports every
// millisecond until the pruned one's SIGTERM handler releases it through a FIFO.
TEST_CASE(
    "a pruned trial is stopped on the report that decides it, with one slot and with both busy: it waits "
    "after that report and never reports again",
    "[sweep][early-stopping]") {
  const bool both_busy = GENERATE(false, true);
  INFO((both_busy ? "2 slots, the other busy" : "1 slot"));
  const std::string dir = temp_dir();
  const std::string fifo = dir + "/release";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  // G (x=0.4) reaches rung 1 first and goes on or is pruned there, by S's place; B (x=0.8), worse
  // than both, starts on G's slot once G has ended, so that G's report at rung 1 always precedes
  // its own: B is pruned at step 1 whatever the order. S (x=0.3, the best, never pruned) holds
  // the other slot from step 2 until B's stop releases it.
  std::string x = "[0.4, 0.8]", y = "[0.6, 0.2]", hold = "[0, 1]", release = "[\"\", \"\"]", stopped = "[\"\", \"\"]";
  if (both_busy) {
    x = "[0.4, 0.3, 0.8]", y = "[0.6, 0.6, 0.2]", hold = "[0, 2, 1]";
    release = "[\"\", \"" + fifo + "\", \"\"]", stopped = "[\"\", \"\", \"" + fifo + "\"]";
  }
  const std::string spec = "command: [python3, " CURVE_SCRIPT
                           ", --x, \"{x}\", --y, \"{y}\", --max-t, 3, --sleep-ms, 1, --hold-at, "
                           "\"{hold}\", --release, \"{release}\", --stopped, \"{stopped}\"]\n"
                           "metric: {name: loss, goal: minimize}\n"
                           "scheduler: {type: asha, max_t: 3, grace_period: 1, reduction_factor: 3}\n"
                           "zip:\n  - {x: " +
                           x + ", y: " + y + ", hold: " + hold + ", release: " + release + ", stopped: " + stopped +
                           "}\nresources: {cpu_slots: " + (both_busy ? "2" : "1") +
                           "}\npolicy: {timeout: 2m}\nout: \"" + dir + "/out\"\n";
  std::ofstream(dir + "/spec.yaml") << spec;
  auto r = isorun::test::run_captured(ISORUN_CLI, {"sweep", dir + "/spec.yaml", "--no-progress"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  const json records = read_journal(dir + "/out/results.jsonl");
  REQUIRE(records.size() == (both_busy ? 3u : 2u));
  for (const auto& [params, rec] : records.items()) {
    const double px = json::parse(params)["x"];
    INFO(rec.dump());
    const auto log = lines(dir + "/out/logs/" + rec["id"].get<std::string>() + ".out");
    if (px == 0.8) {
      // B: stopped while it waited after step 1, the step that got it pruned; that report alone
      // in its log (no step after it), and stopped by its prune, not by the timeout.
      CHECK(rec["outcome"] == "pruned");
      CHECK(rec["step"] == 1);
      CHECK(log.size() == 1);
      CHECK(rec["wall_s"].get<double>() < 120);
    } else if (px == 0.3) {
      // S: released by B's stop, then it went on to its end.
      CHECK(rec["outcome"] == "success");
      CHECK(rec["step"] == 3);
    } else {
      CHECK((rec["outcome"] == "success" || rec["outcome"] == "pruned"));
    }
  }
  fs::remove_all(dir);
}

TEST_CASE("the median stopping rule on learning curves finds the grid's best and prunes", "[sweep][early-stopping]") {
  const std::string dir = temp_dir();
  std::ofstream(dir + "/spec.yaml") << curve_spec(dir, "{type: median, grace_period: 5, min_samples: 3}", 27,
                                                  {0, 0.3, 0.6, 0.8}, {0.2, 0.6, 1.0});
  auto r = isorun::test::run_captured(ISORUN_CLI, {"sweep", dir + "/spec.yaml", "--no-progress"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  const auto c = count(dir + "/out/results.jsonl");
  CHECK(c.records == 12);
  CHECK(c.pruned > 0);  // the x=0.8 trials, last, with every other trial's curve to compare
  REQUIRE(c.best.is_object());
  CHECK(c.best["params"] == json{{"x", 0.3}, {"y", 0.6}});
  // (No bound on the steps here: the rule stops these trials late in their curves, and a busy
  // machine may let one reach its end before the stop lands. bench/bench_early_stop.py counts.)
  fs::remove_all(dir);
}

TEST_CASE(
    "Hyperband (brackets of ASHA) on learning curves prunes, journals and reports like ASHA; a resume reruns "
    "nothing",
    "[sweep][early-stopping][hyperband]") {
  const std::string dir = temp_dir();
  std::ofstream(dir + "/spec.yaml") << curve_spec(dir, "{type: hyperband, max_t: 27, reduction_factor: 3}", 27,
                                                  {0, 0.3, 0.6, 0.8}, {0.2, 0.6, 1.0});
  auto r = isorun::test::run_captured(ISORUN_CLI, {"sweep", dir + "/spec.yaml", "--no-progress"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  const auto c = count(dir + "/out/results.jsonl");
  CHECK(c.records == 12);
  CHECK(c.pruned > 0);
  CHECK(c.pruned + c.succeeded == 12);
  CHECK_THAT(r.err, Catch::Contains(std::to_string(c.pruned) + " pruned") && Catch::Contains("hyperband used"));
  // sweep.json keeps the rule with every setting; the report marks every bracket's rungs.
  const json identity = json::parse(read_file(dir + "/out/sweep.json"));
  CHECK(identity["scheduler"] ==
        json{{"type", "hyperband"}, {"max_t", 27}, {"grace_period", 1}, {"reduction_factor", 3}});
  const std::string html = read_file(dir + "/out/report.html");
  CHECK(occurrences(html, "<line class=\"rung\"") == 3);  // steps 1, 3, 9 (bracket 3's first rung is 27 = max_t)
  CHECK(occurrences(html, "<polyline class=\"pruned\"") == c.pruned);
  CHECK(lines(dir + "/runs").size() == 12);
  auto again = isorun::test::run_captured(ISORUN_CLI, {"sweep", dir + "/spec.yaml", "--no-progress"});
  CHECK(again.code == 0);
  CHECK(lines(dir + "/runs").size() == 12);
  fs::remove_all(dir);
}

TEST_CASE("--scheduler asha on the command line, with a --grid command sweep", "[sweep][early-stopping][cli]") {
  const std::string dir = temp_dir();
  auto r = isorun::test::run_captured(ISORUN_CLI, {"sweep",    "--grid",        "x=0,0.3,0.6,0.8",
                                                   "--grid",   "y=0.2,0.6,1.0", "--metric",
                                                   "loss:min", "--scheduler",   "asha:max_t=27,reduction_factor=3",
                                                   "--out",    dir + "/out",    "--no-progress",
                                                   "--",       "python3",       CURVE_SCRIPT,
                                                   "--x",      "{x}",           "--y",
                                                   "{y}",      "--max-t",       "27"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  const auto c = count(dir + "/out/results.jsonl");
  CHECK(c.records == 12);
  CHECK(c.pruned > 0);
  CHECK(c.best["params"] == json{{"x", 0.3}, {"y", 0.6}});
  fs::remove_all(dir);
}

TEST_CASE(
    "kill -9 in the middle of an ASHA sweep, then the same command: journaled trials, pruned ones "
    "included, are not run again, and every trial ends journaled once",
    "[sweep][early-stopping][resume]") {
  const std::string dir = temp_dir();
  std::ofstream(dir + "/spec.yaml") << curve_spec(dir, "{type: asha, max_t: 27, grace_period: 1, reduction_factor: 3}",
                                                  27);
  const std::vector<std::string> args = {"sweep", dir + "/spec.yaml", "--no-progress"};
  fs::create_directories(dir + "/out");
  std::ofstream(dir + "/out/results.jsonl").flush();  // there to be watched from the start
  auto sweep = start_cli(args, {});
  REQUIRE(wait_for_lines(dir + "/out/results.jsonl", 20));  // in the middle: rungs partly filled
  ::kill(sweep.pid(), SIGKILL);
  CHECK(sweep.reap().signal == SIGKILL);
  std::set<std::string> before;  // the trials journaled before the kill
  for (const auto& l : lines(dir + "/out/results.jsonl")) before.insert(json::parse(l)["params"].dump());
  const std::size_t reports_before = lines(dir + "/out/reports.jsonl").size();
  CHECK(reports_before > 20);

  const auto resumed = sweep_cli(args);
  INFO(resumed.err);
  CHECK(resumed.code == 0);
  const auto journal = lines(dir + "/out/results.jsonl");
  CHECK(journal.size() == 81);
  std::set<std::string> ids;
  for (const auto& l : journal) ids.insert(json::parse(l)["id"].get<std::string>());
  CHECK(ids.size() == 81);  // each once
  // Each journaled trial started once only (its start line is in `runs` once).
  std::map<std::string, int> starts;
  for (const auto& l : lines(dir + "/runs")) {
    std::istringstream words(l);
    double x = 0, y = 0;
    words >> x >> y;
    ++starts[json{{"x", x}, {"y", y}}.dump()];
  }
  for (const auto& p : before) CHECK(starts[p] == 1);
  CHECK(count(dir + "/out/results.jsonl").best["params"] == json{{"x", 0.3}, {"y", 0.6}});
  CHECK(lines(dir + "/out/reports.jsonl").size() > reports_before);  // the curves go on in the same file
  fs::remove_all(dir);
}

// Reports are made durable in groups, before the records that follow them (report_log::sync):
// a pruned trial's record, durable without the report that got it pruned, would be replayed on
// resume without it. Here the disk stops making reports.jsonl durable from its first fsync on.
TEST_CASE(
    "reports that cannot be made durable: the sweep stops saying so, with no record journaled after them; "
    "the same command then runs every trial",
    "[sweep][early-stopping][faults]") {
  const std::string dir = temp_dir();
  std::ofstream(dir + "/spec.yaml") << curve_spec(dir, "{type: asha, max_t: 9, grace_period: 1, reduction_factor: 3}",
                                                  9, {0, 0.3, 0.8}, {0.2, 0.6});
  const std::vector<std::string> args = {"sweep", dir + "/spec.yaml", "--no-progress"};
  auto first = isorun::test::run_captured(ISORUN_CLI, args, failing_fsync("/out/reports.jsonl", 0));
  INFO(first.err);
  CHECK(first.code != 0);
  CHECK_THAT(first.err, Catch::Contains("cannot write the sweep's reports to") &&
                            Catch::Contains("reports.jsonl: Input/output error"));
  CHECK(lines(dir + "/out/results.jsonl").empty());        // no trial's record: each came after reports not durable
  CHECK_FALSE(lines(dir + "/out/reports.jsonl").empty());  // (they were written, and judged)

  auto second = isorun::test::run_captured(ISORUN_CLI, args);
  INFO(second.err);
  CHECK(second.code == 0);
  CHECK(count(dir + "/out/results.jsonl").records == 6);
  CHECK(lines(dir + "/out/results.jsonl").size() == 6);
  fs::remove_all(dir);
}

TEST_CASE("bad early-stopping input: exit 2 before anything starts, naming the line", "[sweep][early-stopping][spec]") {
  const std::string dir = temp_dir();
  struct bad {
    std::string scheduler, metric, expect;
    int line;
  };
  const std::string cmd = "command: [python3, " CURVE_SCRIPT ", --x, \"{x}\", --y, \"0\"]\n";
  for (const auto& b : std::vector<bad>{
           {"{type: bohb}", "metric: {name: loss, goal: minimize}\n", "unknown scheduler 'bohb'", 3},
           {"{type: hyperband, reduction_factor: 1}", "metric: loss\n", "reduction_factor must be", 3},
           {"{type: asha, max_t: 3, grace_period: 5}", "metric: loss\n", "max_t (3) is below grace_period (5)", 3},
           {"{type: asha, reduction_factor: 1}", "metric: loss\n", "reduction_factor must be", 3},
           {"{type: asha, reduction_factr: 2}", "metric: loss\n", "did you mean 'reduction_factor'", 3},
           {"{type: median}", "", "judges trials by a metric, and the sweep has none", 2},
       }) {
    INFO(b.scheduler);
    std::ofstream(dir + "/spec.yaml", std::ios::trunc)
        << cmd << b.metric << "scheduler: " << b.scheduler << "\nparams: {x: [1, 2]}\nout: \"" << dir << "/out\"\n";
    auto r = isorun::test::run_captured(ISORUN_CLI, {"sweep", dir + "/spec.yaml", "--no-progress"});
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Catch::Contains(b.expect) && Catch::Contains("spec.yaml: line " + std::to_string(b.line)));
    CHECK_FALSE(fs::exists(dir + "/out"));  // nothing started, nothing created
  }
  // The flag's own mistakes name the flag.
  for (const auto& [flag, expect] : std::vector<std::pair<std::string, std::string>>{
           {"asha:max_t=1,grace_period=2", "max_t (1) is below grace_period (2)"},
           {"asha:reduction_factor=1", "reduction_factor must be"},
           {"bohb", "unknown scheduler 'bohb'"},
           {"median:reduction_factor=3", "unknown setting 'reduction_factor' for median"},
           {"asha:max_t=x", "'max_t=x' is not KEY=WHOLE_NUMBER"}}) {
    auto r = isorun::test::run_captured(ISORUN_CLI, {"sweep", "--grid", "x=1", "--metric", "loss:min", "--scheduler",
                                                     flag, "--out", dir + "/out", "--", "true", "{x}"});
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Catch::Contains("--scheduler " + flag) && Catch::Contains(expect));
    CHECK_FALSE(fs::exists(dir + "/out"));
  }
  fs::remove_all(dir);
}

TEST_CASE(
    "C++ tasks report with this_worker().report(); ASHA prunes them, a task asking should_stop() stops "
    "cleanly, and a resume reruns nothing",
    "[sweep][early-stopping][task]") {
  for (const bool clean : {false, true}) {
    INFO((clean ? "the task asks should_stop()" : "the task is killed by the stop"));
    const std::string dir = temp_dir();
    std::ofstream(dir + "/spec.yaml") << "task: curve\nmetric: {name: loss, goal: minimize}\n"
                                         "scheduler: {type: asha, max_t: 27, grace_period: 1, reduction_factor: 3}\n"
                                         "params:\n  x: [0, 0.3, 0.6, 0.8]\n  y: [0.2, 0.6, 1.0]\n  max_t: 27\n"
                                         "  clean: "
                                      << (clean ? "true" : "false") << "\n  runs: \"" << dir
                                      << "/runs\"\nresources: {cpu_slots: 2}\nout: \"" << dir << "/out\"\n";
    auto r = sweep_cli({"--grace", "10s", "sweep", dir + "/spec.yaml", "--no-progress"});
    INFO(r.err);
    REQUIRE(r.code == 0);
    const auto c = count(dir + "/out/results.jsonl");
    CHECK(c.records == 12);
    CHECK(c.pruned > 0);
    REQUIRE(c.best.is_object());
    CHECK(c.best["params"]["x"] == 0.3);
    CHECK(c.best["params"]["y"] == 0.6);
    const json records = read_journal(dir + "/out/results.jsonl");
    std::size_t stopped_early = 0;  // pruned trials the stop reached before their last step
    for (const auto& [params, rec] : records.items()) {
      if (rec["outcome"] != "pruned") continue;
      stopped_early += rec["step"].get<int>() < 27;
      const auto p = json::parse(params);
      CHECK(rec["result"]["loss"].get<double>() == Approx(curve_loss(p["x"], p["y"], rec["step"])));  // its last report
    }
    auto starts = [&] {
      const auto all = lines(dir + "/runs");
      return std::count_if(all.begin(), all.end(), [](const std::string& l) { return l.rfind("stopped", 0) != 0; });
    };
    // Asked, each pruned task saw should_stop() and stopped by itself within the 10 s grace (one
    // that reached its last step before the stop came did not need to); one that never asks is
    // ended by the SIGTERM.
    CHECK(stopped_early > 0);
    CHECK(static_cast<std::size_t>(lines(dir + "/runs").size() - starts()) == (clean ? stopped_early : 0));
    CHECK(starts() == 12);
    auto again = sweep_cli({"sweep", dir + "/spec.yaml", "--no-progress"});
    CHECK(again.code == 0);
    CHECK(starts() == 12);  // nothing reruns
    fs::remove_all(dir);
  }
}

TEST_CASE("a report without the metric stops the sweep at once with exit 2, naming the trial",
          "[sweep][early-stopping]") {
  const std::string dir = temp_dir();
  // The curve's reports call the loss "los": the first report cannot be judged.
  std::ofstream(dir + "/spec.yaml") << "command: [python3, " CURVE_SCRIPT
                                       ", --x, \"{x}\", --y, \"0.5\", --metric, "
                                       "los, --sleep-ms, 0]\nmetric: {name: loss, goal: minimize}\n"
                                       "scheduler: {type: asha, max_t: 81}\nparams: {x: [0, 0.1, 0.2, 0.3, 0.4, 0.5]}\n"
                                       "resources: {cpu_slots: 1}\nout: \""
                                    << dir << "/out\"\n";
  auto r = isorun::test::run_captured(ISORUN_CLI, {"sweep", dir + "/spec.yaml", "--no-progress"});
  CHECK(r.code == 2);
  const std::string first = sw::trial_id("python3 " CURVE_SCRIPT " --x {x} --y 0.5 --metric los --sleep-ms 0",
                                         json{{"x", 0}});
  CHECK_THAT(r.err, Catch::Contains("spec.yaml: line 2") && Catch::Contains("trial " + first + " reported step 1") &&
                        Catch::Contains("without the metric 'loss'") && Catch::Contains("stopped"));
  CHECK(lines(dir + "/out/results.jsonl").empty());  // stopped at the first report: nothing finished
}

TEST_CASE("a scheduler with random search draws its trials without a grid", "[sweep][early-stopping][spec]") {
  const auto s = sw::parse_spec(
      "command: [echo, \"{lr}\"]\nmetric: {name: loss, goal: minimize}\n"
      "scheduler: {type: asha, max_t: 81}\n"
      "random: {count: 300, seed: 1, params: {lr: {loguniform: [1e-4, 1e-1]}}}\n",
      "r.yaml");
  CHECK(s.trials.size() == 300);
  CHECK(s.early_stopping.type == "asha");
  CHECK(s.early_stopping.max_t() == 81);
  CHECK(s.early_stopping.line == 3);
  CHECK(spec_line("command: [echo]\nscheduler: {type: asha, grace_period: 1.5}\n") == 2);
  CHECK(spec_line("command: [echo]\nscheduler: median\n") == -1);  // a type alone takes the defaults
  CHECK(sw::parse_scheduler_flag("none").type.empty());
  const auto f = sw::parse_scheduler_flag("asha:max_t=81,grace_period=3,reduction_factor=4");
  CHECK((f.type == "asha" && f.max_t() == 81 && f.get("grace_period") == 3 && f.get("reduction_factor") == 4));
  const auto h = sw::parse_scheduler_flag("hyperband:max_t=27");
  CHECK((h.type == "hyperband" && h.max_t() == 27 && h.get("grace_period") == 1 && h.get("reduction_factor") == 3));
  CHECK(sw::parse_spec("command: [echo]\nscheduler: asha\n", "a.yaml").early_stopping.max_t() == 100);  // as Ray Tune's
  CHECK(sw::parse_spec("command: [echo]\nscheduler: median\n", "m.yaml").early_stopping.max_t() == 0);
}

TEST_CASE("early stopping on packed GPUs with standby workers, and on trials spanning two GPUs",
          "[sweep][early-stopping][multi-gpu]") {
  for (const std::string resources : {"{gpus: all, mem_limit: 1G, per_gpu: 2, standby: 1}",
                                      "{gpus: all, mem_limit: 1G, per_gpu: 2, gpus_per_trial: 2}"}) {
    INFO(resources);
    const std::string dir = temp_dir();
    std::ofstream(dir + "/spec.yaml") << "task: curve\nmetric: {name: loss, goal: minimize}\n"
                                         "scheduler: {type: asha, max_t: 27, grace_period: 1, reduction_factor: 3}\n"
                                         "params:\n  x: [0, 0.3, 0.6, 0.8]\n  y: [0.2, 0.6, 1.0]\n  max_t: 27\n"
                                         "resources: "
                                      << resources << "\nout: \"" << dir << "/out\"\n";
    auto r = sweep_cli({"sweep", dir + "/spec.yaml", "--no-progress"}, {"ISORUN_SIMULATE_GPUS=2x16G"});
    INFO(r.err);
    REQUIRE(r.code == 0);
    const auto c = count(dir + "/out/results.jsonl");
    CHECK(c.records == 12);
    CHECK(lines(dir + "/out/results.jsonl").size() == 12);
    CHECK(c.pruned > 0);
    REQUIRE(c.best.is_object());
    CHECK(c.best["params"]["x"] == 0.3);
    CHECK(c.best["params"]["y"] == 0.6);
    const json records = read_journal(dir + "/out/results.jsonl");
    for (const auto& [params, rec] : records.items()) {
      const std::string device = rec["device"];
      const bool spans = resources.find("gpus_per_trial") != std::string::npos;
      CHECK(std::count(device.begin(), device.end(), ',') == (spans ? 1 : 0));  // on its GPU(s)
    }
    fs::remove_all(dir);
  }
}
