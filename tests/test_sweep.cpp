// Sweeps: spec parsing, slot packing, retries, the journal, resume after kill -9, Ctrl-C, and
// the digits example.
#include <catch2/catch.hpp>

#include <dlfcn.h>
#include <poll.h>
#include <sched.h>
#include <sys/inotify.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "isorun/runner/errors.hpp"
#include "isorun/runner/process.hpp"
#include "isorun/sweep/html_report.hpp"
#include "isorun/sweep/slurm.hpp"
#include "isorun/sweep/sweep.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;
namespace sw = isorun::sweep;
using nlohmann::json;

namespace {

std::string temp_dir() {
  char dir[] = "/tmp/isorun-sweep-test-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  return dir;
}

std::vector<std::string> lines(const fs::path& p) {
  std::ifstream in(p);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// Blocks until `path` holds at least `n` lines (inotify; a 30 s bound turns a hang into a failure).
bool wait_for_lines(const std::string& path, std::size_t n) {
  int fd = ::inotify_init1(IN_CLOEXEC);
  ::inotify_add_watch(fd, path.c_str(), IN_MODIFY);
  bool ok = true;
  while (lines(path).size() < n) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 30000) != 1) {
      ok = false;
      break;
    }
    char buf[4096];
    [[maybe_unused]] auto r = ::read(fd, buf, sizeof buf);
  }
  ::close(fd);
  return ok;
}

void load_test_tasks() {
  static bool loaded = ::dlopen(SWEEP_TEST_TASKS, RTLD_NOW | RTLD_GLOBAL) != nullptr;
  REQUIRE(loaded);
}

int spec_line(const std::string& yaml) {
  try {
    sw::parse_spec(yaml, "t.yaml");
  } catch (const sw::spec_error& e) {
    return e.line();
  }
  return -1;
}

struct cli_run {
  isorun::runner::child process;
  int code = -1;
};

isorun::runner::child start_cli(const std::vector<std::string>& args, const std::vector<std::string>& env) {
  isorun::runner::spawn_options o;
  o.executable = ISORUN_CLI;
  o.args = args;
  o.env = isorun::test::test_environment(env);
  int devnull = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  o.fds = {{1, devnull}, {2, devnull}};
  auto c = isorun::runner::spawn(o);
  ::close(devnull);
  return c;
}

// A sweep spec of `n` step trials writing their completions to `log`.
std::string step_spec(int n, const std::string& log, const std::string& out) {
  std::string s = "task: step\nmetric: {name: score, goal: maximize}\nparams:\n  i: [";
  for (int i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(i);
  return s + "]\n  log: \"" + log + "\"\nresources: {cpu_slots: 1}\nout: \"" + out + "\"\n";
}

}  // namespace

TEST_CASE("spec parsing: every parameter kind expands as specified", "[sweep][spec]") {
  auto s = sw::parse_spec(R"(
task: train
metric: {name: loss, goal: minimize}
params:
  lr: [0.1, 0.01]
  depth: {values: [2, 4, 8]}
  wd: {range: [1.0e-4, 1.0e-2], num: 3, scale: log}
  epochs: {range: [10, 30], step: 10}
  optimizer: adam
zip:
  - {width: [32, 64], heads: [4, 8]}
random:
  count: 3
  seed: 11
  params:
    dropout: {uniform: [0.0, 0.5]}
    beta: {loguniform: [0.001, 0.1]}
    act: {choice: [relu, gelu]}
resources: {gpus: [0, 1], mem_limit: 6G, per_gpu: 2}
policy: {timeout: 90s, retries: {crashed: 2, timeout: 1}, fail_fast: true}
out: runs/x
)",
                          "t.yaml");
  CHECK(s.task == "train");
  CHECK_FALSE(s.metric.maximize);
  CHECK(s.trials.size() == 2u * 3 * 3 * 3 * 2 * 3);
  const json& t = s.trials.front();
  CHECK(t["optimizer"] == "adam");
  CHECK(t["wd"] == 1e-4);
  CHECK(t["epochs"] == 10);
  std::set<double> wds;
  for (const auto& x : s.trials) wds.insert(x["wd"].get<double>());
  CHECK(wds == std::set<double>{1e-4, 1e-3, 1e-2});  // log range, 12 significant digits
  std::set<std::pair<int, int>> zipped;
  std::set<std::string> acts;
  for (const auto& x : s.trials) {
    zipped.insert({x["width"].get<int>(), x["heads"].get<int>()});
    CHECK(x["dropout"].get<double>() >= 0.0);
    CHECK(x["dropout"].get<double>() <= 0.5);
    CHECK(x["beta"].get<double>() >= 0.001);
    acts.insert(x["act"].get<std::string>());
  }
  CHECK(zipped == std::set<std::pair<int, int>>{{32, 4}, {64, 8}});  // zipped: never 32 with 8
  CHECK(s.gpus == std::vector<int>{0, 1});
  CHECK(s.mem_limit == 6ULL << 30);
  CHECK(s.timeout == std::chrono::seconds(90));
  CHECK(s.retries.at("crashed") == 2);
  CHECK(s.fail_fast);
  // Same spec, same seed: same trials and ids (resume depends on it).
  auto again = sw::parse_spec(R"(
task: train
params: {lr: [0.1]}
random: {count: 2, seed: 11, params: {dropout: {uniform: [0.0, 0.5]}}}
)",
                              "t.yaml");
  auto again2 = sw::parse_spec(R"(
task: train
params: {lr: [0.1]}
random: {count: 2, seed: 11, params: {dropout: {uniform: [0.0, 0.5]}}}
)",
                               "t.yaml");
  CHECK(sw::trial_id("train", again.trials[1]) == sw::trial_id("train", again2.trials[1]));
  CHECK(sw::trial_id("train", again.trials[0]) != sw::trial_id("train", again.trials[1]));
}

TEST_CASE("spec errors name the YAML line", "[sweep][spec]") {
  CHECK(spec_line("task: t\nparams:\n  lr: [0.1\n") >= 3);                      // malformed YAML
  CHECK(spec_line("task: t\nparms:\n  lr: [1]\n") == 2);                           // unknown key
  CHECK(spec_line("task: t\nparams:\n  lr: []\n") == 3);                           // empty grid
  CHECK(spec_line("task: t\nparams:\n  lr: {range: [1, 0], num: 3}\n") == 3);      // bad range
  CHECK(spec_line("task: t\nparams:\n  lr: {range: [0, 1]}\n") == 3);              // range without num
  CHECK(spec_line("task: t\nzip:\n  - {a: [1, 2], b: [1]}\n") == 3);               // uneven zip
  CHECK(spec_line("task: t\npolicy:\n  retries: {out_of_memory: 1}\n") == 3);      // OOM retry
  CHECK(spec_line("task: t\nresources:\n  mem_limit: lots\n") == 3);
  CHECK_THROWS_WITH(sw::parse_spec("task: t\nparams:\n  lr: []\n", "t.yaml"), Catch::Contains("empty list"));
  CHECK_THROWS_WITH(sw::parse_spec("task: t\nparams:\n  lr: {range: [1, 0], num: 3}\n", "t.yaml"),
                    Catch::Contains("low must be below high"));
}

TEST_CASE("GPU slots pack floor(free / cap) trials per GPU and no more", "[sweep][packing]") {
  auto inv = isorun::runner::gpu_inventory::simulated("2x16G");
  sw::sweep_spec s;
  s.task = "step";
  s.all_gpus = true;
  s.mem_limit = 6ULL << 30;
  auto slots = sw::plan_slots(s, inv, 16).slots;
  REQUIRE(slots.size() == 4);
  std::map<std::string, int> per_gpu;
  for (const auto& sl : slots) per_gpu[sl.gpus.at(0).uuid]++;
  CHECK(per_gpu == std::map<std::string, int>{{"GPU-sim-0", 2}, {"GPU-sim-1", 2}});
  s.mem_limit = 5ULL << 30;
  CHECK(sw::plan_slots(s, inv, 16).slots.size() == 6);
  s.per_gpu = 4;
  CHECK_THROWS_WITH(sw::plan_slots(s, inv), Catch::Contains("exceeds GPU"));  // 4 x 5G > 16G
  s.per_gpu = 0;
  s.mem_limit = 20ULL << 30;
  CHECK_THROWS_WITH(sw::plan_slots(s, inv), Catch::Contains("exceeds GPU 0"));
  s.mem_limit = 6ULL << 30;
  CHECK_THROWS_WITH(sw::plan_slots(s, isorun::runner::gpu_inventory{}), Catch::Contains("no GPUs"));
  s.all_gpus = false;
  s.gpus = {3};
  CHECK_THROWS_AS(sw::plan_slots(s, inv), isorun::usage_error);
  s.gpus.clear();
  s.cpu_slots = 3;
  auto cpu = sw::plan_slots(s, inv).slots;
  CHECK(cpu.size() == 3);
  CHECK(cpu[0].gpus.empty());
}

TEST_CASE("by default a GPU gets no more slots than the cores per GPU, and the plan says why", "[sweep][packing]") {
  auto inv = isorun::runner::gpu_inventory::simulated("1x80G");
  sw::sweep_spec s;
  s.task = "step";
  s.all_gpus = true;
  s.mem_limit = 1ULL << 30;
  auto plan = sw::plan_slots(s, inv, 16);  // 80 caps would fit; 16 cores
  CHECK(plan.slots.size() == 16);
  CHECK_THAT(plan.how, Catch::Contains("16 = min(80 caps of 1.00 GiB in 80.00 GiB free, 16 cores)"));
  auto two = sw::plan_slots(s, isorun::runner::gpu_inventory::simulated("2x16G"), 2);
  CHECK(two.slots.size() == 2);  // one core per GPU
  CHECK_THAT(two.how, Catch::Contains("per GPU"));
  s.per_gpu = 20;  // an explicit per_gpu wins
  CHECK(sw::plan_slots(s, inv, 16).slots.size() == 20);
  s.gpus.clear();
  s.all_gpus = false;
  CHECK_THAT(sw::plan_slots(s, inv, 2).how, Catch::Contains("2 CPU slots (one per core)"));
}

TEST_CASE("by default CPU slots are the cores this process may run on, not the machine's", "[sweep][packing]") {
  cpu_set_t all;
  REQUIRE(::sched_getaffinity(0, sizeof all, &all) == 0);
  sw::sweep_spec s;
  s.task = "step";
  CHECK(sw::plan_slots(s, {}).slots.size() == static_cast<std::size_t>(CPU_COUNT(&all)));
  // Pinned to one core, as a Slurm job with one CPU or `taskset -c 0` would be.
  cpu_set_t one;
  CPU_ZERO(&one);
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &all)) {
      CPU_SET(c, &one);
      break;
    }
  REQUIRE(::sched_setaffinity(0, sizeof one, &one) == 0);
  const auto pinned = sw::plan_slots(s, {});
  REQUIRE(::sched_setaffinity(0, sizeof all, &all) == 0);
  CHECK(pinned.slots.size() == 1);
  CHECK_THAT(pinned.how, Catch::Contains("1 CPU slot"));
}

TEST_CASE("trials run on their slot's GPU and every assignment is journaled", "[sweep][packing]") {
  load_test_tasks();
  const std::string dir = temp_dir();
  auto s = sw::parse_spec("task: step\nparams:\n  i: [0, 1, 2, 3, 4, 5, 6, 7]\n", "t.yaml");
  s.all_gpus = true;
  s.mem_limit = 6ULL << 30;
  s.out = dir + "/out";
  auto slots = sw::plan_slots(s, isorun::runner::gpu_inventory::simulated("2x16G"), 16).slots;
  sw::sweep_options ro;
  ro.task_libraries = {SWEEP_TEST_TASKS};
  ro.progress = false;
  auto summary = sw::sweep_run(s, slots, ro).run();
  REQUIRE(summary.succeeded == 8);
  for (const auto& r : summary.records) {
    CHECK(r.result["device"] == r.device);  // what the worker saw is what it was given
    CHECK(r.device == (r.slot < 2 ? "GPU-sim-0" : "GPU-sim-1"));
  }
  CHECK(lines(dir + "/out/results.jsonl").size() == 8);
  fs::remove_all(dir);
}

TEST_CASE("sweeps run on standby workers: one process per trial, each trial's stdout in its own log",
          "[sweep][standby]") {
  load_test_tasks();
  const auto inventory = isorun::runner::gpu_inventory::simulated("2x16G");
  for (const bool warm_context : {true, false}) {
    const std::string dir = temp_dir();
    auto s = sw::parse_spec("task: whoami\nparams:\n  arg0: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]\n"
                            "resources: {gpus: all, mem_limit: 6G, standby: 1, warm_context: " +
                                std::string(warm_context ? "true" : "false") + "}\n",
                            "t.yaml");
    CHECK(s.standby == 1);
    s.out = dir + "/out";
    auto slots = sw::plan_slots(s, inventory, 16).slots;
    REQUIRE(slots.size() == 4);
    const auto standby = sw::plan_standby(s, slots);
    REQUIRE(standby.groups.size() == 2);  // one pool per GPU, two workers each
    for (const auto& g : standby.groups) {
      CHECK(g.waiting == 2);
      CHECK(g.warm == warm_context);  // 2 caps of 6 GiB and 2 contexts fit in 16 GiB
    }
    sw::sweep_options ro;
    ro.task_libraries = {SWEEP_TEST_TASKS};
    ro.progress = false;
    auto summary = sw::sweep_run(s, slots, ro).run();
    REQUIRE(summary.succeeded == 10);
    std::set<int> pids;
    for (const auto& r : summary.records) {
      pids.insert(r.result["pid"].get<int>());
      CHECK(r.result["warm"] == warm_context);
      const int i = r.params["arg0"];
      CHECK(lines(dir + "/out/logs/" + r.id + ".out") ==
            std::vector<std::string>{"trial " + std::to_string(i) + " in pid " + std::to_string(r.result["pid"].get<int>())});
    }
    CHECK(pids.size() == 10);
    fs::remove_all(dir);
  }
}

TEST_CASE("standby plans: warm only where the contexts fit beside the caps, none when asked", "[sweep][standby]") {
  const auto inventory = isorun::runner::gpu_inventory::simulated("1x16G");
  auto s = sw::parse_spec("task: whoami\nparams:\n  i: [0]\nresources: {gpus: all, mem_limit: 2G, per_gpu: 8}\n", "t.yaml");
  auto slots = sw::plan_slots(s, inventory, 16).slots;
  auto plan = sw::plan_standby(s, slots);  // 8 caps of 2 GiB fill the GPU: no room for contexts
  REQUIRE(plan.groups.size() == 1);
  CHECK(plan.groups[0].waiting == 8);
  CHECK_FALSE(plan.groups[0].warm);
  CHECK_THAT(plan.how, Catch::Contains("cold on GPU 0 (no room beside the caps"));
  s.per_gpu = 4;  // 8 GiB of caps + 4 contexts
  plan = sw::plan_standby(s, sw::plan_slots(s, inventory, 16).slots);
  CHECK(plan.groups[0].warm);
  CHECK(plan.how == "standby: 1 per slot, warm CUDA contexts on GPU 0");
  s.standby = 0;
  plan = sw::plan_standby(s, sw::plan_slots(s, inventory, 16).slots);
  CHECK(plan.groups.empty());
  CHECK(plan.how == "no standby workers");
  CHECK(spec_line("task: t\nparams: {i: [1]}\nresources:\n  standby: -1\n") == 4);
  CHECK(spec_line("task: t\nparams: {i: [1]}\nresources:\n  warm_context: maybe\n") == 4);
  // found by fuzz_spec: text that is not UTF-8 cannot become trial ids and arguments
  CHECK(spec_line("task: t\nparams:\n  name: [\"a\xff\"]\n") == 3);
  // found by fuzz_spec: a section given as a scalar or a list where a mapping belongs
  CHECK(spec_line("task: t\nparams: {i: [1]}\nrandom: yes please\n") == 3);
  CHECK(spec_line("task: t\nparams: {i: [1]}\nresources: [1, 2]\n") == 3);
  CHECK(spec_line("task: t\nparams: {i: [1]}\npolicy: strict\n") == 3);
  CHECK(spec_line("task: t\nmetric: [a, b]\nparams: {i: [1]}\n") == 2);
  // found by fuzz_spec: a NUL makes yaml-cpp read the text as UTF-16, with invalid values
  CHECK(spec_line(std::string("task: t\nparams:\n  i: [a\x08") + std::string(1, '\0') + "b]\n") == 3);
}

TEST_CASE("retries follow the outcome class; deterministic failures are not retried", "[sweep][retries]") {
  load_test_tasks();
  const std::string dir = temp_dir();
  sw::sweep_options ro;
  ro.task_libraries = {SWEEP_TEST_TASKS};
  ro.progress = false;
  auto flaky = sw::parse_spec("task: flaky\nparams:\n  arg0: [1, 2]\n  arg1: \"" + dir + "\"\n", "t.yaml");
  flaky.out = dir + "/flaky";
  flaky.cpu_slots = 1;
  auto no_retry = sw::sweep_run(flaky, sw::plan_slots(flaky, {}).slots, ro).run();
  CHECK(no_retry.failed == 2);
  for (auto& r : no_retry.records) CHECK(r.kind == isorun::outcome_kind::crashed);
  fs::remove_all(dir + "/flaky");
  for (int i : {1, 2}) fs::remove(dir + "/flaky-" + std::to_string(i));
  flaky.retries["crashed"] = 1;
  auto retried = sw::sweep_run(flaky, sw::plan_slots(flaky, {}).slots, ro).run();
  CHECK(retried.succeeded == 2);
  for (auto& r : retried.records) CHECK(r.attempts == 2);

  auto fails = sw::parse_spec("task: always_fails\nparams:\n  arg0: [1]\n", "t.yaml");
  fails.out = dir + "/fails";
  fails.retries["crashed"] = 3;
  auto f = sw::sweep_run(fails, sw::plan_slots(fails, {}).slots, ro).run();
  REQUIRE(f.records.size() == 1);
  CHECK(f.records[0].kind == isorun::outcome_kind::task_error);
  CHECK(f.records[0].attempts == 1);
  CHECK_THAT(f.records[0].error, Catch::Contains("deterministic failure 1"));
  fs::remove_all(dir);
}

TEST_CASE("kill -9 of the sweep, then the same command: nothing lost, nothing rerun", "[sweep][resume]") {
  for (int hang_at : {0, 3}) {
    INFO("killed while trial " << hang_at << " runs");
    const std::string dir = temp_dir(), fifo = dir + "/fifo", log = dir + "/completed";
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    std::ofstream(dir + "/spec.yaml") << step_spec(6, log, dir + "/out");
    const std::vector<std::string> args = {"--tasks", SWEEP_TEST_TASKS, "sweep", dir + "/spec.yaml", "--no-progress"};
    auto sweep = start_cli(args, {"ISORUN_TEST_HANG_AT=" + std::to_string(hang_at), "ISORUN_TEST_FIFO=" + fifo});
    int worker = 0;
    {
      std::ifstream in(fifo);  // the hanging trial has started: earlier ones are journaled
      in >> worker;
    }
    // Earlier trials are done; their records reach the journal (group commit) before we kill.
    REQUIRE(wait_for_lines(dir + "/out/results.jsonl", static_cast<std::size_t>(hang_at)));
    ::kill(sweep.pid(), SIGKILL);
    CHECK(sweep.reap().signal == SIGKILL);
    CHECK(isorun::test::process_gone(worker));

    auto resumed = start_cli(args, {});
    CHECK(resumed.reap().code == 0);
    const auto journal = lines(dir + "/out/results.jsonl");
    CHECK(journal.size() == 6);
    std::set<std::string> ids;
    for (const auto& l : journal) ids.insert(json::parse(l)["id"].get<std::string>());
    CHECK(ids.size() == 6);
    std::map<std::string, int> completions;
    for (const auto& l : lines(log)) completions[l]++;
    CHECK(completions.size() == 6);
    for (auto& [i, n] : completions) CHECK(n == 1);  // none ran twice
    CHECK(lines(dir + "/out/results.csv").size() == 7);
    // A third run has nothing left to do.
    CHECK(start_cli(args, {}).reap().code == 0);
    CHECK(lines(dir + "/out/results.jsonl").size() == 6);
    fs::remove_all(dir);
  }
}

TEST_CASE("a truncated last journal line (crash mid-write) is dropped, not fatal", "[sweep][resume]") {
  load_test_tasks();
  const std::string dir = temp_dir();
  auto s = sw::parse_spec(step_spec(3, "", dir + "/out"), "t.yaml");
  sw::sweep_options ro;
  ro.task_libraries = {SWEEP_TEST_TASKS};
  ro.progress = false;
  sw::sweep_run(s, sw::plan_slots(s, {}).slots, ro).run();
  auto journal = lines(dir + "/out/results.jsonl");
  REQUIRE(journal.size() == 3);
  {
    std::ofstream out(dir + "/out/results.jsonl", std::ios::trunc);
    out << journal[0] << "\n" << journal[1] << "\n" << journal[2].substr(0, 20);
  }
  auto again = sw::sweep_run(s, sw::plan_slots(s, {}).slots, ro).run();
  CHECK(again.skipped == 2);
  CHECK(again.succeeded == 1);
  CHECK(lines(dir + "/out/results.jsonl").size() == 3);
  fs::remove_all(dir);
}

TEST_CASE("Ctrl-C stops launching, cancels the running trial and keeps the journal", "[sweep][signals]") {
  const std::string dir = temp_dir(), fifo = dir + "/fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  std::ofstream(dir + "/spec.yaml") << step_spec(5, "", dir + "/out");
  auto sweep = start_cli({"--tasks", SWEEP_TEST_TASKS, "--grace", "200ms", "sweep", dir + "/spec.yaml"},
                         {"ISORUN_TEST_HANG_AT=2", "ISORUN_TEST_FIFO=" + fifo});
  int worker = 0;
  {
    std::ifstream in(fifo);
    in >> worker;
  }
  REQUIRE(wait_for_lines(dir + "/out/results.jsonl", 2));
  ::kill(sweep.pid(), SIGINT);
  CHECK(sweep.reap().code == 130);
  CHECK(isorun::test::process_gone(worker));
  CHECK(lines(dir + "/out/results.jsonl").size() == 2);  // the cancelled trial is not recorded
  fs::remove_all(dir);
}

TEST_CASE("bad sweep input: exit 2, nothing started, an existing journal untouched", "[sweep][errors]") {
  const std::string dir = temp_dir(), log = dir + "/completed";
  std::ofstream(dir + "/spec.yaml") << step_spec(2, log, dir + "/out");
  auto tasks = std::vector<std::string>{"--tasks", SWEEP_TEST_TASKS};
  auto run_cli = [&](std::vector<std::string> extra, std::vector<std::string> env = {}) {
    auto a = tasks;
    a.insert(a.end(), extra.begin(), extra.end());
    return start_cli(a, env).reap().code;
  };
  REQUIRE(run_cli({"sweep", dir + "/spec.yaml", "--no-progress"}) == 0);
  const auto before = lines(dir + "/out/results.jsonl");
  std::ofstream(dir + "/bad.yaml") << "task: step\nparams:\n  i: [1, 2\n";
  std::ofstream(dir + "/unknown_param.yaml") << "task: step\nparams:\n  colour: [red]\n";
  std::ofstream(dir + "/unknown_task.yaml") << "task: nope\nparams:\n  i: [1]\n";
  std::ofstream(dir + "/other.yaml") << step_spec(3, log, dir + "/out");
  CHECK(run_cli({"sweep", dir + "/bad.yaml"}) == 2);
  CHECK(run_cli({"sweep", dir + "/unknown_param.yaml", "--out", dir + "/o2"}) == 2);
  CHECK(run_cli({"sweep", dir + "/unknown_task.yaml", "--out", dir + "/o3"}) == 2);
  CHECK(run_cli({"sweep", dir + "/other.yaml"}) == 2);  // --out holds a different sweep
  CHECK(run_cli({"sweep", dir + "/spec.yaml", "--gpus", "all", "--mem-limit", "1G"}) == 2);  // no GPUs
  CHECK(run_cli({"sweep", dir + "/spec.yaml", "--gpus", "0", "--mem-limit", "64G"}, {"ISORUN_SIMULATE_GPUS=2x16G"}) == 2);
  CHECK(run_cli({"sweep", dir + "/spec.yaml", "--retry", "out_of_memory=1"}) == 2);
  CHECK(run_cli({"sweep", "step", "--grid", "i="}) == 2);
  CHECK(run_cli({"sweep", dir + "/spec.yaml", "--standby", "-1"}) == 2);
  CHECK(run_cli({"sweep", dir + "/spec.yaml", "--standby", "two"}) == 2);
  CHECK(lines(dir + "/out/results.jsonl") == before);
  CHECK(lines(log).size() == 2);  // nothing more ran
  CHECK_FALSE(fs::exists(dir + "/o2"));
  // A spec that cannot be read: the reason, not only the name.
  auto said = [&](const std::string& spec) {
    return isorun::test::run_captured(ISORUN_CLI, {"sweep", spec, "--out", dir + "/o4"});
  };
  auto r = said(dir + "/missing.yaml");
  CHECK(r.code == 2);
  CHECK_THAT(r.err, Catch::Contains("cannot read sweep spec " + dir + "/missing.yaml: No such file or directory"));
  fs::create_directory(dir + "/folder.yaml");
  r = said(dir + "/folder.yaml");
  CHECK(r.code == 2);
  CHECK_THAT(r.err, Catch::Contains("folder.yaml: Is a directory"));
  fs::remove_all(dir);
}

TEST_CASE("trials on several GPUs: 1-, 2- and 4-GPU trials packed together, none over-committed, all done",
          "[sweep][multi-gpu]") {
  const std::string dir = temp_dir();
  fs::create_directories(dir + "/markers");
  std::ofstream(dir + "/spec.yaml") << "task: gpu_span\nparams:\n  g: [4, 1, 2]\n  i: {range: [0, 11], step: 1}\n"
                                       "  dir: [\"" << dir << "/markers\"]\n"
                                       "resources: {gpus: all, mem_limit: 1G, per_gpu: 2, gpus_per_trial: \"{g}\"}\n"
                                       "out: \"" << dir << "/out\"\n";
  auto r = isorun::test::run_captured(ISORUN_CLI, {"--tasks", SWEEP_TEST_TASKS, "sweep", dir + "/spec.yaml", "--no-progress"},
                                      {"ISORUN_SIMULATE_GPUS=4x16G"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.err, Catch::Contains("8 GPU slots") && Catch::Contains("each trial on {g} GPUs") &&
                        Catch::Contains("no standby workers (trials span GPUs)"));
  const auto journal = lines(dir + "/out/results.jsonl");
  REQUIRE(journal.size() == 36);
  std::map<int, int> by_width;
  for (const auto& l : journal) {
    const json t = json::parse(l);
    CHECK(t["outcome"] == "success");
    const int g = t["params"]["g"];
    ++by_width[g];
    CHECK(t["result"]["devices"] == g);
    CHECK(t["result"]["visible"] == t["device"]);  // the journal keeps the device list
    const std::string device = t["device"];
    CHECK(std::count(device.begin(), device.end(), ',') == g - 1);
    CHECK(t["result"]["crowded"].get<int>() <= 2);  // per_gpu
  }
  CHECK(by_width == std::map<int, int>{{1, 12}, {2, 12}, {4, 12}});
  CHECK(fs::is_empty(dir + "/markers"));

  // The same from flags: 2-GPU trials, one place per GPU.
  auto flags = isorun::test::run_captured(
      ISORUN_CLI,
      {"--tasks", SWEEP_TEST_TASKS, "sweep", "gpu_span", "--grid", "i=0,1,2,3", "--grid", "dir=" + dir + "/markers", "--gpus",
       "1,2,3", "--mem-limit", "1G", "--per-gpu", "1", "--gpus-per-trial", "2", "--out", dir + "/flags", "--no-progress"},
      {"ISORUN_SIMULATE_GPUS=4x16G"});
  INFO(flags.err);
  REQUIRE(flags.code == 0);
  CHECK_THAT(flags.err, Catch::Contains("each trial on 2 GPUs"));
  for (const auto& l : lines(dir + "/flags/results.jsonl")) {
    const json t = json::parse(l);
    CHECK(t["result"]["devices"] == 2);
    CHECK(t["result"]["crowded"] == 1);
    CHECK(t["device"].get<std::string>().find("GPU-sim-0") == std::string::npos);  // not listed
  }
  fs::remove_all(dir);
}

TEST_CASE("gpus_per_trial that cannot be met is refused before anything runs", "[sweep][multi-gpu]") {
  const std::string dir = temp_dir();
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"resources: {gpus: all, mem_limit: 1G, gpus_per_trial: 5}", "a trial asks for 5 GPUs (gpus_per_trial), but the sweep has 4"},
      {"resources: {gpus: all, mem_limit: 1G, gpus_per_trial: \"{h}\"}", "gpus_per_trial takes parameter 'h', which the sweep does not have"},
      {"resources: {gpus: all, mem_limit: 1G, gpus_per_trial: \"{dir}\"}", "whose value \"x\" is not a number of GPUs"},
      {"resources: {gpus: all, mem_limit: 1G, gpus_per_trial: 0}", "gpus_per_trial must be a whole number, at least 1"},
      {"resources: {gpus_per_trial: 2}", "gpus_per_trial needs GPUs, and the sweep has none"},
  };
  for (const auto& [resources, said] : bad) {
    std::ofstream(dir + "/spec.yaml") << "task: gpu_span\nparams:\n  g: [1, 2]\n  dir: [x]\n" << resources
                                      << "\nout: \"" << dir << "/out\"\n";
    auto r = isorun::test::run_captured(ISORUN_CLI, {"--tasks", SWEEP_TEST_TASKS, "sweep", dir + "/spec.yaml", "--no-progress"},
                                        {"ISORUN_SIMULATE_GPUS=4x16G"});
    INFO(resources << "\n" << r.err);
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Catch::Contains(said) && Catch::Contains("line 5"));
    CHECK_FALSE(fs::exists(dir + "/out/results.jsonl"));
  }
  fs::remove_all(dir);
}

TEST_CASE("inline --grid sweeps work like a spec", "[sweep]") {
  const std::string dir = temp_dir();
  auto code = start_cli({"--tasks", SWEEP_TEST_TASKS, "sweep", "step", "--grid", "i=1,2,3", "--out", dir + "/g",
                         "--cpu-slots", "2", "--no-progress"},
                        {})
                  .reap()
                  .code;
  CHECK(code == 0);
  CHECK(lines(dir + "/g/results.jsonl").size() == 3);
  fs::remove_all(dir);
}

TEST_CASE("the digits example reaches at least 0.95 held-out accuracy on the CPU path", "[sweep][digits]") {
  auto r = isorun::test::run_captured(ISORUN_CLI, {"--cpu", "-q", "--mem-limit", "256M", "digits", "model=mlp", "lr=0.1",
                                                   "hidden=64", "epochs=30", "seed=1"});
  REQUIRE(r.code == 0);
  json j = json::parse(r.out);
  CHECK(j["accuracy"].get<double>() >= 0.95);
  CHECK(j["test_size"] == 359);
  CHECK(j["train_size"] == 1438);
}

TEST_CASE("a digits sweep on simulated GPUs: every trial on its slot's GPU, device memory untouched by the host", "[sweep][digits][simulated]") {
  const std::string dir = temp_dir();
  std::ofstream(dir + "/spec.yaml") << "task: digits\nmetric: {name: accuracy, goal: maximize}\n"
                                       "params:\n  model: [mlp, softmax]\n  lr: [0.1, 0.3]\n  epochs: 10\n"
                                       "resources: {gpus: all, mem_limit: 1G, per_gpu: 1}\nout: \""
                                    << dir << "/out\"\n";
  auto code = start_cli({"sweep", dir + "/spec.yaml", "--no-progress"}, {"ISORUN_SIMULATE_GPUS=2x4G"}).reap().code;
  CHECK(code == 0);
  const auto journal = lines(dir + "/out/results.jsonl");
  REQUIRE(journal.size() == 4);
  for (const auto& l : journal) {
    json r = json::parse(l);
    CHECK(r["outcome"] == "success");
    CHECK(r["result"]["device"] == "simulated:" + r["device"].get<std::string>());
    CHECK(r["result"]["accuracy"].get<double>() >= 0.9);
    CHECK(r["peak_reserved"].get<std::uint64_t>() > 0);
  }
  fs::remove_all(dir);
}

namespace {
isorun::test::captured sweep_cli(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
  std::vector<std::string> a = {"--tasks", SWEEP_TEST_TASKS};
  a.insert(a.end(), args.begin(), args.end());
  return isorun::test::run_captured(ISORUN_CLI, a, env);
}

// Reads `fd` until `text` appears (true) or EOF (false); returns what was read in `seen`.
bool read_until(int fd, const std::string& text, std::string& seen) {
  char buf[512];
  while (seen.find(text) == std::string::npos) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) return false;
    seen.append(buf, static_cast<std::size_t>(n));
  }
  return true;
}
}  // namespace

TEST_CASE("a metric that is not a numeric field of the result is an error, not a wrong table", "[sweep][metric]") {
  const std::string dir = temp_dir(), log = dir + "/completed";
  // Known result type: refused before anything runs, naming the spec line and the fields.
  std::ofstream(dir + "/acc.yaml") << "task: step\nparams:\n  i: [1, 2]\n  log: \"" << log
                                   << "\"\nmetric: {name: scor, goal: maximize}\n";
  auto r = sweep_cli({"sweep", dir + "/acc.yaml", "--out", dir + "/o1"});
  CHECK(r.code == 2);
  CHECK_THAT(r.err, Catch::Contains(dir + "/acc.yaml: line 5: metric 'scor' is not a field of the result of task 'step'"));
  CHECK_THAT(r.err, Catch::Contains("did you mean 'score'?") && Catch::Contains("numeric fields: i, score"));
  CHECK_FALSE(fs::exists(log));
  CHECK_FALSE(fs::exists(dir + "/o1"));
  std::ofstream(dir + "/text.yaml") << "task: step\nparams:\n  i: [1]\nmetric: device\n";
  CHECK_THAT(sweep_cli({"sweep", dir + "/text.yaml", "--out", dir + "/o2"}).err, Catch::Contains("is a string"));
  CHECK_THAT(sweep_cli({"sweep", "plain_number", "--grid", "arg0=1", "--metric", "x", "--out", dir + "/o3"}).err,
             Catch::Contains("is number, not an object with fields"));
  // Result type not known up front: the first success decides, and the sweep stops.
  auto late = sweep_cli({"sweep", "opaque", "--grid", "arg0=1,2,3", "--metric", "score", "--cpu-slots", "1", "--out",
                         dir + "/o4", "--no-progress"});
  CHECK(late.code == 2);
  CHECK_THAT(late.err, Catch::Contains("metric 'score' is not a field of the result of trial") &&
                           Catch::Contains("numeric fields: value") && Catch::Contains("the sweep was stopped"));
  CHECK(lines(dir + "/o4/results.jsonl").size() < 3);
  auto fine = sweep_cli({"sweep", "opaque", "--grid", "arg0=1,2,3", "--metric", "value", "--out", dir + "/o5",
                         "--no-progress"});
  CHECK(fine.code == 0);
  fs::remove_all(dir);
}

TEST_CASE("--metric ranks a --grid sweep", "[sweep][metric]") {
  const std::string dir = temp_dir();
  auto r = sweep_cli({"sweep", "step", "--grid", "i=1,2,3,4", "--metric", "score:min", "--out", dir + "/g", "--no-progress"});
  REQUIRE(r.code == 0);
  std::istringstream table(r.out);
  std::string header, first, second;
  std::getline(table, header);
  std::getline(table, first);
  std::getline(table, second);
  CHECK_THAT(header, Catch::Contains("score"));
  CHECK_THAT(first, Catch::Contains("i=3"));  // score (7i mod 10): 1 for i=3, then 4 for i=2
  CHECK_THAT(second, Catch::Contains("i=2"));
  CHECK(sweep_cli({"sweep", "step", "--grid", "i=1", "--metric", "score:up"}).code == 2);
  fs::remove_all(dir);
}

TEST_CASE("the top table aligns its numbers", "[sweep][metric]") {
  sw::sweep_spec s;
  s.metric = {"accuracy", true};
  std::vector<sw::trial_record> records(3);
  const double values[] = {0.97493, 0.980501, 0.5};
  for (int i = 0; i < 3; ++i) {
    records[i].id = "trial" + std::to_string(i);
    records[i].params = {{"seed", i}};
    records[i].result = {{"accuracy", values[i]}};
  }
  std::istringstream table(sw::top_table(s, records, 5));
  std::vector<std::string> rows;
  for (std::string l; std::getline(table, l);) rows.push_back(l);
  REQUIRE(rows.size() == 4);
  CHECK_THAT(rows[1], Catch::Contains("0.980501"));
  CHECK_THAT(rows[2], Catch::Contains("0.974930"));
  CHECK(rows[1].find('.') == rows[2].find('.'));
  CHECK(rows[1].find('.') == rows[3].find('.'));
}

TEST_CASE("one sweep per output folder: a second one is refused or waits, and nothing runs twice", "[sweep][lock]") {
  const std::string dir = temp_dir(), fifo = dir + "/fifo", log = dir + "/completed";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  std::ofstream(dir + "/spec.yaml") << step_spec(4, log, dir + "/out");
  const std::vector<std::string> args = {"--tasks", SWEEP_TEST_TASKS, "sweep", dir + "/spec.yaml", "--no-progress"};
  auto first = start_cli(args, {"ISORUN_TEST_HANG_AT=1", "ISORUN_TEST_FIFO=" + fifo});
  int worker = 0;
  {
    std::ifstream in(fifo);  // the first sweep runs (and holds the folder)
    in >> worker;
  }
  // Trial 0 is done; its record reaches the journal (group commit) before the kill below, or the
  // waiting sweep would rightly run it again: a trial is done once its record is durable.
  REQUIRE(wait_for_lines(dir + "/out/results.jsonl", 1));
  auto refused = isorun::test::run_captured(ISORUN_CLI, args);
  CHECK(refused.code == 2);
  CHECK_THAT(refused.err, Catch::Contains("is in use by another sweep (pid " + std::to_string(first.pid()) + ")") &&
                              Catch::Contains("--wait"));
  auto waiting = isorun::test::start_captured(ISORUN_CLI, [&] {
    auto a = args;
    a.push_back("--wait");
    return a;
  }());
  std::string said;
  REQUIRE(read_until(waiting.err, "waiting for the sweep", said));
  ::kill(first.pid(), SIGKILL);  // the kernel releases the lock: the waiting sweep takes over
  CHECK(first.reap().signal == SIGKILL);
  CHECK(isorun::test::process_gone(worker));
  CHECK(isorun::test::finish_captured(waiting).code == 0);
  const auto journal = lines(dir + "/out/results.jsonl");
  std::set<std::string> ids;
  for (const auto& l : journal) ids.insert(json::parse(l)["id"].get<std::string>());
  CHECK(journal.size() == 4);
  CHECK(ids.size() == 4);
  std::map<std::string, int> completions;
  for (const auto& l : lines(log)) completions[l]++;
  CHECK(completions.size() == 4);
  for (auto& [i, n] : completions) CHECK(n == 1);
  fs::remove_all(dir);
}

TEST_CASE("spec errors: checked before the sweep is announced, the file named once, the line always", "[sweep][errors]") {
  const std::string dir = temp_dir();
  std::ofstream(dir + "/typo.yaml") << "task: step\nparams:\n  ii: [1, 2]\n";
  auto r = sweep_cli({"sweep", dir + "/typo.yaml", "--out", dir + "/o"});
  CHECK(r.code == 2);
  CHECK_THAT(r.err, Catch::Contains(dir + "/typo.yaml: line 3: task 'step' has no parameter 'ii' (did you mean 'i'?)"));
  CHECK_THAT(r.err, !Catch::Contains("sweep step:"));  // not announced
  CHECK(r.err.find("typo.yaml") == r.err.rfind("typo.yaml"));
  CHECK_FALSE(fs::exists(dir + "/o"));
  std::ofstream(dir + "/bad.yaml") << "task: step\nparams:\n  i: [1, 2\n";
  auto bad = sweep_cli({"sweep", dir + "/bad.yaml"});
  CHECK(bad.err.find("bad.yaml") == bad.err.rfind("bad.yaml"));
  CHECK_THAT(bad.err, Catch::Contains("bad.yaml: line"));
  std::ofstream(dir + "/key.yaml") << "task: step\nparams:\n  i: [1]\nresources: {gpu: [0]}\n";
  CHECK_THAT(sweep_cli({"sweep", dir + "/key.yaml"}).err, Catch::Contains("line 4: unknown resource 'gpu' (did you mean 'gpus'?)"));
  std::ofstream(dir + "/big.yaml") << "task: step\nparams:\n  i: [3000000000]\n";
  CHECK_THAT(sweep_cli({"sweep", dir + "/big.yaml"}).err, Catch::Contains("line 3: parameter i=3000000000: out of range"));
  CHECK_THAT(sweep_cli({"sweep", dir + "/typo.yaml", "--wiat"}).err, Catch::Contains("did you mean '--wait'?"));
  CHECK_THAT(sweep_cli({"sweep", "stpe", "--grid", "i=1"}).err, Catch::Contains("unknown task 'stpe' (did you mean 'step'?)"));
  // A valid sweep announces how its slots were planned.
  auto ok = sweep_cli({"sweep", "step", "--grid", "i=1", "--cpu-slots", "3", "--out", dir + "/g", "--no-progress"});
  CHECK(ok.code == 0);
  CHECK_THAT(ok.err, Catch::Contains("sweep step: 1 trials (1 to run) on 3 CPU slots (cpu_slots)"));
  fs::remove_all(dir);
}

TEST_CASE("Ctrl-C says at once what happens; garbage in the journal is reported by line", "[sweep][signals]") {
  const std::string dir = temp_dir(), fifo = dir + "/fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  std::ofstream(dir + "/spec.yaml") << step_spec(3, "", dir + "/out");
  const std::vector<std::string> args = {"--tasks", SWEEP_TEST_TASKS, "--grace", "30s", "sweep", dir + "/spec.yaml",
                                         "--no-progress"};
  auto sweep = isorun::test::start_captured(ISORUN_CLI, args, {"ISORUN_TEST_HANG_AT=1", "ISORUN_TEST_FIFO=" + fifo});
  {
    std::ifstream in(fifo);
    int worker = 0;
    in >> worker;
  }
  ::kill(sweep.process.pid(), SIGINT);
  std::string said;
  REQUIRE(read_until(sweep.err, "Ctrl-C again", said));
  CHECK_THAT(said, Catch::Contains("stopping: no new trials; 1 running trial gets SIGTERM, then SIGKILL after 30.00 s"));
  auto done = isorun::test::finish_captured(sweep);
  CHECK(done.code == 130);
  // A line in the middle of the journal that is not a record: reported, and the trial runs again.
  auto journal = lines(dir + "/out/results.jsonl");
  REQUIRE(journal.size() == 1);
  {
    std::ofstream out(dir + "/out/results.jsonl", std::ios::trunc);
    out << "{not json\n" << journal[0] << "\n";
  }
  auto resumed = isorun::test::run_captured(ISORUN_CLI, {"--tasks", SWEEP_TEST_TASKS, "sweep", dir + "/spec.yaml", "--no-progress"});
  CHECK(resumed.code == 0);
  CHECK_THAT(resumed.err, Catch::Contains("results.jsonl line 1 is not a trial record; ignored"));
  CHECK_THAT(resumed.err, Catch::Contains("3 trials (2 to run)"));
  fs::remove_all(dir);
}

TEST_CASE("a journal holding a trial twice counts it once", "[sweep][resume]") {
  load_test_tasks();
  const std::string dir = temp_dir();
  auto s = sw::parse_spec(step_spec(2, "", dir + "/out"), "t.yaml");
  sw::sweep_options ro;
  ro.task_libraries = {SWEEP_TEST_TASKS};
  ro.progress = false;
  sw::sweep_run(s, sw::plan_slots(s, {}).slots, ro).run();
  auto journal = lines(dir + "/out/results.jsonl");
  REQUIRE(journal.size() == 2);
  std::ofstream(dir + "/out/results.jsonl", std::ios::app) << journal[0] << "\n" << journal[1] << "\n";
  auto again = sw::sweep_run(s, sw::plan_slots(s, {}).slots, ro).run();
  CHECK(again.skipped == 2);
  CHECK(again.succeeded == 0);
  CHECK(again.records.size() == 2);
  CHECK(lines(dir + "/out/results.csv").size() == 3);
  fs::remove_all(dir);
}

TEST_CASE("a journal on a full disk: the sweep stops saying so, the journal keeps whole lines, resume loses nothing",
          "[sweep][faults]") {
  // A real ENOSPC: a 48 KiB tmpfs, mounted in a mount namespace of the test's own (needs the
  // privilege to make one; without it, say so and check nothing).
  if (isorun::test::run_captured("/usr/bin/unshare", {"-m", "true"}).code != 0) {
    WARN("cannot make a mount namespace here (unshare -m): the full-disk check needs one");
    return;
  }
  load_test_tasks();
  const std::string dir = temp_dir();
  std::ofstream(dir + "/spec.yaml") << "task: step\nparams:\n  i: {range: [0, 399], step: 1}\n"
                                       "resources: {cpu_slots: 2}\nout: \"" << dir << "/fs/out\"\n";
  const std::string cli = std::string(ISORUN_CLI) + " --tasks " + SWEEP_TEST_TASKS + " sweep " + dir + "/spec.yaml --no-progress";
  const std::string journal = dir + "/fs/out/results.jsonl";
  // Everything in one namespace (the tmpfs lives as long as it does): a sweep that fills the
  // disk, what it left, then the same command once there is room again.
  const std::string script = "mkdir -p " + dir + "/fs && mount -t tmpfs -o size=48k tmpfs " + dir + "/fs && " +
                             "{ " + cli + " 2> " + dir + "/first.err; echo first=$?; } && " +
                             "echo lines=$(wc -l < " + journal + ") last=$(tail -c 1 " + journal + " | od -An -tx1 | tr -d ' ') && " +
                             "mount -o remount,size=8m " + dir + "/fs && { " + cli + " > /dev/null 2>&1; echo second=$?; } && " +
                             "echo total=$(wc -l < " + journal + ")";
  auto r = isorun::test::run_captured("/usr/bin/unshare", {"-m", "sh", "-c", script});
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  std::map<std::string, std::string> got;
  std::istringstream words(r.out);
  for (std::string w; words >> w;)
    if (const auto eq = w.find('='); eq != std::string::npos) got[w.substr(0, eq)] = w.substr(eq + 1);
  CHECK(got["first"] == "125");  // stopped: it cannot record results
  const int journaled = std::stoi(got["lines"]);
  CHECK(journaled > 0);
  CHECK(journaled < 400);
  CHECK(got["last"] == "0a");  // whole lines only: it ends with a newline
  CHECK(got["second"] == "0");
  CHECK(got["total"] == "400");  // the rest ran once, nothing twice
  std::ifstream err(dir + "/first.err");
  const std::string said((std::istreambuf_iterator<char>(err)), {});
  CHECK_THAT(said, Catch::Contains("No space left on device"));
  CHECK_THAT(said, Catch::Contains(std::to_string(journaled) + " trials are journaled; free space and run the same command again"));
  CHECK_THAT(said, !Catch::Contains("Ctrl-C"));
  fs::remove_all(dir);
}

TEST_CASE("a journal whose fsync fails: the sweep stops saying so, the journal keeps what was durable, resume loses nothing",
          "[sweep][faults]") {
  load_test_tasks();
  const std::string dir = temp_dir();
  std::ofstream(dir + "/spec.yaml") << "task: step\nparams:\n  i: {range: [0, 199], step: 1}\n"
                                       "resources: {cpu_slots: 2}\nout: \"" << dir << "/out\"\n";
  const std::vector<std::string> args = {"--tasks", SWEEP_TEST_TASKS, "sweep", dir + "/spec.yaml", "--no-progress"};
  // The disk goes bad after the journal's fifth fsync: every later one fails with EIO. (The
  // library goes before a sanitizer runtime, which must then be told not to mind.)
  const char* asan = std::getenv("ASAN_OPTIONS");
  auto first = isorun::test::run_captured(
      ISORUN_CLI, args,
      {std::string("LD_PRELOAD=") + FAIL_FSYNC, "FAIL_FSYNC_SUFFIX=/out/results.jsonl", "FAIL_FSYNC_AFTER=5",
       std::string("ASAN_OPTIONS=") + (asan ? std::string(asan) + ":" : "") + "verify_asan_link_order=0"});
  INFO(first.err);
  CHECK(first.code == 125);  // stopped: it cannot record results
  const auto journaled = lines(dir + "/out/results.jsonl");
  CHECK(journaled.size() > 0);
  CHECK(journaled.size() < 200);
  for (const auto& l : journaled) CHECK_NOTHROW(json::parse(l));
  CHECK_THAT(first.err, Catch::Contains("cannot make the sweep journal durable (fsync): Input/output error"));
  CHECK_THAT(first.err, Catch::Contains(std::to_string(journaled.size()) +
                                        " trials are journaled; check the disk (dmesg) and run the same command again"));

  auto second = isorun::test::run_captured(ISORUN_CLI, args);
  INFO(second.err);
  CHECK(second.code == 0);
  const auto all = lines(dir + "/out/results.jsonl");
  std::map<std::string, int> times;
  for (const auto& l : all) times[json::parse(l)["params"].dump()] += 1;
  CHECK(all.size() == 200);  // the rest ran once, nothing twice
  CHECK(times.size() == 200);
  fs::remove_all(dir);
}

// ---- Sweeps over commands ----

namespace {

// A python3 that has NumPy (the PATH's, or Debian's), for the Python example; "" if none.
std::string python_with_numpy() {
  for (const std::string py : {"python3", "/usr/bin/python3"}) {
    auto r = isorun::test::run_captured("/bin/sh", {"-c", py + " -c 'import numpy' 2>/dev/null"});
    if (r.code == 0) return py;
  }
  return "";
}

json read_journal(const fs::path& file) {
  json by_id = json::object();
  for (const auto& l : lines(file)) {
    auto j = json::parse(l);
    by_id[j["params"].dump()] = j;
  }
  return by_id;
}

}  // namespace

TEST_CASE("command specs: placeholders, both spellings of command:, and their errors", "[sweep][spec][command]") {
  auto s = sw::parse_spec("command: [sh, -c, 'echo {lr} {{lr} {\"a\": {\"b\": 1}}', 'x{n}y']\nparams:\n  lr: [0.5]\n  n: [3]\n",
                          "t.yaml");
  CHECK(s.task.empty());
  CHECK(s.command_line == 1);
  CHECK(sw::placeholders(s.command) == std::vector<std::string>{"lr", "n"});
  CHECK(sw::command_for(s.command, s.trials[0]) ==
        std::vector<std::string>{"sh", "-c", "echo 0.5 {lr} {\"a\": {\"b\": 1}}", "x3y"});
  auto line = sw::parse_spec("command: python3 train.py --lr {lr}\nparams:\n  lr: [0.1, 0.2]\n", "t.yaml");
  CHECK(line.command == std::vector<std::string>{"python3", "train.py", "--lr", "{lr}"});
  CHECK(sw::subject(line) == "python3 train.py --lr {lr}");
  CHECK(spec_line("task: step\ncommand: [x]\nparams:\n  i: [1]\n") == 2);  // not both
  CHECK(spec_line("command: []\nparams:\n  i: [1]\n") == 1);
  CHECK(spec_line("command: [a, [b]]\nparams:\n  i: [1]\n") == 1);
  CHECK(spec_line("params:\n  i: [1]\n") == 1);  // neither
  CHECK_THROWS_AS(sw::command_for({"{missing}"}, json{{"i", 1}}), sw::spec_error);
}

TEST_CASE("a command sweep: parameters in the arguments, results from the last JSON line or $ISORUN_RESULT, "
          "logs, resume", "[sweep][command]") {
  const std::string dir = temp_dir(), runs = dir + "/runs";
  // Trial 2 writes its result to $ISORUN_RESULT; the others print it last, after other output.
  std::ofstream(dir + "/spec.yaml")
      << "command: [sh, -c, 'echo started {i} >> \"{runs}\"; echo working on {i}; "
         "if [ {i} = 2 ]; then echo \"{\\\"score\\\": 20}\" > \"$ISORUN_RESULT\"; "
         "else echo \"{\\\"score\\\": {i}, \\\"trial\\\": \\\"$ISORUN_TRIAL\\\"}\"; echo done; fi']\n"
         "metric: {name: score, goal: maximize}\nparams:\n  i: [1, 2, 3]\n  runs: [\""
      << runs << "\"]\nresources: {cpu_slots: 2}\nout: \"" << dir << "/out\"\n";
  auto r = isorun::test::run_captured(ISORUN_CLI, {"sweep", dir + "/spec.yaml", "--no-progress"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  const auto journal = read_journal(dir + "/out/results.jsonl");
  REQUIRE(journal.size() == 3);
  for (const auto& [params, rec] : journal.items()) {
    const int i = json::parse(params)["i"];
    CHECK(rec["outcome"] == "success");
    CHECK(rec["result"]["score"] == (i == 2 ? 20 : i));
    if (i != 2) CHECK(rec["result"]["trial"] == rec["id"]);  // $ISORUN_TRIAL is the trial's id
    const auto log = lines(dir + "/out/logs/" + rec["id"].get<std::string>() + ".out");
    REQUIRE_FALSE(log.empty());
    CHECK(log.front() == "working on " + std::to_string(i));  // its stdout, in its own log
  }
  CHECK_THAT(r.out, Catch::Contains("1     20.0000  ") && Catch::Contains("i=2"));  // ranked by score
  CHECK(lines(runs).size() == 3);
  // The same command again: everything is done, nothing runs.
  auto again = isorun::test::run_captured(ISORUN_CLI, {"sweep", dir + "/spec.yaml", "--no-progress"});
  CHECK(again.code == 0);
  CHECK(lines(runs).size() == 3);
  CHECK(lines(dir + "/out/results.jsonl").size() == 3);
  fs::remove_all(dir);
}

TEST_CASE("a command's end is classified: exit code, signal, timeout, and its cap refusing memory",
          "[sweep][command][cap]") {
  const std::string dir = temp_dir();
  // mode 0 succeeds; 1 fails saying why; 2 dies of SIGSEGV; 3 outlives its timeout; 4 fills the
  // 256 MiB cap through the stand-in CUDA driver and then fails, as a framework's OOM would.
  std::ofstream(dir + "/spec.yaml")
      << "command: [sh, -c, 'case {mode} in 0) echo \"{\\\"ok\\\": 1}\";; 1) echo bad lr >&2; exit 3;; "
         "2) kill -SEGV $$;; 3) sleep 1000;; 4) \"$0\" fill 64 direct; exit 1;; esac', '"
      << CAP_PROBE << "']\nparams:\n  mode: [0, 1, 2, 3, 4]\n"
      << "resources: {gpus: [0], mem_limit: 256M, per_gpu: 5, standby: 0}\npolicy: {timeout: 2s}\nout: \"" << dir
      << "/out\"\n";
  auto r = isorun::test::run_captured(ISORUN_CLI, {"--grace", "100ms", "sweep", dir + "/spec.yaml", "--no-progress"},
                                      {"ISORUN_SIMULATE_GPUS=1x16G", std::string("LD_LIBRARY_PATH=") + FAKE_CUDA_DIR});
  INFO(r.err);
  CHECK(r.code == 1);  // some trials failed
  const auto journal = read_journal(dir + "/out/results.jsonl");
  REQUIRE(journal.size() == 5);
  auto of = [&](int mode) { return journal[json{{"mode", mode}}.dump()]; };
  CHECK(of(0)["outcome"] == "success");
  CHECK(of(1)["outcome"] == "task_error");
  CHECK_THAT(of(1)["error"].get<std::string>(), Catch::Contains("exited with code 3") && Catch::Contains("bad lr"));
  CHECK(of(2)["outcome"] == "crashed");
  CHECK_THAT(of(2)["error"].get<std::string>(), Catch::Contains("SIGSEGV"));
  CHECK(of(3)["outcome"] == "timeout");
  CHECK(of(4)["outcome"] == "out_of_memory");
  CHECK_THAT(of(4)["error"].get<std::string>(), Catch::Contains("reached its --mem-limit of 256.00 MiB"));
  CHECK(of(4)["peak_reserved"].get<std::uint64_t>() > 0);
  CHECK(of(4)["device"] != "cpu");
  fs::remove_all(dir);
}

TEST_CASE("Ctrl-C of a command sweep stops the running command and its children", "[sweep][command][signals]") {
  const std::string dir = temp_dir(), fifo = dir + "/fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  auto sweep = start_cli({"--grace", "200ms", "sweep", "--grid", "i=1,2", "--cpu-slots", "1", "--out", dir + "/out",
                          "--", "sh", "-c", "sleep 1000 & echo $! > " + fifo + "; wait; echo {i}"},
                         {});
  int grandchild = 0;
  {
    std::ifstream in(fifo);
    in >> grandchild;
  }
  REQUIRE(grandchild > 0);
  ::kill(sweep.pid(), SIGINT);
  CHECK(sweep.reap().code == 130);
  CHECK(isorun::test::process_gone(grandchild));
  CHECK(lines(dir + "/out/results.jsonl").empty());  // a cancelled trial is not journaled: resume runs it
  fs::remove_all(dir);
}

TEST_CASE("bad command sweeps: exit 2 with the reason, nothing started", "[sweep][command][errors]") {
  const std::string dir = temp_dir();
  auto code_of = [&](std::vector<std::string> args) {
    auto r = isorun::test::run_captured(ISORUN_CLI, args);
    INFO(r.err);
    CHECK_THAT(r.err, Catch::StartsWith("isorun: error: "));
    return r.code;
  };
  const std::string out = dir + "/out";
  CHECK(code_of({"sweep", "--grid", "lr=1,2", "--out", out, "--", "echo", "{lrr}"}) == 2);       // no such parameter
  CHECK(code_of({"sweep", "--grid", "lr=1,2", "--grid", "h=1", "--out", out, "--", "echo", "{lr}"}) == 2);  // h unused
  CHECK(code_of({"sweep", "--grid", "lr=1,2", "--out", out, "--", "no-such-program-here", "{lr}"}) == 2);
  CHECK(code_of({"sweep", "--out", out, "--", "echo", "{lr}"}) == 2);  // no parameters
  CHECK(code_of({"sweep", "step", "--grid", "lr=1", "--out", out, "--", "echo", "{lr}"}) == 2);  // a task and a command
  CHECK(code_of({"sweep", "--grid", "lr=1", "--out", out, "--"}) == 2);
  std::ofstream(dir + "/spec.yaml") << "command: [echo, \"{lr}\"]\nparams:\n  lr: [1]\n  unused: [2]\n";
  auto r = isorun::test::run_captured(ISORUN_CLI, {"sweep", dir + "/spec.yaml", "--out", out});
  CHECK(r.code == 2);
  CHECK_THAT(r.err, Catch::Contains("spec.yaml: line 4: parameter 'unused' is not used by the command"));
  CHECK_FALSE(fs::exists(out));
  fs::remove_all(dir);
}

TEST_CASE("the Python example sweeps train.py and ranks its trials by accuracy", "[sweep][command][example]") {
  const std::string python = python_with_numpy();
  if (python.empty()) {
    WARN("skipped: no python3 with NumPy here (tools/setup.sh installs python3-numpy)");
    return;
  }
  const std::string dir = temp_dir();
  // The example's spec as written, with the interpreter that has NumPy and its own folder.
  std::ifstream in(std::string(EXAMPLES_DIR) + "/python/sweep.yaml");
  std::stringstream text;
  text << in.rdbuf();
  std::string spec = text.str();
  spec.replace(spec.find("[python3, examples/python/train.py"), std::string("[python3, examples/python/train.py").size(),
               "[" + python + ", " + EXAMPLES_DIR + "/python/train.py");
  std::ofstream(dir + "/sweep.yaml") << spec;
  auto r = isorun::test::run_captured(ISORUN_CLI, {"sweep", dir + "/sweep.yaml", "--out", dir + "/out", "--no-progress"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  const auto journal = read_journal(dir + "/out/results.jsonl");
  CHECK(journal.size() == 8);
  double best = 0;
  for (const auto& [params, rec] : journal.items()) best = std::max(best, rec["result"]["accuracy"].get<double>());
  CHECK(best >= 0.85);  // the spirals need a hidden layer and a fast enough rate
  CHECK_THAT(r.out, Catch::Contains("accuracy  trial"));
  fs::remove_all(dir);
}

TEST_CASE("2,000 trials, 5% crashing and 5% timing out, the sweep killed -9 three times: each trial journaled once, "
          "rightly", "[sweep][large][resume]") {
  const std::string dir = temp_dir(), out = dir + "/out", journal = out + "/results.jsonl";
  std::ofstream(dir + "/spec.yaml") << "task: chaos\nparams:\n  arg0: {range: [0, 1999], step: 1}\n"
                                       "resources: {cpu_slots: 2}\npolicy: {timeout: 300ms}\nout: \""
                                    << out << "\"\n";
  const std::vector<std::string> args = {"--tasks", SWEEP_TEST_TASKS, "--grace", "50ms", "sweep", dir + "/spec.yaml",
                                         "--no-progress"};
  fs::create_directories(out);
  std::ofstream{journal};  // there from the start, so that its growth can be watched
  for (const std::size_t kill_at : {300u, 900u, 1500u}) {  // journal lines at which the sweep is killed
    auto sweep = start_cli(args, {});
    REQUIRE(wait_for_lines(journal, kill_at));
    ::kill(sweep.pid(), SIGKILL);
    sweep.reap();
  }
  auto last = start_cli(args, {});
  CHECK(last.reap().code == 1);  // done; some trials failed
  std::map<int, std::vector<std::string>> outcomes;  // i -> every outcome journaled for it
  for (const auto& l : lines(journal)) {
    const auto j = json::parse(l);
    outcomes[j["params"]["arg0"].get<int>()].push_back(j["outcome"]);
  }
  CHECK(outcomes.size() == 2000);
  int wrong = 0, twice = 0;
  for (const auto& [i, seen] : outcomes) {
    twice += seen.size() != 1;
    const std::string expected = i % 20 == 0 ? "crashed" : i % 20 == 1 ? "timeout" : "success";
    wrong += seen.back() != expected;
  }
  CHECK(twice == 0);
  CHECK(wrong == 0);
  fs::remove_all(dir);
}

// ---- The report ----

namespace {

// How many times `what` occurs in `text`.
std::size_t occurrences(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

}  // namespace

TEST_CASE("report axes: numeric, integer, log or categorical, from the values", "[sweep][report]") {
  using sw::axis_for;
  auto lr = axis_for("lr", {json(0.001), json(0.01), json(0.1)});
  CHECK(lr.numeric);
  CHECK(lr.log);  // two decades and more
  CHECK(lr.lo == 0.001);
  CHECK(lr.hi == 0.1);
  auto hidden = axis_for("hidden", {json(16), json(64)});
  CHECK(hidden.numeric);
  CHECK_FALSE(hidden.log);  // a factor of 4
  auto shifted = axis_for("x", {json(-1), json(1000)});
  CHECK_FALSE(shifted.log);  // not all positive
  auto model = axis_for("model", {json("mlp"), json("softmax"), json("mlp"), json(3)});
  CHECK_FALSE(model.numeric);
  CHECK(model.categories == std::vector<std::string>{"mlp", "softmax", "3"});
  // Spaced by a factor (a log grid written by hand), or two values a decade apart: log.
  CHECK(axis_for("wd", {json(0.01), json(0.055), json(0.3)}).log);
  CHECK(axis_for("lr", {json(1e-4), json(1e-3)}).log);
  // A linear grid over two decades stays linear.
  std::vector<json> steps;
  for (int i = 1; i <= 100; ++i) steps.emplace_back(i);
  CHECK_FALSE(axis_for("n", steps).log);
  CHECK(axis_for("n", steps).integer);
  CHECK_FALSE(axis_for("wd", {json(0.01), json(0.055)}).integer);
}

TEST_CASE("report axes: whole numbers for integer parameters, and tick labels that never overlap", "[sweep][report]") {
  using sw::axis_for;
  using sw::axis_tick_labels;
  CHECK(axis_tick_labels(axis_for("seed", {json(1), json(2)}), 350) == std::vector<std::string>{"1", "2"});
  CHECK(axis_tick_labels(axis_for("epochs", {json(10), json(30)}), 350) ==
        std::vector<std::string>{"10", "15", "20", "25", "30"});
  auto fits = [](const std::vector<std::string>& labels, double width) {
    double need = 0;
    for (const auto& l : labels) need += static_cast<double>(l.size()) * 6.0 + 10;
    return labels.size() >= 2 && need <= width;
  };
  // Nine values from 1e-4 to 9e-4, a linear grid: the labels once ran into each other.
  std::vector<json> small;
  for (int i = 1; i <= 9; ++i) small.emplace_back(i * 1e-4);
  for (double width : {120.0, 200.0, 350.0}) {
    INFO("width " << width);
    const auto labels = axis_tick_labels(axis_for("lr", small), width);
    CHECK(fits(labels, width));
    CHECK(std::set<std::string>(labels.begin(), labels.end()).size() == labels.size());
  }
  std::vector<json> big;
  for (int i = 0; i <= 1000; ++i) big.emplace_back(i * 1234567);
  const auto labels = axis_tick_labels(axis_for("bytes", big), 350);
  CHECK(fits(labels, 350));
  CHECK(labels.front() == "0");
}

TEST_CASE("report data: outcome counts and the slots' intervals come from the journal", "[sweep][report]") {
  const std::string dir = temp_dir();
  std::ofstream(dir + "/sweep.json") << json{{"task", "t"}, {"subject", "t"}, {"metric", {{"name", "acc"}, {"maximize", true}}},
                                             {"runs", {{{"run", 1}, {"slots", {{{"index", 0}, {"device", "cpu"}}, {{"index", 1}, {"device", "cpu"}}}}, {"wall_s", 3.0}}}}}
                                              .dump();
  {
    std::ofstream j(dir + "/results.jsonl");
    auto rec = [&](const std::string& id, const char* outcome, int slot, double start, double wall, double acc) {
      j << json{{"id", id}, {"params", {{"lr", acc / 10}}}, {"outcome", outcome}, {"slot", slot}, {"run", 1},
                {"start_s", start}, {"wall_s", wall}, {"result", std::string(outcome) == "success" ? json{{"acc", acc}} : json()}}
               .dump()
        << "\n";
    };
    rec("a", "success", 0, 0.0, 1.0, 0.5);
    rec("b", "crashed", 1, 0.1, 0.4, 0);
    rec("c", "success", 1, 0.6, 1.5, 0.9);
    rec("b", "success", 0, 1.2, 0.5, 0.7);  // a retry in the same run: its last record counts
    j << "{\"id\": \"cut sh";             // a line being written
  }
  const auto d = sw::load_report_data(dir);
  REQUIRE(d.records.size() == 3);
  CHECK(d.outcomes == std::map<std::string, std::size_t>{{"success", 3}});
  CHECK(d.metric == "acc");
  REQUIRE(d.params.size() == 1);
  CHECK(d.params[0].name == "lr");
  const auto bars = sw::slot_intervals(d);
  REQUIRE(bars.size() == 3);
  CHECK(bars[0].id == "a");
  CHECK(bars[0].slot == 0);
  CHECK(bars[1].id == "b");
  CHECK(bars[1].start_s == 1.2);
  CHECK(bars[1].end_s == Approx(1.7));
  CHECK(bars[2].id == "c");
  CHECK(bars[2].slot == 1);
  CHECK(bars[2].end_s == Approx(2.1));
  const std::string page = sw::render_report(d);
  for (const char* section : {"id=\"summary\"", "id=\"params\"", "id=\"parallel\"", "id=\"trials\"", "id=\"slots\"",
                              "id=\"memory\""})
    CHECK(page.find(section) != std::string::npos);
  CHECK(page.find("best acc") != std::string::npos);
  CHECK(page.find("http") == std::string::npos);  // nothing is fetched
  CHECK_THROWS_WITH(sw::load_report_data(dir + "/nope"), Catch::Contains("is not a sweep's output folder"));
  fs::remove_all(dir);
}

TEST_CASE("results.csv and the report's table share their columns", "[sweep][report]") {
  sw::trial_record a, b;
  a.params = {{"lr", 0.1}, {"device", "x"}};
  a.result = {{"acc", 0.9}, {"lr", 1}, {"device", "cuda"}};
  b.params = {{"lr", 0.2}};
  b.kind = isorun::outcome_kind::crashed;
  const auto c = sw::columns_of({a, b});
  // a result field named like a parameter or a fixed column gets result_ in front
  CHECK(c.headers == std::vector<std::string>{"device", "lr", "acc", "result_device", "result_lr"});
  CHECK(c.values(b) == std::vector<json>{json(), 0.2, json(), json(), json()});
  sw::trial_record n;
  n.result = 42;  // no result is an object: the whole result in one column
  const auto plain = sw::columns_of({n});
  CHECK(plain.headers == std::vector<std::string>{"result"});
  CHECK(plain.values(n) == std::vector<json>{42});
  CHECK(sw::results_csv({n}).find("peak_reserved,result,error\n") != std::string::npos);
}

TEST_CASE("a report of 10,000 trials stays small: charts sample or merge, the table is paged", "[sweep][report]") {
  const std::string dir = temp_dir();
  json slots = json::array();
  for (int s = 0; s < 16; ++s) slots.push_back({{"index", s}, {"device", "GPU-sim-" + std::to_string(s / 8)}});
  std::ofstream(dir + "/sweep.json") << json{{"subject", "big"}, {"metric", {{"name", "loss"}, {"maximize", false}}},
                                             {"runs", {{{"run", 1}, {"slots", slots}, {"mem_limit", 1 << 30}}}}}
                                              .dump();
  {
    std::ofstream j(dir + "/results.jsonl");
    for (int i = 0; i < 10000; ++i)
      j << json{{"id", "t" + std::to_string(i)}, {"params", {{"lr", 1e-4 * (1 + i % 100)}, {"width", i % 7}, {"act", i % 2 ? "relu" : "gelu"}}},
                {"outcome", i % 50 ? "success" : "out_of_memory"}, {"slot", i % 16}, {"run", 1}, {"start_s", 0.01 * (i / 16)},
                {"wall_s", 0.0095}, {"peak_reserved", (i % 1000) << 20}, {"mem_limit", 1 << 30},
                {"result", i % 50 ? json{{"loss", 1.0 / (1 + i)}} : json()}}
               .dump()
        << "\n";
  }
  const std::string page = sw::render_report(sw::load_report_data(dir));
  CHECK(page.size() < 6'000'000);
  CHECK(occurrences(page, "<circle") <= 2 * 2000);  // two numeric parameters, sampled
  CHECK(occurrences(page, "<polyline") <= 800 + 50);
  CHECK(occurrences(page, "class=\"busy\"") > 0);  // 10,000 bars merged into busy spans
  CHECK(occurrences(page, "<tr><td") == 0);          // rows are drawn by the page, 50 at a time
  CHECK(page.find("\"t9999\"") != std::string::npos);  // ... from the data, all of it
  fs::remove_all(dir);
}

TEST_CASE("a sweep writes its report; a trial that ran out of memory shows what was live", "[sweep][report]") {
  const std::string dir = temp_dir();
  std::ofstream(dir + "/spec.yaml") << "task: fill_mib\nparams:\n  arg0: [16, 64, 400]\n"
                                       "resources: {cpu_slots: 2, mem_limit: 256M, alloc_conf: \"history:10000\"}\n"
                                       "out: \"" << dir << "/out\"\n";
  auto r = isorun::test::run_captured(ISORUN_CLI, {"--tasks", SWEEP_TEST_TASKS, "sweep", dir + "/spec.yaml", "--no-progress"});
  INFO(r.err);
  CHECK(r.code == 1);  // one trial failed
  CHECK_THAT(r.err, Catch::Contains("report " + dir + "/out/report.html"));
  std::map<int, json> by_size;
  for (const auto& l : lines(dir + "/out/results.jsonl")) {
    const json t = json::parse(l);
    by_size[t["params"]["arg0"].get<int>()] = t;
  }
  REQUIRE(by_size.size() == 3);
  CHECK(by_size[400]["outcome"] == "out_of_memory");
  for (auto& [size, t] : by_size) {
    CHECK(t["run"] == 1);
    CHECK(t["mem_limit"] == 256 << 20);
    REQUIRE(t.contains("timeline"));
    const json timeline = json::parse(read_file(dir + "/out/" + t["timeline"].get<std::string>()));
    CHECK(timeline["devices"][0]["cap"] == 256 << 20);
    CHECK_FALSE(timeline["devices"][0]["events"].empty());
    CHECK(timeline.contains("oom") == (size == 400));
  }
  const json oom = json::parse(read_file(dir + "/out/" + by_size[400]["timeline"].get<std::string>()))["oom"];
  CHECK(oom["live"].size() == 32);  // 32 x 8 MiB live when the 33rd step failed
  CHECK(oom["live"][0] == 8 << 20);
  const std::string page = read_file(dir + "/out/report.html");
  CHECK(page.find("id=\"timelines\"") != std::string::npos);
  CHECK(page.find("Out of memory:") != std::string::npos);
  CHECK(page.find(by_size[400]["id"].get<std::string>() + " · out_of_memory") < page.find(by_size[16]["id"].get<std::string>() + " · success"));

  // isorun report rewrites it from the folder; a folder that is not a sweep's is a usage error.
  fs::remove(dir + "/out/report.html");
  CHECK(isorun::test::run_captured(ISORUN_CLI, {"report", dir + "/out"}).code == 0);
  CHECK(read_file(dir + "/out/report.html") == page);
  auto bad = isorun::test::run_captured(ISORUN_CLI, {"report", dir});
  CHECK(bad.code == 2);
  CHECK_THAT(bad.err, Catch::Contains("is not a sweep's output folder"));
  fs::remove_all(dir);
}

TEST_CASE("--memory-timeline draws one run's memory, and an OOM's live allocations", "[sweep][report][cli]") {
  const std::string dir = temp_dir();
  auto oom = isorun::test::run_captured(ISORUN_CLI, {"--tasks", SWEEP_TEST_TASKS, "--cpu", "--mem-limit", "128M",
                                                     "--memory-timeline", dir + "/oom.html", "fill_mib", "arg0=400"});
  CHECK(oom.code == 3);
  const std::string page = read_file(dir + "/oom.html");
  CHECK(page.find("<svg") != std::string::npos);
  CHECK(page.find("Out of memory:") != std::string::npos);
  CHECK(occurrences(page, "<tr><td>") == 1);  // 16 x 8 MiB live at the failure: one row
  CHECK(page.find("<tr><td>16 &times; 8.00 MiB</td><td>128.00 MiB</td>") != std::string::npos);
  CHECK_FALSE(fs::exists(dir + "/oom.html.json.tmp"));
  auto ok = isorun::test::run_captured(ISORUN_CLI, {"--tasks", SWEEP_TEST_TASKS, "--cpu", "--mem-limit", "128M",
                                                    "--memory-timeline", dir + "/ok.html", "fill_mib", "arg0=32"});
  CHECK(ok.code == 0);
  CHECK(read_file(dir + "/ok.html").find("Out of memory") == std::string::npos);
  auto bad = isorun::test::run_captured(ISORUN_CLI, {"--memory-timeline", dir + "/x.html", "sweep", "s.yaml"});
  CHECK(bad.code == 2);
  auto nowhere = isorun::test::run_captured(ISORUN_CLI, {"--tasks", SWEEP_TEST_TASKS, "--cpu", "--memory-timeline",
                                                         dir + "/no/such/dir/x.html", "fill_mib", "arg0=8"});
  CHECK(nowhere.code == 2);
  CHECK_THAT(nowhere.err, Catch::Contains("cannot write there"));
  fs::remove_all(dir);
}

// ---- The report in a browser (tests/browser_test.sh runs these with headless Chromium) ----

namespace {

struct rendered {
  int code = -1;
  std::string dom, log;
};

// The page as headless Chromium leaves it once its script has run, and what it logged.
rendered in_browser(const std::string& page, const std::string& profile, const std::string& png = "") {
  const char* browser = std::getenv("ISORUN_TEST_BROWSER");
  REQUIRE(browser);
  std::vector<std::string> args = {"--headless", "--no-sandbox", "--disable-gpu", "--user-data-dir=" + profile,
                                   "--enable-logging=stderr", "--v=0", "--window-size=1200,3000"};
  if (!png.empty()) args.push_back("--screenshot=" + png);
  else args.push_back("--dump-dom");
  args.push_back("file://" + page);
  auto r = isorun::test::run_captured(browser, args);
  return {r.code, r.out, r.err};
}

// Console messages Chromium logged for the page: errors thrown by its script, or anything it
// printed (the page prints nothing).
std::vector<std::string> console_lines(const std::string& log) {
  std::vector<std::string> out;
  std::istringstream in(log);
  for (std::string line; std::getline(in, line);)
    if (line.find("CONSOLE") != std::string::npos || line.find("Uncaught") != std::string::npos) out.push_back(line);
  return out;
}

}  // namespace

TEST_CASE("the digits sweep's report loads in Chromium with every section and no console error", "[browser]") {
  const std::string dir = temp_dir();
  std::ofstream(dir + "/spec.yaml") << "task: digits\nmetric: {name: accuracy, goal: maximize}\n"
                                       "params:\n  model: [mlp, softmax]\n  lr: [0.01, 0.1, 1.0]\n  hidden: [16, 64]\n  epochs: 5\n"
                                       "resources: {cpu_slots: 2, mem_limit: 256M, alloc_conf: \"history:20000\"}\n"
                                       "out: \"" << dir << "/out\"\n";
  REQUIRE(isorun::test::run_captured(ISORUN_CLI, {"sweep", dir + "/spec.yaml", "--no-progress"}).code == 0);
  const auto r = in_browser(dir + "/out/report.html", dir + "/profile");
  INFO(r.log);
  REQUIRE(r.code == 0);
  CHECK(console_lines(r.log).empty());
  CHECK(r.dom.find("data-ready=\"yes\"") != std::string::npos);  // the script ran to its end
  for (const char* section : {"summary", "params", "parallel", "table", "slots", "memory", "timelines"})
    CHECK(r.dom.find(std::string("<section id=\"") + section + "\"") != std::string::npos);
  CHECK(occurrences(r.dom, "<tr><td>") >= 12);  // the script drew the 12 trials' rows
  CHECK(r.dom.find("12 trials; page 1 of 1") != std::string::npos);
  if (const char* keep = std::getenv("ISORUN_REPORT_PNG")) in_browser(dir + "/out/report.html", dir + "/profile", keep);
  fs::remove_all(dir);
}

TEST_CASE("an out-of-memory trial's timeline loads in Chromium, showing what was live", "[browser]") {
  const std::string dir = temp_dir();
  REQUIRE(isorun::test::run_captured(ISORUN_CLI, {"--tasks", SWEEP_TEST_TASKS, "--cpu", "--mem-limit", "256M",
                                                  "--memory-timeline", dir + "/oom.html", "fill_mib", "arg0=400"})
              .code == 3);
  const auto r = in_browser(dir + "/oom.html", dir + "/profile");
  INFO(r.log);
  REQUIRE(r.code == 0);
  CHECK(console_lines(r.log).empty());
  CHECK(r.dom.find("data-ready=\"yes\"") != std::string::npos);
  CHECK(r.dom.find("Out of memory:") != std::string::npos);
  CHECK(r.dom.find("<polyline class=\"allocated\"") != std::string::npos);
  CHECK(occurrences(r.dom, "<tr><td>") == 1);  // 32 x 8 MiB, one row
  CHECK(r.dom.find("32 × 8.00 MiB</td><td>256.00 MiB</td>") != std::string::npos);
  if (const char* keep = std::getenv("ISORUN_TIMELINE_PNG")) in_browser(dir + "/oom.html", dir + "/profile", keep);
  fs::remove_all(dir);
}

TEST_CASE("a report whose data holds <!--<script> still draws its table in Chromium", "[browser][hostile]") {
  // "<!--<script>" in a script element's text would switch the HTML parser into its escaped
  // states, and the rest of the page into the script; the data escapes every '<'.
  const std::string dir = temp_dir();
  std::ofstream(dir + "/sweep.json") << json{{"task", "t"}, {"subject", "t"}, {"runs", json::array()}}.dump();
  std::ofstream(dir + "/results.jsonl")
      << json{{"id", "0000000000000001"}, {"params", {{"p", "<!--<script>"}}}, {"outcome", "task_error"},
              {"error", "<!--<script> </script> \u2028 & >"}}.dump() << "\n"
      << json{{"id", "0000000000000002"}, {"params", {{"p", "x"}}}, {"outcome", "success"}}.dump() << "\n";
  sw::write_report(dir);
  const auto r = in_browser(dir + "/report.html", dir + "/profile");
  INFO(r.log);
  REQUIRE(r.code == 0);
  CHECK(console_lines(r.log).empty());
  CHECK(r.dom.find("data-ready=\"yes\"") != std::string::npos);
  CHECK(occurrences(r.dom, "<tr><td>") == 2);
  CHECK(r.dom.find("&lt;!--&lt;script&gt; &lt;/script&gt;") != std::string::npos);  // the error, as text in its cell
  fs::remove_all(dir);
}

// ---- Sweeps on Slurm (tests/slurm/run_tests.sh starts a single-node cluster for these) ----

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

// Array tasks of `job` that Slurm still has queued or running.
std::size_t in_queue(const std::string& job) { return sw::slurm::active_tasks(job).size(); }

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
                                       "extra: [\"--comment=two words; touch " << dir << "/pwned\"]}\nout: \"" << out
                                    << "\"\n";
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
                                    << "\"]\nresources: {backend: slurm, cpu_slots: 1}\n" << policy << "out: \"" << dir
                                    << "/" << name << ".out\"\n";
    return dir + "/" + name;
  };
  // Retried: the first attempt of each trial kills its array task's isorun; the second succeeds.
  auto r = sweep_cli({"sweep", spec("retried.yaml", dir + "/m1", "policy: {retries: {crashed: 1}}\n"), "--no-progress"});
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
                                       "gpus_per_node: 1}\npolicy: {retries: {crashed: 2}}\nout: \"" << dir << "/out\"\n";
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
  std::ofstream(dir + "/spec.yaml") << "task: wait_once\nparams:\n  arg0: [1, 2]\n  arg1: [\"" << dir
                                    << "/m\"]\nresources: {backend: slurm, cpu_slots: 1}\npolicy: {retries: {crashed: 1}}\n"
                                       "out: \"" << dir << "/out\"\n";
  auto sweep = isorun::test::start_captured(ISORUN_CLI, {"--tasks", SWEEP_TEST_TASKS, "sweep", dir + "/spec.yaml", "--no-progress"});
  REQUIRE(eventually([&] { return fs::exists(dir + "/m/1.running"); }));
  const json batch = read_json(dir + "/out/slurm/batch-1.json");
  const json jobs = read_json(dir + "/out/slurm/jobs.json");
  REQUIRE(jobs.size() == 1);
  const int task = batch["tasks"][0][0] == 0 ? 0 : 1;  // the array task running trial 1 (index 0)
  REQUIRE(isorun::test::run_captured("/usr/bin/scancel", {jobs[0]["job"].get<std::string>() + "_" + std::to_string(task)}).code == 0);
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
                                      "resources: {backend: slurm, partition: nosuchpartition}\nout: \"" << dir << "/bad\"\n";
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
                                       "resources: {backend: " << backend << ", cpu_slots: 2, mem_limit: 256M}\nout: \""
                                    << dir << "/" << name << ".out\"\n";
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
  std::ofstream(dir + "/spec.yaml") << "task: wait_once\nparams:\n  arg0: [1]\n  arg1: [\"" << dir
                                    << "/m\"]\nresources: {backend: slurm, cpu_slots: 1}\npolicy: {retries: {crashed: 1}}\n"
                                       "out: \"" << dir << "/out\"\n";
  auto sweep = isorun::test::start_captured(ISORUN_CLI, {"--tasks", SWEEP_TEST_TASKS, "sweep", dir + "/spec.yaml", "--no-progress"});
  REQUIRE(eventually([&] { return fs::exists(dir + "/m/1.running"); }));
  const std::string job = read_json(dir + "/out/slurm/jobs.json")[0]["job"];
  const std::string nodes = isorun::test::run_captured("/usr/bin/sinfo", {"-h", "-o", "%n"}).out;
  const std::string node = nodes.substr(0, nodes.find('\n'));
  REQUIRE(isorun::test::run_captured("/usr/bin/scontrol", {"update", "nodename=" + node, "state=down", "reason=isorun-test"}).code == 0);
  CHECK(eventually([&] { return sw::slurm::task_states(job)[0].state == "NODE_FAIL"; }));
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
