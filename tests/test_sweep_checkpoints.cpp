// Trials that keep their progress: checkpoints committed whole, handed to every later attempt (a
// crash retry, an out-of-memory retry, a sweep resumed after kill -9), the warning before a
// planned stop, preempted trials, early stopping across resumes, and the input that is refused.
#include <catch2/catch.hpp>

#include <sys/file.h>

#include <random>

#include "isorun/worker/checkpoint.hpp"
#include "sweep_test_support.hpp"

namespace {

// A spec of `n` command trials of checkpointed_trial.sh (`steps` steps, a checkpoint every
// `every`), their steps logged to `log`.
std::string checkpointed(int n, int steps, int every, const std::string& log, const std::string& out,
                         const std::string& mode = "", const std::string& more = "") {
  std::string s = "command: [sh, " + std::string(CHECKPOINTED_TRIAL) + ", \"" + log + "\", '" + std::to_string(steps) +
                  "', '" + std::to_string(every) + "', '{i}'" + (mode.empty() ? "" : ", '" + mode + "'") +
                  "]\nparams:\n  i: [";
  for (int i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(i);
  return s + "]\nresources: {cpu_slots: 2}\ncheckpoints: {keep: 2}\nout: \"" + out + "\"\n" + more;
}

// Blocks until every trial process that took the shared lock on `log`.lock is gone.
void wait_for_trials_gone(const std::string& log) {
  const int fd = ::open((log + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  REQUIRE(fd >= 0);
  REQUIRE(::flock(fd, LOCK_EX) == 0);
  ::close(fd);
}

// The steps each trial did, in order, from the trials' own log; `until` line counts split it
// into the runs of the sweep (a kill -9 between each two).
using steps_by_run = std::map<std::string, std::vector<std::vector<int>>>;
steps_by_run steps_done(const std::string& log, const std::vector<std::size_t>& until) {
  steps_by_run done;
  const auto all = lines(log);
  std::size_t run = 0;
  for (std::size_t i = 0; i < all.size(); ++i) {
    while (run < until.size() && i >= until[run]) ++run;
    std::istringstream in(all[i]);
    std::string trial;
    int step = 0;
    if (!(in >> trial >> step)) continue;
    auto& runs = done[trial];
    runs.resize(until.size() + 1);
    runs[run].push_back(step);
  }
  return done;
}

std::vector<json> journal_records(const fs::path& file) {
  std::vector<json> out;
  for (const auto& l : lines(file)) out.push_back(json::parse(l));
  return out;
}

}  // namespace

TEST_CASE(
    "checkpointed trials survive three kill -9 of the sweep: each resume redoes at most the steps since the "
    "last checkpoint the trial announced",
    "[sweep][checkpoints][resume]") {
  const std::string dir = temp_dir(), log = dir + "/steps", out = dir + "/out";
  std::ofstream(dir + "/spec.yaml") << checkpointed(20, 100, 10, log, out);
  std::ofstream{log};
  const std::vector<std::string> args = {"sweep", dir + "/spec.yaml", "--no-progress"};
  // Three kill points at random, in the steps the trials log (2000 in all).
  std::random_device seed_source;
  const unsigned seed = seed_source();
  INFO("seed " << seed);
  std::mt19937 random(seed);
  std::vector<std::size_t> kill_at;
  for (int k = 0; k < 3; ++k) kill_at.push_back(std::uniform_int_distribution<std::size_t>(100, 1900)(random));
  std::sort(kill_at.begin(), kill_at.end());
  std::vector<std::size_t> until;  // the log's length when each killed run's trials were gone
  for (const std::size_t at : kill_at) {
    auto sweep = start_cli(args, {});
    REQUIRE(wait_for_lines(log, std::max(at, lines(log).size() + 1)));
    ::kill(sweep.pid(), SIGKILL);
    CHECK(sweep.reap().signal == SIGKILL);
    wait_for_trials_gone(log);  // (the trials go with their supervisor)
    until.push_back(lines(log).size());
  }
  const auto last = sweep_cli(args);
  REQUIRE(last.code == 0);
  const auto done = steps_done(log, until);
  REQUIRE(done.size() == 20);
  std::int64_t redone_logged = 0;
  for (const auto& [trial, runs] : done) {
    INFO("trial " << trial);
    std::set<int> seen;
    for (std::size_t r = 0; r < runs.size(); ++r) {
      int redone = 0;
      for (int step : runs[r]) redone += seen.count(step) > 0;
      // At most one checkpoint's steps (10) per interruption: a checkpoint the trial announced
      // just before the kill, which the killed supervisor never read or committed, is in its log
      // (the command writes it) and committed by the next attempt.
      CHECK(redone <= 10);
      redone_logged += redone;
      seen.insert(runs[r].begin(), runs[r].end());
    }
    CHECK(seen.size() == 100);  // every step done
    CHECK(*seen.begin() == 1);
    CHECK(*seen.rbegin() == 100);
  }
  const auto records = journal_records(out + "/results.jsonl");
  std::set<std::string> succeeded;
  std::int64_t redone_journaled = 0;
  for (const auto& r : records) {
    if (r["outcome"] != "success") continue;
    succeeded.insert(r["id"].get<std::string>());
    CHECK(r["result"]["steps"] == 100);
    CHECK(r["checkpoint"] == 100);
    redone_journaled += r.value("steps_redone", 0);
    for (const auto& resume : r.value("resumes", json::array())) {
      CHECK(resume["from"].get<int>() % 10 == 0);
      CHECK(resume["redone"].get<int>() <= 10);
    }
  }
  CHECK(succeeded.size() == 20);
  const auto resumed = std::count_if(records.begin(), records.end(),
                                     [](const json& r) { return r.contains("resumes"); });
  CHECK(resumed > 0);  // trials that were under way at a kill went on from a checkpoint
  // What the sweep saw of the steps redone is what the trials' logs say, less what a killed
  // sweep had not yet copied from a trial's output.
  CHECK(redone_journaled <= redone_logged);
  // Only the latest two are kept; nothing staged is left.
  for (const auto& id : succeeded) {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(out + "/checkpoints/" + id))
      if (e.path().filename() != "resumes.jsonl") names.push_back(e.path().filename());  // (a trial that resumed)
    std::sort(names.begin(), names.end());
    CHECK(names == std::vector<std::string>{"step-000000000090", "step-000000000100", "tmp"});
  }
  const std::string csv = read_file(out + "/results.csv");
  CHECK_THAT(csv, Catch::Contains("checkpoint") && Catch::Contains("steps_redone"));
  const std::string report = read_file(out + "/report.html");
  CHECK_THAT(report, Catch::Contains("steps redone") && Catch::Contains("\"steps_redone\""));
  fs::remove_all(dir);
}

TEST_CASE(
    "a crash retry resumes from the trial's checkpoint; the record says where; early stopping counts each "
    "step once",
    "[sweep][checkpoints]") {
  const std::string dir = temp_dir(), log = dir + "/steps", out = dir + "/out";
  // (A median rule that never stops anything here: it judges, and logs, every report.)
  std::ofstream(dir + "/spec.yaml") << checkpointed(2, 40, 10, log, out, "crash:25",
                                                    "policy: {retries: {crashed: 2}}\nmetric: {name: loss, goal: "
                                                    "minimize}\nscheduler: {type: median, grace_period: 1000}\n");
  const auto r = sweep_cli({"sweep", dir + "/spec.yaml", "--no-progress"});
  REQUIRE(r.code == 0);
  for (const auto& [trial, runs] : steps_done(log, {})) {
    const std::vector<int>& steps = runs.front();
    // 1..25 (it crashed at 25), then 21..40 from the checkpoint at 20: steps 21-25 redone.
    std::vector<int> expected;
    for (int s = 1; s <= 25; ++s) expected.push_back(s);
    for (int s = 21; s <= 40; ++s) expected.push_back(s);
    CHECK(steps == expected);
  }
  const auto records = journal_records(out + "/results.jsonl");
  REQUIRE(records.size() == 2);
  for (const auto& rec : records) {
    CHECK(rec["outcome"] == "success");
    CHECK(rec["attempts"] == 2);
    REQUIRE(rec["resumes"].size() == 1);
    CHECK(rec["resumes"][0]["from"] == 20);
    CHECK(rec["resumes"][0]["attempt"] == 2);
    CHECK(rec["resumes"][0]["redone"] == 5);
    CHECK(rec["steps_redone"] == 5);
  }
  // Steps 21-25, reported again after the crash, were judged (and logged) once.
  std::map<std::string, std::vector<int>> judged;
  for (const auto& l : lines(out + "/reports.jsonl")) {
    const json r = json::parse(l);
    judged[r["trial"].get<std::string>()].push_back(r["step"].get<int>());
  }
  REQUIRE(judged.size() == 2);
  std::vector<int> each;
  for (int s = 1; s <= 40; ++s) each.push_back(s);
  for (const auto& [trial, steps] : judged) CHECK(steps == each);
  fs::remove_all(dir);
}

TEST_CASE("an out-of-memory retry at a larger cap starts from the checkpoint (a task trial)",
          "[sweep][checkpoints][oom-retry]") {
  const std::string dir = temp_dir(), log = dir + "/steps", out = dir + "/out";
  std::ofstream(dir + "/spec.yaml") << "task: checkpointed\nparams:\n  i: [0]\n  steps: [40]\n  every: [10]\n"
                                       "  grow_at: [25]\n  mib: [96]\n  log: [\""
                                    << log
                                    << "\"]\nresources: {gpus: [0], mem_limit: 64M}\n"
                                       "policy: {oom_retry: {factor: 2, max: 256M}}\ncheckpoints: {keep: 2}\nout: \""
                                    << out << "\"\n";
  const auto r = sweep_cli({"sweep", dir + "/spec.yaml", "--no-progress"}, {"ISORUN_SIMULATE_GPUS=1x1G"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  const auto done = steps_done(log, {});
  std::vector<int> expected;
  for (int s = 1; s <= 25; ++s) expected.push_back(s);   // out of memory at 25 under 64 MiB
  for (int s = 21; s <= 40; ++s) expected.push_back(s);  // at 128 MiB, from the checkpoint at 20
  CHECK(done.at("0").front() == expected);
  const auto records = journal_records(out + "/results.jsonl");
  REQUIRE(records.size() == 2);
  CHECK(records[0]["outcome"] == "out_of_memory");
  CHECK(records[0]["retry_mem_limit"] == 128 << 20);
  CHECK(records[0]["checkpoint"] == 20);
  CHECK(records[1]["outcome"] == "success");
  CHECK(records[1]["result"] == 40);
  REQUIRE(records[1]["resumes"].size() == 1);
  CHECK(records[1]["resumes"][0]["from"] == 20);
  CHECK(records[1]["resumes"][0]["redone"] == 5);
  fs::remove_all(dir);
}

TEST_CASE("at a timeout the trial is warned first: its last checkpoint is the one it saved then",
          "[sweep][checkpoints]") {
  const std::string dir = temp_dir(), log = dir + "/steps", out = dir + "/out";
  std::ofstream(dir + "/spec.yaml") << checkpointed(1, 100, 10, log, out, "warned", "policy: {timeout: 1s}\n");
  const auto r = sweep_cli({"--grace", "30s", "sweep", dir + "/spec.yaml", "--no-progress"});
  CHECK(r.code != 0);  // the trial timed out
  const auto records = journal_records(out + "/results.jsonl");
  REQUIRE(records.size() == 1);
  CHECK(records[0]["outcome"] == "timeout");
  CHECK(records[0]["checkpoint"] == 11);  // saved on the warning, after the one at step 10
  const std::string id = records[0]["id"];
  CHECK(lines(out + "/checkpoints/" + id + "/step-000000000011/state") == std::vector<std::string>{"10"});
  CHECK(lines(log).back() == id + " warned");
  fs::remove_all(dir);
}

TEST_CASE("a sweep stopped by Ctrl-C warns its trials: preempted, they go on from their checkpoint when resumed",
          "[sweep][checkpoints][resume]") {
  const std::string dir = temp_dir(), log = dir + "/steps", out = dir + "/out";
  std::ofstream(dir + "/spec.yaml") << checkpointed(2, 30, 10, log, out);
  std::ofstream{log};
  const std::vector<std::string> args = {"--grace", "30s", "sweep", dir + "/spec.yaml", "--no-progress"};
  {
    auto sweep = start_cli(args, {"TRIAL_MODE=warned"});
    REQUIRE(
        wait_for_lines(log, 22));  // both trials at their checkpoint at step 10, waiting (10 steps + "waiting" each)
    ::kill(sweep.pid(), SIGINT);
    CHECK(sweep.reap().code != 0);
  }
  auto records = journal_records(out + "/results.jsonl");
  REQUIRE(records.size() == 2);
  for (const auto& rec : records) {
    CHECK(rec["outcome"] == "preempted");  // neither a success nor a failure
    CHECK(rec["checkpoint"] == 11);        // saved on the warning
    CHECK_FALSE(rec.contains("error"));
  }
  const auto csv = read_file(out + "/results.csv");
  CHECK(occurrences(csv, "preempted") == 2);
  // Resumed (the trials no longer wait): each goes on from the step it saved, to its end.
  const auto resumed = sweep_cli(args);
  REQUIRE(resumed.code == 0);
  const auto done = steps_done(log, {});
  REQUIRE(done.size() == 2);
  for (const auto& [trial, runs] : done) {
    std::vector<int> expected;
    for (int s = 1; s <= 30; ++s) expected.push_back(s);
    CHECK(runs.front() == expected);  // no step done twice
  }
  records = journal_records(out + "/results.jsonl");
  REQUIRE(records.size() == 4);
  for (std::size_t i = 2; i < 4; ++i) {
    CHECK(records[i]["outcome"] == "success");
    CHECK(records[i]["resumes"][0]["from"] == 11);
    CHECK(records[i]["steps_redone"] == 0);
  }
  fs::remove_all(dir);
}

TEST_CASE(
    "a trial stopped by a SIGTERM isorun did not send (a batch system's stop, which may reach it before "
    "isorun) is preempted and goes on from its checkpoint at once",
    "[sweep][checkpoints]") {
  const std::string dir = temp_dir(), log = dir + "/steps", out = dir + "/out";
  std::ofstream(dir + "/spec.yaml") << checkpointed(1, 30, 10, log, out, "warned-once");
  std::ofstream{log};
  auto sweep = start_cli({"sweep", dir + "/spec.yaml", "--no-progress"}, {});
  REQUIRE(wait_for_lines(log, 11));  // at its checkpoint at step 10, waiting
  std::string pid_file;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("steps.pid.", 0) == 0) pid_file = e.path().string();
  REQUIRE(!pid_file.empty());
  REQUIRE(::kill(std::stoi(lines(pid_file).at(0)), SIGTERM) == 0);
  CHECK(sweep.reap().code == 0);
  std::vector<int> expected;
  for (int s = 1; s <= 30; ++s) expected.push_back(s);
  const auto done = steps_done(log, {});
  REQUIRE(done.size() == 1);
  CHECK(done.begin()->second.front() == expected);  // no step done twice
  const auto records = journal_records(out + "/results.jsonl");
  REQUIRE(records.size() == 2);
  CHECK(records[0]["outcome"] == "preempted");
  CHECK(records[0]["checkpoint"] == 10);
  CHECK(records[1]["outcome"] == "success");
  CHECK(records[1]["attempts"] == 2);
  CHECK(records[1]["resumes"][0]["from"] == 10);
  CHECK(records[1]["steps_redone"] == 0);
  fs::remove_all(dir);
}

TEST_CASE("a trial that stops itself with SIGTERM is resumed only while it saves further: then it has crashed",
          "[sweep][checkpoints]") {
  const std::string dir = temp_dir(), log = dir + "/steps", out = dir + "/out";
  // Checkpoints at 10 and 20; SIGTERM to itself at step 15, every attempt.
  std::ofstream(dir + "/spec.yaml") << checkpointed(1, 30, 10, log, out, "term:15");
  const auto r = sweep_cli({"sweep", dir + "/spec.yaml", "--no-progress"});
  CHECK(r.code == 1);
  const auto records = journal_records(out + "/results.jsonl");
  REQUIRE(records.size() == 2);
  CHECK(records[0]["outcome"] == "preempted");  // it had saved step 10 since it started
  CHECK(records[1]["outcome"] == "crashed");    // resumed from 10, it saved nothing new
  CHECK(records[1]["checkpoint"] == 10);
  CHECK(records[1]["error"].get<std::string>().find("SIGTERM") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE(
    "checkpoint input isorun refuses: keep below 1, a step that goes back, a folder that is a link or "
    "not writable",
    "[sweep][checkpoints][hostile]") {
  CHECK_THROWS_WITH(sw::parse_spec("command: [true]\ncheckpoints: {keep: 0}\n", "t.yaml"),
                    Catch::Contains("line 2") && Catch::Contains("keep must be a whole number from 1"));
  CHECK_THROWS_WITH(sw::parse_spec("command: [true]\ncheckpoints: {signal: SIGKILL}\n", "t.yaml"),
                    Catch::Contains("SIGKILL") && Catch::Contains("SIGUSR1"));
  CHECK_THROWS_WITH(sw::parse_spec("command: [true]\ncheckpoints: {kep: 2}\n", "t.yaml"),
                    Catch::Contains("unknown key 'kep'") && Catch::Contains("keep"));
  CHECK_THROWS_WITH(isorun::checkpoint_folder("/tmp/x", 0), Catch::Contains("keep 0"));

  const std::string dir = temp_dir();
  isorun::checkpoint_folder folder(dir + "/checkpoints/t", 2);
  auto staged = folder.stage(20);
  std::ofstream(staged / "state") << "20";
  CHECK(folder.commit(staged, 20).step == 20);
  auto back = folder.stage(10);
  CHECK_THROWS_WITH(folder.commit(back, 10),
                    Catch::Contains("checkpoint step 10 is not after the latest committed one, 20"));
  CHECK(fs::exists(back));  // nothing lost: what was staged is still there, the latest unchanged
  CHECK(folder.latest()->step == 20);
  // A half-written checkpoint (a staging folder never committed) is never handed out.
  CHECK(folder.committed().size() == 1);

  // A link where the folder should be: refused, naming it, the target untouched.
  fs::create_directories(dir + "/elsewhere");
  fs::create_directory_symlink(dir + "/elsewhere", dir + "/checkpoints/linked");
  CHECK_THROWS_WITH(isorun::checkpoint_folder(dir + "/checkpoints/linked", 2),
                    Catch::Contains(dir + "/checkpoints/linked is a symbolic link"));

  // A sweep whose checkpoint folder is a link, or cannot be written: refused before anything runs.
  const std::string out = dir + "/out", log = dir + "/steps";
  std::ofstream(dir + "/spec.yaml") << checkpointed(1, 10, 5, log, out);
  fs::create_directories(out);
  fs::create_directory_symlink(dir + "/elsewhere", out + "/checkpoints");
  auto linked = sweep_cli({"sweep", dir + "/spec.yaml", "--no-progress"});
  CHECK(linked.code == 2);
  CHECK_THAT(linked.err, Catch::Contains(out + "/checkpoints"));
  CHECK_FALSE(fs::exists(log));  // nothing ran
  fs::remove(out + "/checkpoints");
  fs::create_directories(out + "/checkpoints");
  if (std::system(("chattr +i '" + out + "/checkpoints' 2>/dev/null").c_str()) == 0) {
    auto locked = sweep_cli({"sweep", dir + "/spec.yaml", "--no-progress"});
    [[maybe_unused]] int undo = std::system(("chattr -i '" + out + "/checkpoints'").c_str());
    CHECK(locked.code == 2);
    CHECK_THAT(locked.err, Catch::Contains(out + "/checkpoints is not writable"));
    CHECK_FALSE(fs::exists(log));
  } else {
    WARN("chattr +i is not available here: the unwritable checkpoint folder is not tried");
  }
  fs::remove_all(dir);
}

TEST_CASE(
    "a checkpoint at the largest step a command can announce, INT64_MAX, is listed, resumed from, and the one "
    "before it pruned",
    "[sweep][checkpoints]") {
  const std::string dir = temp_dir(), out = dir + "/out";
  // Checkpoints 5 and INT64_MAX, then a failure; the retry writes down where it resumed from.
  std::ofstream(dir + "/trial.sh")
      << "if [ -n \"$ISORUN_RESUME_FROM\" ]; then\n"
         "  echo \"$ISORUN_RESUME_STEP $(cat \"$ISORUN_RESUME_FROM/state\")\" > \"$1\"; exit 0\n"
         "fi\n"
         "for s in 5 9223372036854775807; do\n"
         "  mkdir \"$ISORUN_CHECKPOINT_DIR/tmp-$s\" && echo $s > \"$ISORUN_CHECKPOINT_DIR/tmp-$s/state\"\n"
         "  echo \"{\\\"checkpoint\\\": $s}\"\n"
         "done\n"
         "exit 1\n";
  std::ofstream(dir + "/spec.yaml") << "command: [sh, \"" << dir << "/trial.sh\", \"" << dir
                                    << "/resumed\", '{i}']\nparams: {i: [0]}\ncheckpoints: {keep: 1}\n"
                                       "policy: {retries: {task_error: 1}}\nout: \""
                                    << out << "\"\n";
  const auto r = sweep_cli({"sweep", dir + "/spec.yaml", "--no-progress"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(lines(dir + "/resumed") == std::vector<std::string>{"9223372036854775807 9223372036854775807"});
  const auto records = journal_records(out + "/results.jsonl");
  REQUIRE(records.size() == 1);
  CHECK(records[0]["attempts"] == 2);
  CHECK(records[0]["checkpoint"] == INT64_MAX);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(out + "/checkpoints/" + records[0]["id"].get<std::string>()))
    if (e.path().filename() != "resumes.jsonl") names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"step-9223372036854775807", "tmp"});  // step 5 pruned (keep: 1)
  fs::remove_all(dir);
}
