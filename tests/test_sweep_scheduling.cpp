// Sweeps that run: slots and standby workers, retries, Ctrl-C, trials on several GPUs, the digits example, metrics.
#include <catch2/catch.hpp>

#include <atomic>
#include <thread>

#include "isorun/runner/admission.hpp"
#include "sweep_test_support.hpp"

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
TEST_CASE("a sweep's trials are admitted beside the program's other calls: no more caps than a GPU holds",
          "[sweep][admission]") {
  load_test_tasks();
  const auto inventory = isorun::runner::gpu_inventory::simulated("1x16G");
  auto admission = std::make_shared<isorun::runner::admission>(
      isorun::runner::admission::limits{.gpus = inventory.gpus, .cpu_slots = 2, .name = "the test"});
  // Another call of the program holds 12 GiB of the GPU: no 6 GiB trial fits beside it.
  auto other = admission->admit({.gpus = {0}, .mem_limit = 12ULL << 30});
  const std::string dir = temp_dir();
  auto s = sw::parse_spec("task: step\nparams:\n  i: [0, 1, 2, 3]\nresources: {gpus: [0], mem_limit: 6G}\n", "t.yaml");
  s.out = dir + "/out";
  auto slots = sw::plan_slots(s, inventory, 16).slots;
  REQUIRE(slots.size() == 2);
  sw::sweep_options ro;
  ro.task_libraries = {SWEEP_TEST_TASKS};
  ro.progress = false;
  ro.admission = admission.get();
  sw::sweep_summary summary;
  std::atomic<bool> ended{false};
  std::thread sweep([&] {
    summary = sw::sweep_run(s, slots, ro).run();
    ended = true;
  });
  while (admission->waiting() < 2 && !ended) std::this_thread::yield();
  CHECK_FALSE(ended);  // both lanes queued behind the call, no trial started
  CHECK(admission->running() == 1);
  other.reset();  // the call ends: the trials run, two at a time
  sweep.join();
  CHECK(summary.succeeded == 4);
  CHECK(admission->running() == 0);  // every trial's ticket given back with its worker
  // With every GPU ticket back, a call the size of the GPU gets in at once.
  CHECK(admission->enqueue({.gpus = {0}, .mem_limit = 16ULL << 30})->wait_for(std::chrono::milliseconds(0)));
  fs::remove_all(dir);
}

TEST_CASE("sweeps run on standby workers: one process per trial, each trial's stdout in its own log",
          "[sweep][standby]") {
  load_test_tasks();
  const auto inventory = isorun::runner::gpu_inventory::simulated("2x16G");
  for (const bool warm_context : {true, false}) {
    const std::string dir = temp_dir();
    auto s = sw::parse_spec(
        "task: whoami\nparams:\n  arg0: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]\n"
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
            std::vector<std::string>{"trial " + std::to_string(i) + " in pid " +
                                     std::to_string(r.result["pid"].get<int>())});
    }
    CHECK(pids.size() == 10);
    fs::remove_all(dir);
  }
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
TEST_CASE("trials on several GPUs: 1-, 2- and 4-GPU trials packed together, none over-committed, all done",
          "[sweep][multi-gpu]") {
  const std::string dir = temp_dir();
  fs::create_directories(dir + "/markers");
  std::ofstream(dir + "/spec.yaml") << "task: gpu_span\nparams:\n  g: [4, 1, 2]\n  i: {range: [0, 11], step: 1}\n"
                                       "  dir: [\""
                                    << dir
                                    << "/markers\"]\n"
                                       "resources: {gpus: all, mem_limit: 1G, per_gpu: 2, gpus_per_trial: \"{g}\"}\n"
                                       "out: \""
                                    << dir << "/out\"\n";
  auto r = isorun::test::run_captured(ISORUN_CLI,
                                      {"--tasks", SWEEP_TEST_TASKS, "sweep", dir + "/spec.yaml", "--no-progress"},
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
      {"--tasks", SWEEP_TEST_TASKS, "sweep", "gpu_span", "--grid", "i=0,1,2,3", "--grid", "dir=" + dir + "/markers",
       "--gpus", "1,2,3", "--mem-limit", "1G", "--per-gpu", "1", "--gpus-per-trial", "2", "--out", dir + "/flags",
       "--no-progress"},
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
TEST_CASE("the digits example reaches at least 0.95 held-out accuracy on the CPU path", "[sweep][digits]") {
  auto r = isorun::test::run_captured(ISORUN_CLI, {"--cpu", "-q", "--mem-limit", "256M", "digits", "model=mlp",
                                                   "lr=0.1", "hidden=64", "epochs=30", "seed=1"});
  REQUIRE(r.code == 0);
  json j = json::parse(r.out);
  CHECK(j["accuracy"].get<double>() >= 0.95);
  CHECK(j["test_size"] == 359);
  CHECK(j["train_size"] == 1438);
}
TEST_CASE("a digits sweep on simulated GPUs: every trial on its slot's GPU, device memory untouched by the host",
          "[sweep][digits][simulated]") {
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
TEST_CASE("a metric that is not a numeric field of the result is an error, not a wrong table", "[sweep][metric]") {
  const std::string dir = temp_dir(), log = dir + "/completed";
  // Known result type: refused before anything runs, naming the spec line and the fields.
  std::ofstream(dir + "/acc.yaml") << "task: step\nparams:\n  i: [1, 2]\n  log: \"" << log
                                   << "\"\nmetric: {name: scor, goal: maximize}\n";
  auto r = sweep_cli({"sweep", dir + "/acc.yaml", "--out", dir + "/o1"});
  CHECK(r.code == 2);
  CHECK_THAT(r.err,
             Catch::Contains(dir + "/acc.yaml: line 5: metric 'scor' is not a field of the result of task 'step'"));
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
  auto fine = sweep_cli(
      {"sweep", "opaque", "--grid", "arg0=1,2,3", "--metric", "value", "--out", dir + "/o5", "--no-progress"});
  CHECK(fine.code == 0);
  fs::remove_all(dir);
}
TEST_CASE("--metric ranks a --grid sweep", "[sweep][metric]") {
  const std::string dir = temp_dir();
  auto r = sweep_cli(
      {"sweep", "step", "--grid", "i=1,2,3,4", "--metric", "score:min", "--out", dir + "/g", "--no-progress"});
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
  CHECK(sw::top_table(s, records, 0).empty());  // --top 0: no table, not a header alone
}
TEST_CASE("Ctrl-C says at once what happens; garbage in the journal is reported by line", "[sweep][signals]") {
  const std::string dir = temp_dir(), fifo = dir + "/fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  std::ofstream(dir + "/spec.yaml") << step_spec(3, "", dir + "/out");
  const std::vector<std::string> args = {"--tasks", SWEEP_TEST_TASKS,   "--grace",      "30s",
                                         "sweep",   dir + "/spec.yaml", "--no-progress"};
  auto sweep = isorun::test::start_captured(ISORUN_CLI, args, {"ISORUN_TEST_HANG_AT=1", "ISORUN_TEST_FIFO=" + fifo});
  {
    std::ifstream in(fifo);
    int worker = 0;
    in >> worker;
  }
  ::kill(sweep.process.pid(), SIGINT);
  std::string said;
  REQUIRE(read_until(sweep.err, "Ctrl-C again", said));
  CHECK_THAT(said,
             Catch::Contains("stopping: no new trials; 1 running trial gets SIGTERM, then SIGKILL after 30.00 s"));
  auto done = isorun::test::finish_captured(sweep);
  CHECK(done.code == 130);
  // A line in the middle of the journal that is not a record: reported, and the trial runs again.
  auto journal = lines(dir + "/out/results.jsonl");
  REQUIRE(journal.size() == 1);
  {
    std::ofstream out(dir + "/out/results.jsonl", std::ios::trunc);
    out << "{not json\n" << journal[0] << "\n";
  }
  auto resumed = isorun::test::run_captured(
      ISORUN_CLI, {"--tasks", SWEEP_TEST_TASKS, "sweep", dir + "/spec.yaml", "--no-progress"});
  CHECK(resumed.code == 0);
  CHECK_THAT(resumed.err, Catch::Contains("results.jsonl line 1 is not a trial record; ignored"));
  CHECK_THAT(resumed.err, Catch::Contains("3 trials (2 to run)"));
  fs::remove_all(dir);
}
