// Sweep specs (YAML, --grid, commands) and their errors; slot and standby plans.
#include <catch2/catch.hpp>

#include "sweep_test_support.hpp"

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
  CHECK(spec_line("task: t\nparams:\n  lr: [0.1\n") >= 3);                     // malformed YAML
  CHECK(spec_line("task: t\nparms:\n  lr: [1]\n") == 2);                       // unknown key
  CHECK(spec_line("task: t\nparams:\n  lr: []\n") == 3);                       // empty grid
  CHECK(spec_line("task: t\nparams:\n  lr: {range: [1, 0], num: 3}\n") == 3);  // bad range
  CHECK(spec_line("task: t\nparams:\n  lr: {range: [0, 1]}\n") == 3);          // range without num
  CHECK(spec_line("task: t\nzip:\n  - {a: [1, 2], b: [1]}\n") == 3);           // uneven zip
  CHECK(spec_line("task: t\npolicy:\n  retries: {out_of_memory: 1}\n") == 3);  // OOM retry
  CHECK(spec_line("task: t\nresources:\n  mem_limit: lots\n") == 3);
  CHECK(spec_line("task: t\nresources:\n  mem_limit: 0G\n") == 3);                   // a cap of nothing is not "no cap"
  CHECK(spec_line("task: t\npolicy:\n  oom_retry: {factor: 1, max: 16G}\n") == 3);   // factor below 1.1
  CHECK(spec_line("task: t\npolicy:\n  oom_retry: {factor: x, max: 16G}\n") == 3);   // not a number
  CHECK(spec_line("task: t\npolicy:\n  oom_retry: {factor: 2, max: lots}\n") == 3);  // not a size
  CHECK(spec_line("task: t\npolicy:\n  oom_retry: {factor: 2}\n") == 3);             // no max
  CHECK(spec_line("task: t\npolicy:\n  oom_retry:\n    factr: 2\n") == 4);           // unknown key
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
TEST_CASE("standby plans: warm only where the contexts fit beside the caps, none when asked", "[sweep][standby]") {
  const auto inventory = isorun::runner::gpu_inventory::simulated("1x16G");
  auto s = sw::parse_spec("task: whoami\nparams:\n  i: [0]\nresources: {gpus: all, mem_limit: 2G, per_gpu: 8}\n",
                          "t.yaml");
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
  CHECK(run_cli({"sweep", dir + "/spec.yaml", "--gpus", "0", "--mem-limit", "64G"}, {"ISORUN_SIMULATE_GPUS=2x16G"}) ==
        2);
  CHECK(run_cli({"sweep", dir + "/spec.yaml", "--retry", "out_of_memory=1"}) == 2);
  CHECK(run_cli({"sweep", "step", "--grid", "i="}) == 2);
  CHECK(run_cli({"sweep", dir + "/spec.yaml", "--standby", "-1"}) == 2);
  CHECK(run_cli({"sweep", dir + "/spec.yaml", "--standby", "two"}) == 2);
  for (const char* bad : {"2", "x:16G", "2:", "1:16G", "2:lots"})
    CHECK(run_cli({"sweep", dir + "/spec.yaml", "--mem-limit", "1G", "--oom-retry", bad}) == 2);
  CHECK(run_cli({"sweep", dir + "/spec.yaml", "--oom-retry", "2:16G"}) == 2);                      // no cap
  CHECK(run_cli({"sweep", dir + "/spec.yaml", "--mem-limit", "4G", "--oom-retry", "2:2G"}) == 2);  // max below it
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
TEST_CASE("gpus_per_trial that cannot be met is refused before anything runs", "[sweep][multi-gpu]") {
  const std::string dir = temp_dir();
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"resources: {gpus: all, mem_limit: 1G, gpus_per_trial: 5}",
       "a trial asks for 5 GPUs (gpus_per_trial), but the sweep has 4"},
      {"resources: {gpus: all, mem_limit: 1G, gpus_per_trial: \"{h}\"}",
       "gpus_per_trial takes parameter 'h', which the sweep does not have"},
      {"resources: {gpus: all, mem_limit: 1G, gpus_per_trial: \"{dir}\"}", "whose value \"x\" is not a number of GPUs"},
      {"resources: {gpus: all, mem_limit: 1G, gpus_per_trial: 0}", "gpus_per_trial must be a whole number, at least 1"},
      {"resources: {gpus_per_trial: 2}", "gpus_per_trial needs GPUs, and the sweep has none"},
  };
  for (const auto& [resources, said] : bad) {
    std::ofstream(dir + "/spec.yaml") << "task: gpu_span\nparams:\n  g: [1, 2]\n  dir: [x]\n"
                                      << resources << "\nout: \"" << dir << "/out\"\n";
    auto r = isorun::test::run_captured(ISORUN_CLI,
                                        {"--tasks", SWEEP_TEST_TASKS, "sweep", dir + "/spec.yaml", "--no-progress"},
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
TEST_CASE("spec errors: checked before the sweep is announced, the file named once, the line always",
          "[sweep][errors]") {
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
  CHECK_THAT(sweep_cli({"sweep", dir + "/key.yaml"}).err,
             Catch::Contains("line 4: unknown resource 'gpu' (did you mean 'gpus'?)"));
  std::ofstream(dir + "/big.yaml") << "task: step\nparams:\n  i: [3000000000]\n";
  CHECK_THAT(sweep_cli({"sweep", dir + "/big.yaml"}).err,
             Catch::Contains("line 3: parameter i=3000000000: out of range"));
  CHECK_THAT(sweep_cli({"sweep", dir + "/typo.yaml", "--wiat"}).err, Catch::Contains("did you mean '--wait'?"));
  CHECK_THAT(sweep_cli({"sweep", "stpe", "--grid", "i=1"}).err,
             Catch::Contains("unknown task 'stpe' (did you mean 'step'?)"));
  // A valid sweep announces how its slots were planned.
  auto ok = sweep_cli({"sweep", "step", "--grid", "i=1", "--cpu-slots", "3", "--out", dir + "/g", "--no-progress"});
  CHECK(ok.code == 0);
  CHECK_THAT(ok.err, Catch::Contains("sweep step: 1 trials (1 to run) on 3 CPU slots (cpu_slots)"));
  fs::remove_all(dir);
}
TEST_CASE("command specs: placeholders, both spellings of command:, and their errors", "[sweep][spec][command]") {
  auto s = sw::parse_spec(
      "command: [sh, -c, 'echo {lr} {{lr} {\"a\": {\"b\": 1}}', 'x{n}y']\nparams:\n  lr: [0.5]\n  n: [3]\n", "t.yaml");
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
TEST_CASE("Python specs: python: module:function or a file's function, preload, and their errors",
          "[sweep][spec][python]") {
  auto s = sw::parse_spec(
      "python: trials:train\nparams:\n  lr: [0.1]\nresources: {standby: 2, preload: [numpy, torch]}\n", "t.yaml");
  CHECK(s.python == "trials:train");
  CHECK(s.python_line == 1);
  CHECK(s.task.empty());
  CHECK(s.command.empty());
  CHECK(s.preload == std::vector<std::string>{"numpy", "torch"});
  CHECK(sw::subject(s) == "python:trials:train");  // what trial ids derive from: not the task "trials"
  CHECK(sw::parse_spec("python: dir/f.py:Model.fit\nparams:\n  i: [1]\n", "t.yaml").python == "dir/f.py:Model.fit");
  CHECK(spec_line("python: trials\nparams:\n  i: [1]\n") == 1);  // no function
  CHECK(spec_line("python: trials:\nparams:\n  i: [1]\n") == 1);
  CHECK(spec_line("python: [a, b]\nparams:\n  i: [1]\n") == 1);
  CHECK(spec_line("task: t\npython: m:f\nparams:\n  i: [1]\n") == 2);                     // not both
  CHECK(spec_line("task: t\nparams:\n  i: [1]\nresources:\n  preload: [numpy]\n") == 5);  // Python's only
  CHECK(spec_line("python: m:f\nparams:\n  i: [1]\nresources:\n  preload: numpy\n") == 5);
  CHECK(spec_line("python: m:f\nparams:\n  i: [1]\nresources:\n  preload: [\"a,b\"]\n") == 5);
  CHECK_THROWS_WITH(sw::parse_spec("task: t\npython: m:f\nparams:\n  i: [1]\n", "t.yaml"),
                    Catch::Contains("one of task:, command: or python:"));
  CHECK_FALSE(s.zygote);  // exec'd interpreters by default
  CHECK(sw::parse_spec("python: m:f\nparams:\n  i: [1]\nresources: {start: zygote}\n", "t.yaml").zygote);
  CHECK(spec_line("python: m:f\nparams:\n  i: [1]\nresources:\n  start: fork\n") == 5);
  CHECK(spec_line("task: t\nparams:\n  i: [1]\nresources:\n  start: zygote\n") == 5);  // Python's only
}

TEST_CASE("start: zygote plans a zygote per GPU (and one for the CPU slots), standby or not", "[sweep][standby]") {
  auto s = sw::parse_spec("python: m:f\nparams:\n  i: [0]\nresources: {cpu_slots: 2, standby: 0, start: zygote}\n",
                          "t.yaml");
  auto plan = sw::plan_standby(s, sw::plan_slots(s, isorun::runner::gpu_inventory{}, 2).slots);
  REQUIRE(plan.groups.size() == 1);  // the CPU slots' pool: its zygote forks each trial's worker
  CHECK(plan.groups[0].waiting == 0);
  CHECK(plan.how == "forked from a zygote, 0 waiting per slot");
  s = sw::parse_spec(
      "python: m:f\nparams:\n  i: [0]\nresources: {gpus: all, mem_limit: 2G, per_gpu: 2, start: zygote}\n", "t.yaml");
  plan = sw::plan_standby(s, sw::plan_slots(s, isorun::runner::gpu_inventory::simulated("1x16G"), 16).slots);
  REQUIRE(plan.groups.size() == 1);
  CHECK(plan.groups[0].waiting == 2);
  CHECK_FALSE(plan.groups[0].warm);  // a zygote never creates a context: its children do
  CHECK(plan.how == "forked from a zygote, 1 waiting per slot");
}
