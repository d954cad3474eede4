// Trackers (spec track:, --track): processes started beside the sweep that read its events as
// JSON lines on stdin. Each is given every report and record in journal order, everything again
// after a restart or a resume, and one that fails, hangs or prints garbage changes nothing of the
// sweep's records. (A recording tracker here is `cat >> FILE`; the MLflow tracker is tested with
// a real MLflow store in python/tests/test_track.py.)
#include <catch2/catch.hpp>

#include <csignal>
#include <map>
#include <set>

#include "sweep_test_support.hpp"

namespace {

// A 3 x 3 grid of the learning-curve script (9 steps each, 5 ms a step) with ASHA, 2 slots,
// its trackers `track` (a YAML mapping).
std::string curve_spec_with(const std::string& dir, const std::string& track) {
  return "command: [python3, " CURVE_SCRIPT
         ", --x, \"{x}\", --y, \"{y}\", --max-t, 9, --sleep-ms, 5]\n"
         "metric: {name: loss, goal: minimize}\n"
         "scheduler: {type: asha, max_t: 9, grace_period: 1, reduction_factor: 3}\n"
         "params: {x: [0, 0.3, 0.6], y: [0.2, 0.6, 1.0]}\n"
         "resources: {cpu_slots: 2}\n"
         "track: " +
         track + "\nout: \"" + dir + "/out\"\n";
}

std::size_t count_pruned(const std::string& journal) {
  std::size_t n = 0;
  for (const auto& l : lines(journal)) n += json::parse(l)["outcome"] == "pruned" ? 1 : 0;
  return n;
}

// A tracker that appends every line it reads to `file`.
std::string recorder(const std::string& file) { return "{command: [sh, -c, \"exec cat >> " + file + "\"]"; }

std::vector<json> events(const std::string& file) {
  std::vector<json> out;
  for (const auto& l : lines(file)) out.push_back(json::parse(l));
  return out;
}

// The events of the last start of the tracker: from its last "sweep" event on.
std::vector<json> last_start(const std::vector<json>& all) {
  std::size_t from = 0;
  for (std::size_t i = 0; i < all.size(); ++i)
    if (all[i]["event"] == "sweep") from = i;
  return {all.begin() + static_cast<std::ptrdiff_t>(from), all.end()};
}

// Checks that `got` (one start's events) holds every line of OUT/events.jsonl and
// OUT/reports.jsonl and every record of OUT/results.jsonl, each once and in the file's
// order, each trial's start before its reports and none of its reports after its end, and ends
// with the sweep's end.
void check_complete(const std::vector<json>& got, const std::string& out) {
  REQUIRE(got.size() >= 2);
  CHECK(got.front()["event"] == "sweep");
  CHECK(got.front()["out"] == out);
  CHECK(got.front()["sweep"]["params"]["x"] == json::array({0, 0.3, 0.6}));
  CHECK(got.front()["sweep"]["metric"]["name"] == "loss");
  std::vector<json> starts, reports, records;
  std::set<std::string> started, ended;
  for (const auto& e : got) {
    const std::string trial = e.value("trial", "");
    if (e["event"] == "start") {
      CHECK(e["attempt"].get<int>() >= 1);
      CHECK(e["params"].contains("x"));
      started.insert(trial);
      starts.push_back(e);
    } else if (e["event"] == "report") {
      CHECK(started.count(trial) == 1);  // after its start
      CHECK(ended.count(trial) == 0);    // none after its trial's end
      reports.push_back({{"trial", e["trial"]}, {"step", e["step"]}, {"metrics", e["metrics"]}});
    } else if (e["event"] == "end") {
      CHECK(started.count(trial) == 1);
      ended.insert(trial);
      records.push_back(e["record"]);
    }
  }
  std::vector<json> journal_reports, journal_records;
  for (const auto& l : lines(out + "/events.jsonl")) journal_reports.push_back(json::parse(l));
  for (const auto& l : lines(out + "/reports.jsonl")) journal_reports.push_back(json::parse(l));
  for (const auto& l : lines(out + "/results.jsonl")) journal_records.push_back(json::parse(l));
  starts.insert(starts.end(), reports.begin(), reports.end());  // as the files hold them
  CHECK(starts == journal_reports);
  CHECK(records == journal_records);
  CHECK(started.size() == journal_records.size());
  CHECK(got.back()["event"] == "sweep_end");
  CHECK(got.back()["report"] == out + "/report.html");
}

// Checks that `got` holds a checkpoint event for each checkpoint each trial committed, `steps`,
// each after its trial's start and before its end, as OUT/events.jsonl has them.
void check_checkpoints(const std::vector<json>& got, const std::string& out, const std::vector<int>& steps) {
  std::map<std::string, std::vector<int>> by_trial;
  std::set<std::string> started, ended;
  std::vector<json> sent;
  for (const auto& e : got) {
    const std::string trial = e.value("trial", "");
    if (e["event"] == "start") started.insert(trial);
    if (e["event"] == "end") ended.insert(trial);
    if (e["event"] != "checkpoint") continue;
    CHECK(started.count(trial) == 1);
    CHECK(ended.count(trial) == 0);
    CHECK(e["attempt"] == 1);
    by_trial[trial].push_back(e["step"].get<int>());
    sent.push_back(e);
  }
  std::vector<json> journal;
  for (const auto& l : lines(out + "/events.jsonl"))
    if (json j = json::parse(l); j["event"] == "checkpoint") journal.push_back(j);
  CHECK(sent == journal);
  const auto records = lines(out + "/results.jsonl");
  CHECK(by_trial.size() == records.size());
  for (const auto& l : records) {
    const json r = json::parse(l);
    INFO(r.dump());
    CHECK(by_trial[r["id"].get<std::string>()] == steps);
    CHECK(r["checkpoint"] == steps.back());
  }
}

}  // namespace

TEST_CASE("a tracker is given the sweep, every report and record in journal order, and the end", "[sweep][track]") {
  const std::string dir = temp_dir();
  std::ofstream(dir + "/spec.yaml") << curve_spec_with(dir, "{rec: " + recorder(dir + "/events") + ", lr: 0.1}}");
  const auto r = sweep_cli({"sweep", dir + "/spec.yaml", "--no-progress"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  const auto got = events(dir + "/events");
  CHECK(got.front()["settings"] == json{{"lr", 0.1}});  // the rest of its mapping
  CHECK(got.front()["folder"] == dir + "/out/track/rec");
  CHECK(fs::is_directory(dir + "/out/track/rec"));
  check_complete(got, dir + "/out");
  CHECK(got.back()["succeeded"] == 9 - count_pruned(dir + "/out/results.jsonl"));  // this run's
  CHECK(fs::file_size(dir + "/out/track/rec.err") == 0);                           // it said nothing
  fs::remove_all(dir);
}

TEST_CASE("kill -9 in the middle of a tracked sweep, then the same command: the tracker is given everything again",
          "[sweep][track][resume]") {
  const std::string dir = temp_dir();
  std::ofstream(dir + "/spec.yaml") << curve_spec_with(dir, "{rec: " + recorder(dir + "/events") + "}}");
  const std::vector<std::string> args = {"sweep", dir + "/spec.yaml", "--no-progress"};
  fs::create_directories(dir + "/out");
  std::ofstream(dir + "/out/results.jsonl").flush();  // there to be watched from the start
  auto sweep = start_cli(args, {});
  REQUIRE(wait_for_lines(dir + "/out/results.jsonl", 3));
  ::kill(sweep.pid(), SIGKILL);
  CHECK(sweep.reap().signal == SIGKILL);  // its tracker goes with it (its cgroup, or its stdin's end)

  const auto resumed = sweep_cli(args);
  INFO(resumed.err);
  REQUIRE(resumed.code == 0);
  const auto all = events(dir + "/events");
  const auto second = last_start(all);
  CHECK(second.size() < all.size());  // the first run's tracker had events too
  check_complete(second, dir + "/out");
  fs::remove_all(dir);
}

TEST_CASE("trackers that exit at once, never read or print garbage change nothing of the sweep; each says why",
          "[sweep][track][errors]") {
  const std::string dir = temp_dir();
  std::ofstream(dir + "/spec.yaml") << curve_spec_with(
      dir,
      "{quits: {command: [sh, -c, \"exit 3\"]},"
      " deaf: {command: [sleep, \"100000\"]},"
      " noisy: {command: [sh, -c, \"echo garbage; exec cat > /dev/null\"]},"
      " rec: " +
          recorder(dir + "/events") + "}}");
  const auto r = sweep_cli({"sweep", dir + "/spec.yaml", "--no-progress"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  // One warning line per failing tracker on the terminal, naming its file.
  CHECK_THAT(r.err, Catch::Contains("isorun: warning: tracker quits exited with code 3") &&
                        Catch::Contains("(its output: " + dir + "/out/track/quits.err)"));
  CHECK_THAT(r.err, Catch::Contains("isorun: warning: tracker deaf took no event for 30 s"));
  CHECK_THAT(read_file(dir + "/out/track/quits.err"), Catch::Contains("tracker quits exited with code 3"));
  CHECK_THAT(read_file(dir + "/out/track/deaf.err"), Catch::Contains("tracker deaf took no event for 30 s"));
  CHECK(read_file(dir + "/out/track/noisy.err") == "garbage\n");
  // The sweep's records are all there, and the tracker beside the failing ones had them all.
  CHECK(lines(dir + "/out/results.jsonl").size() == 9);
  check_complete(events(dir + "/events"), dir + "/out");
  fs::remove_all(dir);
}

TEST_CASE("bad trackers are refused before anything starts, naming what to write", "[sweep][track][errors]") {
  const std::string dir = temp_dir();
  for (const auto& [track, expect] : std::vector<std::pair<std::string, std::string>>{
           {"{wandb: {}}", "track: wandb is not a tracker isorun has (mlflow, tensorboard)"},
           {"{\"a b\": {}}", "a tracker's name is letters, digits, _ and -"},
           {"[mlflow]", "track is a mapping of trackers by name"},
           {"{mine: {command: []}}", "command is a list of words"},
           {"{mlflow: 3}", "track: mlflow is a mapping of its settings"}}) {
    INFO(track);
    std::ofstream(dir + "/spec.yaml", std::ios::trunc) << curve_spec_with(dir, track);
    const auto r = sweep_cli({"sweep", dir + "/spec.yaml", "--no-progress"});
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Catch::Contains(expect) && Catch::Contains("spec.yaml: line 6"));
    CHECK_FALSE(fs::exists(dir + "/out"));
  }
  const auto r = sweep_cli({"sweep", "--grid", "x=1", "--track", "wandb", "--out", dir + "/out", "--", "true", "{x}"});
  CHECK(r.code == 2);
  CHECK_THAT(r.err, Catch::Contains("--track wandb: not a tracker isorun has"));
  CHECK_FALSE(fs::exists(dir + "/out"));
  fs::remove_all(dir);
}

TEST_CASE("a tracker is given each checkpoint as it is committed: a command's, and a task's that commits its own",
          "[sweep][track][checkpoints]") {
  const std::string dir = temp_dir();
  std::ofstream(dir + "/command.yaml") << "command: [sh, " CHECKPOINTED_TRIAL ", \"" << dir
                                       << "/steps\", '30', '10', '{i}']\nparams: {i: [0, 1, 2]}\n"
                                          "resources: {cpu_slots: 2}\ncheckpoints: {keep: 2}\n"
                                          "track: {rec: "
                                       << recorder(dir + "/command-events") << "}}\nout: \"" << dir << "/command\"\n";
  const auto command = sweep_cli({"sweep", dir + "/command.yaml", "--no-progress"});
  INFO(command.err);
  REQUIRE(command.code == 0);
  check_checkpoints(events(dir + "/command-events"), dir + "/command", {10, 20, 30});

  std::ofstream(dir + "/task.yaml") << "task: checkpointed\nparams:\n  i: [0, 1]\n  steps: [30]\n  every: [10]\n"
                                       "  log: [\""
                                    << dir << "/task-steps\"]\nresources: {cpu_slots: 2}\ncheckpoints: {keep: 2}\n"
                                    << "track: {rec: " << recorder(dir + "/task-events") << "}}\nout: \"" << dir
                                    << "/task\"\n";
  const auto task = sweep_cli({"sweep", dir + "/task.yaml", "--no-progress"});
  INFO(task.err);
  REQUIRE(task.code == 0);
  check_checkpoints(events(dir + "/task-events"), dir + "/task", {10, 20, 30});
  fs::remove_all(dir);
}
