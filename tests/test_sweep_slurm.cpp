// Sweeps on Slurm (a real single-node cluster, started by tests/slurm/run_tests.sh).
#include <catch2/catch.hpp>
#include <numeric>

#include "isorun/sweep/slurm.hpp"
#include "sweep_test_support.hpp"

namespace {

// Blocks until `done()` holds, checking every 50 ms: Slurm's state is only seen by asking it.
// A bound of 60 s turns a hang into a failure.
template <class F>
bool eventually(F&& done) {
  for (int i = 0; i < 1200; ++i) {
    if (done()) return true;
    ::usleep(50'000);
  }
  return done();
}

// How many tasks of `job` Slurm has queued or running; SIZE_MAX where Slurm did not answer.
std::size_t in_queue(const std::string& job) {
  const auto active = sw::slurm::active_tasks(job);
  return active ? active->size() : SIZE_MAX;
}

json read_json(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in, nullptr, false);
}

}  // namespace
TEST_CASE("Slurm's end states map to outcome classes", "[sweep][slurm-states]") {
  using sw::slurm::outcome_of;
  CHECK(outcome_of("TIMEOUT") == isorun::outcome_kind::timeout);
  CHECK(outcome_of("OUT_OF_MEMORY") == isorun::outcome_kind::out_of_memory);
  CHECK(outcome_of("CANCELLED") == isorun::outcome_kind::crashed);  // someone's scancel: lost, retried by policy
  CHECK(outcome_of("NODE_FAIL") == isorun::outcome_kind::crashed);
  CHECK(outcome_of("PREEMPTED") == isorun::outcome_kind::crashed);
  CHECK(outcome_of("FAILED") == isorun::outcome_kind::crashed);
}
TEST_CASE("a sweep on Slurm: one job array, each trial on the GPU Slurm gave its array task", "[slurm]") {
  const std::string dir = temp_dir();
  fs::create_directories(dir + "/markers");
  // A space and a '%' in the output folder, and an option whose value a shell would split: every
  // setting reaches sbatch as one argument, and the logs land where the folder says.
  const std::string out = dir + "/out a%j";
  std::ofstream(dir + "/spec.yaml") << "task: gpu_span\nparams:\n  i: {range: [0, 9], step: 1}\n  dir: [\"" << dir
                                    << "/markers\"]\nresources: {backend: slurm, gpus: all, mem_limit: 1G, per_gpu: 1, "
                                       "gpus_per_node: 1, max_running: 4, partition: test, "
                                       "extra: [\"--comment=two words; touch "
                                    << dir << "/pwned\"]}\nout: \"" << out << "\"\n";
  auto r = sweep_cli({"sweep", dir + "/spec.yaml", "--no-progress"}, {"ISORUN_SIMULATE_GPUS=2x16G"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.err, Catch::Contains("submitted 10 trials as Slurm job array"));
  const auto sbatch = read_json(out + "/slurm/batch-1.json")["sbatch"];
  CHECK(std::count(sbatch.begin(), sbatch.end(), "--array=0-9%4") == 1);
  CHECK(std::count(sbatch.begin(), sbatch.end(), "--gres=gpu:1") == 1);
  CHECK(std::count(sbatch.begin(), sbatch.end(), "--partition=test") == 1);
  CHECK(!fs::exists(dir + "/pwned"));
  std::size_t logs = 0;
  for (const auto& e : fs::directory_iterator(out + "/slurm/logs")) logs += e.path().extension() == ".out";
  CHECK(logs == 10);  // one per array task, JOB_TASK.out, not a file named after an expanded %j
  const auto journal = lines(out + "/results.jsonl");
  REQUIRE(journal.size() == 10);
  std::set<std::string> gpus;
  for (const auto& l : journal) {
    const json t = json::parse(l);
    CHECK(t["outcome"] == "success");
    CHECK(t["result"]["visible"] == t["device"]);  // the GPU Slurm's gres gave the array task
    gpus.insert(t["device"].get<std::string>());
  }
  CHECK(gpus == std::set<std::string>{"GPU-sim-0", "GPU-sim-1"});
  CHECK(read_json(out + "/slurm/jobs.json") == json::array());  // nothing in flight
  CHECK(fs::is_empty(out + "/slurm/results"));                  // every record journaled
  CHECK(fs::exists(out + "/report.html"));
  fs::remove_all(dir);
}
TEST_CASE("on Slurm, an array task that dies leaves its trial to the retry policy, in a new array", "[slurm]") {
  const std::string dir = temp_dir();
  fs::create_directories(dir + "/m1");
  fs::create_directories(dir + "/m2");
  auto spec = [&](const std::string& name, const std::string& markers, const std::string& policy) {
    std::ofstream(dir + "/" + name) << "task: die_once\nparams:\n  arg0: [1, 2, 3]\n  arg1: [\"" << markers
                                    << "\"]\nresources: {backend: slurm, cpu_slots: 1}\n"
                                    << policy << "out: \"" << dir << "/" << name << ".out\"\n";
    return dir + "/" + name;
  };
  // Retried: the first attempt of each trial kills its array task's isorun; the second succeeds.
  auto r = sweep_cli(
      {"sweep", spec("retried.yaml", dir + "/m1", "policy: {retries: {crashed: 1}}\n"), "--no-progress"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(fs::exists(dir + "/retried.yaml.out/slurm/batch-2.json"));  // the lost trials, in a new array
  for (const auto& l : lines(dir + "/retried.yaml.out/results.jsonl")) {
    const json t = json::parse(l);
    CHECK(t["outcome"] == "success");
    CHECK(t["attempts"] == 2);
  }
  // Not retried: each is journaled as crashed, saying how Slurm says its task ended.
  auto once = sweep_cli({"sweep", spec("once.yaml", dir + "/m2", ""), "--no-progress"});
  INFO(once.err);
  CHECK(once.code == 1);
  const auto journal = lines(dir + "/once.yaml.out/results.jsonl");
  REQUIRE(journal.size() == 3);
  for (const auto& l : journal) {
    const json t = json::parse(l);
    CHECK(t["outcome"] == "crashed");
    CHECK_THAT(t["error"].get<std::string>(), Catch::Contains("Slurm array task") && Catch::Contains("ended FAILED"));
  }
  fs::remove_all(dir);
}
TEST_CASE("on Slurm: Ctrl-C cancels the arrays; --detach returns at once and running again journals the rest",
          "[slurm]") {
  const std::string dir = temp_dir();
  fs::create_directories(dir + "/m");
  std::ofstream(dir + "/wait.yaml") << "task: wait_marked\nparams:\n  arg0: [1, 2]\n  arg1: [\"" << dir
                                    << "/m\"]\nresources: {backend: slurm, cpu_slots: 1}\nout: \"" << dir << "/w\"\n";
  auto sweep = isorun::test::start_captured(
      ISORUN_CLI, {"--tasks", SWEEP_TEST_TASKS, "--grace", "1s", "sweep", dir + "/wait.yaml", "--no-progress"});
  REQUIRE(eventually([&] { return fs::exists(dir + "/m/1.running") && fs::exists(dir + "/m/2.running"); }));
  const json jobs = read_json(dir + "/w/slurm/jobs.json");
  REQUIRE(jobs.size() == 1);
  const std::string job = jobs[0]["job"];
  CHECK(in_queue(job) == 2);
  ::kill(sweep.process.pid(), SIGINT);
  auto stopped = isorun::test::finish_captured(sweep);
  INFO(stopped.err);
  CHECK(stopped.code == 130);
  CHECK(eventually([&] { return in_queue(job) == 0; }));  // scancel'ed
  CHECK(lines(dir + "/w/results.jsonl").empty());         // cancelled trials are not journaled: a resume runs them

  std::ofstream(dir + "/quick.yaml") << "task: plain_number\nparams:\n  arg0: [1, 2, 3, 4]\n"
                                        "resources: {backend: slurm, cpu_slots: 1, trials_per_task: 2}\nout: \""
                                     << dir << "/q\"\n";
  auto detached = sweep_cli({"sweep", dir + "/quick.yaml", "--no-progress", "--detach"});
  INFO(detached.err);
  REQUIRE(detached.code == 0);
  CHECK_THAT(detached.err, Catch::Contains("detached"));
  CHECK(read_json(dir + "/q/slurm/jobs.json").size() == 1);
  CHECK(read_json(dir + "/q/slurm/batch-1.json")["tasks"].size() == 2);  // 2 trials per array task
  auto status = isorun::test::run_captured(ISORUN_CLI, {"status", dir + "/q"});
  CHECK(status.code == 0);
  CHECK_THAT(status.out, Catch::Contains("Slurm job array"));
  auto attached = sweep_cli({"sweep", dir + "/quick.yaml", "--no-progress", "--attach"});
  INFO(attached.err);
  REQUIRE(attached.code == 0);
  CHECK(lines(dir + "/q/results.jsonl").size() == 4);
  CHECK_FALSE(fs::exists(dir + "/q/slurm/batch-2.json"));  // nothing was submitted twice
  fs::remove_all(dir);
}
TEST_CASE("on Slurm: a node's usage error is not retried; the submitter says it and exits 2", "[slurm]") {
  // The submitter has no GPU to check `gpus: all` against (they are the nodes'); here the node has
  // none either, so each array task's isorun refuses its trials with exit 2.
  const std::string dir = temp_dir();
  fs::create_directories(dir + "/markers");
  std::ofstream(dir + "/spec.yaml") << "task: gpu_span\nparams:\n  i: [0, 1]\n  dir: [\"" << dir
                                    << "/markers\"]\nresources: {backend: slurm, gpus: all, mem_limit: 1G, "
                                       "gpus_per_node: 1}\npolicy: {retries: {crashed: 2}}\nout: \""
                                    << dir << "/out\"\n";
  auto r = sweep_cli({"sweep", dir + "/spec.yaml", "--no-progress"});
  INFO(r.err);
  CHECK(r.code == 2);
  CHECK_THAT(r.err, Catch::Contains("refused its trials: ") && Catch::Contains("GPU") &&
                        Catch::Contains(dir + "/out/slurm/logs/"));
  std::size_t submitted = 0;
  for (std::size_t at = 0; (at = r.err.find("submitted ", at)) != std::string::npos; ++at) ++submitted;
  CHECK(submitted == 1);  // not retried
  CHECK(read_json(dir + "/out/slurm/jobs.json") == json::array());
  CHECK(lines(dir + "/out/results.jsonl").empty());
  fs::remove_all(dir);
}
TEST_CASE("on Slurm: a scancel'ed array task's trial is retried; a partition the cluster lacks is refused", "[slurm]") {
  const std::string dir = temp_dir();
  fs::create_directories(dir + "/m");
  std::ofstream(dir + "/m/2.running");  // trial 2 finishes at once; trial 1 waits, the first time
  std::ofstream(dir + "/spec.yaml")
      << "task: wait_once\nparams:\n  arg0: [1, 2]\n  arg1: [\"" << dir
      << "/m\"]\nresources: {backend: slurm, cpu_slots: 1}\npolicy: {retries: {crashed: 1}}\n"
         "out: \""
      << dir << "/out\"\n";
  auto sweep = isorun::test::start_captured(
      ISORUN_CLI, {"--tasks", SWEEP_TEST_TASKS, "sweep", dir + "/spec.yaml", "--no-progress"});
  REQUIRE(eventually([&] { return fs::exists(dir + "/m/1.running"); }));
  const json batch = read_json(dir + "/out/slurm/batch-1.json");
  const json jobs = read_json(dir + "/out/slurm/jobs.json");
  REQUIRE(jobs.size() == 1);
  const int task = batch["tasks"][0][0] == 0 ? 0 : 1;  // the array task running trial 1 (index 0)
  REQUIRE(
      isorun::test::run_captured("/usr/bin/scancel", {jobs[0]["job"].get<std::string>() + "_" + std::to_string(task)})
          .code == 0);
  auto done = isorun::test::finish_captured(sweep);
  INFO(done.err);
  CHECK(done.code == 0);
  std::map<int, json> by_trial;
  for (const auto& l : lines(dir + "/out/results.jsonl")) {
    const json t = json::parse(l);
    by_trial[t["params"]["arg0"].get<int>()] = t;
  }
  REQUIRE(by_trial.size() == 2);
  CHECK(by_trial[1]["outcome"] == "success");
  CHECK(by_trial[1]["attempts"] == 2);  // lost to the scancel, retried in a new array
  CHECK(by_trial[2]["attempts"] == 1);

  std::ofstream(dir + "/bad.yaml") << "task: plain_number\nparams:\n  arg0: [1]\n"
                                      "resources: {backend: slurm, partition: nosuchpartition}\nout: \""
                                   << dir << "/bad\"\n";
  auto bad = sweep_cli({"sweep", dir + "/bad.yaml", "--no-progress"});
  CHECK(bad.code == 2);
  CHECK_THAT(bad.err, Catch::Contains("sbatch refused") && Catch::Contains("invalid partition"));
  CHECK(lines(dir + "/bad/results.jsonl").empty());
  fs::remove_all(dir);
}
TEST_CASE("the digits sweep through Slurm gives the same table as here", "[slurm]") {
  const std::string dir = temp_dir();
  auto spec = [&](const std::string& name, const std::string& backend) {
    std::ofstream(dir + "/" + name) << "task: digits\nmetric: {name: accuracy, goal: maximize}\n"
                                       "params:\n  model: [mlp, softmax]\n  lr: [0.1, 0.3]\n  epochs: 5\n"
                                       "resources: {backend: "
                                    << backend << ", cpu_slots: 2, mem_limit: 256M}\nout: \"" << dir << "/" << name
                                    << ".out\"\n";
    return dir + "/" + name;
  };
  auto local = isorun::test::run_captured(ISORUN_CLI, {"sweep", spec("local.yaml", "local"), "--no-progress"});
  auto slurm = isorun::test::run_captured(ISORUN_CLI, {"sweep", spec("slurm.yaml", "slurm"), "--no-progress"});
  INFO(local.err << slurm.err);
  REQUIRE(local.code == 0);
  REQUIRE(slurm.code == 0);
  CHECK(slurm.out == local.out);  // the ranked table: same trials, same accuracies, same order
  CHECK(lines(dir + "/slurm.yaml.out/results.jsonl").size() == 4);
  fs::remove_all(dir);
}
TEST_CASE("on Slurm: a node failure loses the running trial; it is retried once the node is back", "[slurm]") {
  // The node goes down under its running task (scontrol: as Slurm marks a node that stopped
  // answering, but with slurmd still there to kill what ran on it, so nothing is left behind).
  const std::string dir = temp_dir();
  fs::create_directories(dir + "/m");
  std::ofstream(dir + "/spec.yaml")
      << "task: wait_once\nparams:\n  arg0: [1]\n  arg1: [\"" << dir
      << "/m\"]\nresources: {backend: slurm, cpu_slots: 1}\npolicy: {retries: {crashed: 1}}\n"
         "out: \""
      << dir << "/out\"\n";
  auto sweep = isorun::test::start_captured(
      ISORUN_CLI, {"--tasks", SWEEP_TEST_TASKS, "sweep", dir + "/spec.yaml", "--no-progress"});
  REQUIRE(eventually([&] { return fs::exists(dir + "/m/1.running"); }));
  const std::string job = read_json(dir + "/out/slurm/jobs.json")[0]["job"];
  const std::string nodes = isorun::test::run_captured("/usr/bin/sinfo", {"-h", "-o", "%n"}).out;
  const std::string node = nodes.substr(0, nodes.find('\n'));
  REQUIRE(isorun::test::run_captured("/usr/bin/scontrol",
                                     {"update", "nodename=" + node, "state=down", "reason=isorun-test"})
              .code == 0);
  CHECK(eventually([&] {
    return sw::slurm::task_states(job).value_or(std::map<int, sw::slurm::task_end>{})[0].state == "NODE_FAIL";
  }));
  // Back in service once Slurm has killed what ran there (a resume is refused before).
  CHECK(eventually([&] {
    isorun::test::run_captured("/usr/bin/scontrol", {"update", "nodename=" + node, "state=resume"});
    const std::string state = isorun::test::run_captured("/usr/bin/sinfo", {"-h", "-n", node, "-o", "%t"}).out;
    return state.rfind("idle", 0) == 0 || state.rfind("mix", 0) == 0 || state.rfind("alloc", 0) == 0;
  }));
  auto done = isorun::test::finish_captured(sweep);
  INFO(done.err);
  CHECK(done.code == 0);
  const auto journal = lines(dir + "/out/results.jsonl");
  REQUIRE(journal.size() == 1);
  const json t = json::parse(journal[0]);
  CHECK(t["outcome"] == "success");
  CHECK(t["attempts"] == 2);  // the node failure cost the first attempt; the retry ran in a new array
  CHECK(fs::exists(dir + "/out/slurm/batch-2.json"));
  fs::remove_all(dir);
}
TEST_CASE(
    "on Slurm: early stopping; nodes send their trials' reports through the output folder, the submitter "
    "decides, and a stop ends only that trial on its node",
    "[slurm]") {
  const std::string dir = temp_dir();
  // Three trials per array task: a pruned trial's neighbours on its node go on.
  std::ofstream(dir + "/spec.yaml")
      << "command: [python3, " CURVE_SCRIPT
         ", --x, \"{x}\", --y, \"{y}\", --max-t, 27, "
         "--sleep-ms, 20, --runs, \""
      << dir
      << "/runs\"]\nmetric: {name: loss, goal: minimize}\n"
         "scheduler: {type: asha, max_t: 27, grace_period: 1, reduction_factor: 3}\n"
         "params:\n  x: [0, 0.3, 0.6, 0.8]\n  y: [0.2, 0.6, 1.0]\n"
         "resources: {backend: slurm, cpu_slots: 1, trials_per_task: 3, partition: test}\n"
         "out: \""
      << dir << "/out\"\n";
  auto r = sweep_cli({"sweep", dir + "/spec.yaml", "--no-progress"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  const json records = read_journal(dir + "/out/results.jsonl");
  REQUIRE(records.size() == 12);
  std::size_t pruned = 0, succeeded = 0;
  json best;
  for (const auto& [params, rec] : records.items()) {
    pruned += rec["outcome"] == "pruned";
    if (rec["outcome"] != "success") continue;
    ++succeeded;
    CHECK(rec["step"] == 27);
    if (best.is_null() || rec["result"]["loss"] < best["result"]["loss"]) best = rec;
  }
  CHECK(pruned > 0);
  CHECK(pruned + succeeded == 12);  // a stop took its trial alone, not the array task's others
  REQUIRE(best.is_object());
  CHECK(best["params"] == json{{"x", 0.3}, {"y", 0.6}});
  CHECK(lines(dir + "/runs").size() == 12);              // each started once: no stop was taken for a lost task
  CHECK(lines(dir + "/out/reports.jsonl").size() > 12);  // the submitter judged and kept every report
  fs::remove_all(dir);
}

namespace {

// A Slurm sweep of one command trial of checkpointed_trial.sh (30 steps, a checkpoint every 10)
// that, the first time it runs, waits at its checkpoint at step 10, and saves the step it reached
// as checkpoint 11 when warned.
std::string waiting_trial(const std::string& dir, const std::string& slurm) {
  return "command: [sh, " + std::string(CHECKPOINTED_TRIAL) + ", \"" + dir +
         "/steps\", '30', '10', '{i}', warned-once]\n" + "params:\n  i: [0]\nresources: {backend: slurm, cpu_slots: 1" +
         slurm + "}\ncheckpoints: {keep: 2, warn_before: 55s}\n" + "out: \"" + dir + "/out\"\n";
}

// The trial's steps in the order it did them.
std::vector<int> trial_steps(const std::string& log) {
  std::vector<int> steps;
  for (const auto& l : lines(log)) {
    std::istringstream in(l);
    std::string id;
    int step = 0;
    if (in >> id >> step) steps.push_back(step);
  }
  return steps;
}

}  // namespace

TEST_CASE(
    "on Slurm: an array task warned ahead of its time limit requeues itself; its trial resumes from the "
    "checkpoint it saved then",
    "[slurm][checkpoints]") {
  const std::string dir = temp_dir();
  std::ofstream(dir + "/spec.yaml") << waiting_trial(dir, ", time: \"1\"");
  std::ofstream{dir + "/steps"};
  auto sweep = isorun::test::start_captured(ISORUN_CLI, {"sweep", dir + "/spec.yaml", "--no-progress"});
  const std::string log = dir + "/steps";
  REQUIRE(wait_for_lines(log, 10));  // at its first checkpoint, waiting for the warning
  const auto sbatch = read_json(dir + "/out/slurm/batch-1.json")["sbatch"];
  CHECK(std::count(sbatch.begin(), sbatch.end(), "--requeue") == 1);
  CHECK(std::count(sbatch.begin(), sbatch.end(), "--signal=B:" + std::to_string(SIGUSR1) + "@55") == 1);
  const std::string task = read_json(dir + "/out/slurm/jobs.json")[0]["job"].get<std::string>() + "_0";
  // Slurm warns the array task within its minute; its isorun warns the trial, which saves, and
  // requeues the task. Started again (once Slurm's delay for a requeued job, the test cluster's
  // cred_expire, has passed: what a user's requeue gets), the trial goes on from the step it saved.
  auto done = isorun::test::finish_captured(sweep);
  INFO(done.err);
  INFO("journal: " << read_file(dir + "/out/results.jsonl"));
  INFO("array task's log: " << read_file(dir + "/out/slurm/logs/" + task + ".out"));
  CHECK(done.code == 0);
  // Every step done; the first resume from the step it saved when warned. (Slurm may warn the
  // requeued task again at once, up to a minute early: each later resume is from a checkpoint.)
  const auto steps = trial_steps(log);
  const std::vector<int> first(steps.begin(), steps.begin() + std::min<std::size_t>(steps.size(), 10));
  CHECK(first == std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  CHECK(std::set<int>(steps.begin(), steps.end()).size() == 30);
  const auto journal = lines(dir + "/out/results.jsonl");
  REQUIRE(journal.size() == 1);
  const json rec = json::parse(journal[0]);
  CHECK(rec["outcome"] == "success");
  CHECK(rec["checkpoint"] == 30);
  REQUIRE(rec.contains("resumes"));
  REQUIRE(rec["resumes"].size() >= 1);
  CHECK(rec["resumes"][0]["from"] == 11);
  for (const auto& resume : rec["resumes"]) CHECK(resume["redone"].get<int>() <= 10);
  CHECK(lines(dir + "/out/slurm/logs/" + task + ".out").size() > 0);
  fs::remove_all(dir);
}

TEST_CASE("on Slurm: scontrol requeue of a running array task resumes its trial from its checkpoint",
          "[slurm][checkpoints]") {
  const std::string dir = temp_dir();
  std::ofstream(dir + "/spec.yaml") << waiting_trial(dir, "");
  std::ofstream{dir + "/steps"};
  auto sweep = isorun::test::start_captured(ISORUN_CLI, {"sweep", dir + "/spec.yaml", "--no-progress"});
  const std::string log = dir + "/steps";
  REQUIRE(wait_for_lines(log, 10));
  const std::string task = read_json(dir + "/out/slurm/jobs.json")[0]["job"].get<std::string>() + "_0";
  REQUIRE(isorun::test::run_captured("/usr/bin/scontrol", {"requeue", task}).code == 0);
  // (Started again once Slurm's delay for a requeued job has passed, as a user's requeue is.)
  auto done = isorun::test::finish_captured(sweep);
  INFO(done.err);
  INFO("journal: " << read_file(dir + "/out/results.jsonl"));
  INFO("array task's log: " << read_file(dir + "/out/slurm/logs/" + task + ".out"));
  CHECK(done.code == 0);
  // 1..10, then from its checkpoint to 30. Slurm stops the trial and the task's isorun at once:
  // where the trial's end comes first, that isorun resumes it at once, until its own stop, and the
  // requeued task resumes it again; every resume is from the checkpoint at 10 (or 11, saved on
  // the warning where isorun's stop came first).
  const auto steps = trial_steps(log);
  const std::vector<int> first(steps.begin(), steps.begin() + std::min<std::size_t>(steps.size(), 10));
  CHECK(first == std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  CHECK(std::set<int>(steps.begin(), steps.end()).size() == 30);
  const auto journal = lines(dir + "/out/results.jsonl");
  REQUIRE(journal.size() == 1);
  const json rec = json::parse(journal[0]);
  INFO(rec.dump());
  CHECK(rec["outcome"] == "success");
  REQUIRE(rec.contains("resumes"));
  REQUIRE(rec["resumes"].size() >= 1);
  for (const auto& resume : rec["resumes"]) CHECK(resume["from"].get<int>() >= 10);
  fs::remove_all(dir);
}

namespace {

// A Slurm sweep of `trials` command trials chosen by the scripted searcher (tests/helpers/searcher.py
// proposes x = 2 * its ask's number), `max_running` at once; each trial appends "start X NS" and,
// 0.2 s later, "end X NS" to DIR/runs (NS: the time, in nanoseconds).
std::string searched_on_slurm(const std::string& dir, int trials, int max_running) {
  const std::string runs = "\"" + dir + "/runs\"";
  return "command: [sh, -c, 'echo start {x} $(date +%s%N) >> " + runs + "; sleep 0.2; echo end {x} $(date +%s%N) >> " +
         runs + "; echo \"{\\\"y\\\": $(({x} * {x}))}\"']\n" +
         "metric: {name: y, goal: minimize}\nsearch: {type: command, command: [python3, " + SEARCHER + ", \"" + dir +
         "/heard\"], params: [x], trials: " + std::to_string(trials) +
         "}\nresources: {backend: slurm, cpu_slots: 1, max_running: " + std::to_string(max_running) + "}\nout: \"" +
         dir + "/out\"\n";
}

}  // namespace

TEST_CASE("on Slurm: a searcher's trials are submitted as it answers, max_running at once, and told to it",
          "[slurm][search]") {
  const std::string dir = temp_dir();
  // One at a time (the test cluster could run two: isorun holds the rest back).
  std::ofstream(dir + "/spec.yaml") << searched_on_slurm(dir, 5, 1);
  const auto r = sweep_cli({"sweep", dir + "/spec.yaml", "--no-progress"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  const auto journal = lines(dir + "/out/results.jsonl");
  REQUIRE(journal.size() == 5);
  std::set<int> xs;
  for (const auto& l : journal) {
    const json rec = json::parse(l);
    CHECK(rec["outcome"] == "success");
    xs.insert(rec["params"]["x"].get<int>());
    CHECK(rec["result"]["y"] == rec["params"]["x"].get<int>() * rec["params"]["x"].get<int>());
  }
  CHECK(xs == std::set<int>{0, 2, 4, 6, 8});
  // Each ran once, one at a time.
  std::vector<std::pair<long long, int>> events;  // (time, +1 start / -1 end)
  for (const auto& l : lines(dir + "/runs")) {
    std::istringstream in(l);
    std::string what;
    int x = 0;
    long long ns = 0;
    REQUIRE(in >> what >> x >> ns);
    events.emplace_back(ns, what == "start" ? 1 : -1);
  }
  CHECK(events.size() == 10);
  std::sort(events.begin(), events.end());  // (an end before a start at the same time)
  int running = 0, most = 0;
  for (const auto& [ns, step] : events) most = std::max(most, running += step);
  CHECK(most == 1);
  // The searcher heard of one slot, and of each trial's end.
  int told = 0;
  for (const auto& l : lines(dir + "/heard")) {
    const json m = json::parse(l);
    if (m.value("op", "") == "hello") CHECK(m["slots"] == 1);
    told += m.value("op", "") == "tell";
  }
  CHECK(told == 5);
  // Every submission carries the trials it runs, for its array tasks.
  std::size_t submitted = 0;
  for (int k = 1; fs::exists(dir + "/out/slurm/batch-" + std::to_string(k) + ".json"); ++k) {
    const json batch = read_json(dir + "/out/slurm/batch-" + std::to_string(k) + ".json");
    CHECK(batch["made"].size() == batch["tasks"].size());
    submitted += batch["tasks"].size();
  }
  CHECK(submitted == 5);
  fs::remove_all(dir);
}

TEST_CASE("on Slurm: a detached search goes on where it was: trials in flight are followed, not submitted again",
          "[slurm][search][resume]") {
  const std::string dir = temp_dir();
  std::ofstream(dir + "/spec.yaml") << searched_on_slurm(dir, 4, 2);
  const auto detached = sweep_cli({"sweep", dir + "/spec.yaml", "--no-progress", "--detach"});
  INFO(detached.err);
  REQUIRE(detached.code == 0);
  CHECK_THAT(detached.err, Catch::Contains("detached"));
  const auto resumed = sweep_cli({"sweep", dir + "/spec.yaml", "--no-progress"});
  INFO(resumed.err);
  REQUIRE(resumed.code == 0);
  const auto journal = lines(dir + "/out/results.jsonl");
  REQUIRE(journal.size() == 4);
  std::set<int> xs;
  for (const auto& l : journal) xs.insert(json::parse(l)["params"]["x"].get<int>());
  CHECK(xs == std::set<int>{0, 2, 4, 6});
  CHECK(lines(dir + "/runs").size() == 8);  // each ran once: a start and an end
  fs::remove_all(dir);
}

TEST_CASE(
    "on Slurm: population-based training replaces members by children that resume from their parent's "
    "checkpoint",
    "[slurm][pbt]") {
  const std::string dir = temp_dir();
  // Four members of checkpointed_trial.sh (40 steps of 50 ms, a checkpoint every 5), h unused
  // by the script but mutated; all report the same loss at a step: ties, drawn by the seed.
  std::ofstream(dir + "/spec.yaml") << "command: [sh, " << CHECKPOINTED_TRIAL << ", \"" << dir
                                    << "/steps\", '40', '5', '{member}', 'h={h}']\n"
                                       "metric: {name: loss, goal: minimize}\n"
                                       "zip:\n  - {member: [0, 1, 2, 3], h: [1.0, 2.0, 3.0, 4.0]}\n"
                                       "checkpoints: {keep: 2}\n"
                                       "scheduler: {type: pbt, interval: 5, quantile: 0.5, seed: 1, mutations: {h: "
                                       "{uniform: [0, 5]}}}\n"
                                       "resources: {backend: slurm, cpu_slots: 1}\nout: \""
                                    << dir << "/out\"\n";
  const auto r = sweep_cli({"sweep", dir + "/spec.yaml", "--no-progress"}, {"STEP_S=0.05"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  std::map<std::string, json> by_id;
  for (const auto& l : lines(dir + "/out/results.jsonl")) {
    const json rec = json::parse(l);
    CHECK(by_id.emplace(rec["id"].get<std::string>(), rec).second);  // each journaled once
  }
  std::size_t children = 0;
  for (const auto& [id, rec] : by_id) {
    if (!rec.contains("origin")) continue;
    ++children;
    const json origin = rec["origin"];
    REQUIRE(by_id.count(origin["parent"].get<std::string>()) == 1);
    REQUIRE(by_id.count(origin["replaces"].get<std::string>()) == 1);
    const std::string replaced = by_id[origin["replaces"].get<std::string>()]["outcome"];
    CHECK((replaced == "pruned" || replaced == "success"));  // stopped for it, or ended first
    CHECK(rec["params"]["member"] == by_id[origin["parent"].get<std::string>()]["params"]["member"]);
    if (origin["step"].get<int>() > 0 && rec["outcome"] == "success") {
      REQUIRE(rec.contains("resumes"));
      CHECK(rec["resumes"][0]["from"] == origin["step"]);  // from the parent's checkpoint, on its node
    }
  }
  CHECK(children > 0);
  CHECK(by_id.size() == 4 + children);
  fs::remove_all(dir);
}

namespace {

// Checks that the tracker that appended its events to `file` was given, for each of `trials`
// trials of checkpointed_trial.sh (30 steps, a checkpoint every 10), every report and checkpoint,
// each after the trial's start and before its end.
void check_forwarded(const std::string& file, std::size_t trials) {
  std::map<std::string, std::vector<std::int64_t>> reported, checkpointed;
  std::set<std::string> started, ended;
  for (const auto& l : lines(file)) {
    const json e = json::parse(l);
    const std::string trial = e.value("trial", "");
    if (e["event"] == "sweep") started.clear(), ended.clear(), reported.clear(), checkpointed.clear();
    if (e["event"] == "start") started.insert(trial);
    if (e["event"] == "end") ended.insert(trial);
    if (e["event"] != "report" && e["event"] != "checkpoint") continue;
    CHECK(started.count(trial) == 1);  // after its start
    CHECK(ended.count(trial) == 0);    // before its end
    (e["event"] == "report" ? reported : checkpointed)[trial].push_back(e["step"].get<std::int64_t>());
  }
  REQUIRE(ended.size() == trials);
  std::vector<std::int64_t> all_steps(30);
  std::iota(all_steps.begin(), all_steps.end(), 1);
  for (const auto& trial : ended) {
    INFO(trial);
    CHECK(reported[trial] == all_steps);
    CHECK(checkpointed[trial] == std::vector<std::int64_t>{10, 20, 30});
  }
}

}  // namespace

TEST_CASE("on Slurm: the trackers are given the nodes' reports and checkpoints, each before its trial's end",
          "[slurm][track][checkpoints]") {
  const std::string dir = temp_dir();
  // Two trials of checkpointed_trial.sh, no early stopping: their nodes forward reports and
  // checkpoints because a tracker wants them.
  const auto spec = [&](const std::string& name) {
    std::ofstream(dir + "/" + name + ".yaml")
        << "command: [sh, " CHECKPOINTED_TRIAL ", \"" << dir << "/" << name
        << "-steps\", '30', '10', '{i}']\nparams: {i: [0, 1]}\n"
           "resources: {backend: slurm, cpu_slots: 1}\ncheckpoints: {keep: 2}\n"
           "track: {rec: {command: [sh, -c, \"exec cat >> "
        << dir << "/" << name << "-events\"]}}\nout: \"" << dir << "/" << name << "\"\n";
    return dir + "/" + name + ".yaml";
  };
  const auto r = sweep_cli({"sweep", spec("followed"), "--no-progress"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  check_forwarded(dir + "/followed-events", 2);
  CHECK(lines(dir + "/followed/reports.jsonl").size() == 60);  // journaled by the submitter, as a local sweep's

  // Detached: the trials end while no one follows; attached again, their records are taken
  // after every line their nodes left.
  const auto detached = sweep_cli({"sweep", spec("detached"), "--no-progress", "--detach"});
  INFO(detached.err);
  REQUIRE(detached.code == 0);
  const std::string job = read_json(dir + "/detached/slurm/jobs.json")[0]["job"];
  REQUIRE(eventually([&] { return in_queue(job) == 0; }));
  const auto attached = sweep_cli({"sweep", spec("detached"), "--no-progress", "--attach"});
  INFO(attached.err);
  REQUIRE(attached.code == 0);
  check_forwarded(dir + "/detached-events", 2);
  CHECK(lines(dir + "/detached/reports.jsonl").size() == 60);
  fs::remove_all(dir);
}
