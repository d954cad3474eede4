// The journal and the output folder: resume after kill -9, a damaged or doubled journal, a full disk, a failing fsync,
// the folder lock.
#include <catch2/catch.hpp>

#include "sweep_test_support.hpp"

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
                                       "resources: {cpu_slots: 2}\nout: \""
                                    << dir << "/fs/out\"\n";
  const std::string cli = std::string(ISORUN_CLI) + " --tasks " + SWEEP_TEST_TASKS + " sweep " + dir +
                          "/spec.yaml --no-progress";
  const std::string journal = dir + "/fs/out/results.jsonl";
  // Everything in one namespace (the tmpfs lives as long as it does): a sweep that fills the
  // disk, what it left, then the same command once there is room again.
  const std::string script = "mkdir -p " + dir + "/fs && mount -t tmpfs -o size=48k tmpfs " + dir + "/fs && " + "{ " +
                             cli + " 2> " + dir + "/first.err; echo first=$?; } && " + "echo lines=$(wc -l < " +
                             journal + ") last=$(tail -c 1 " + journal + " | od -An -tx1 | tr -d ' ') && " +
                             "mount -o remount,size=8m " + dir + "/fs && { " + cli +
                             " > /dev/null 2>&1; echo second=$?; } && " + "echo total=$(wc -l < " + journal + ")";
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
  CHECK_THAT(said, Catch::Contains(std::to_string(journaled) +
                                   " trials are journaled; free space and run the same command again"));
  CHECK_THAT(said, !Catch::Contains("Ctrl-C"));
  fs::remove_all(dir);
}
TEST_CASE(
    "a journal whose fsync fails: the sweep stops saying so, the journal keeps what was durable, resume loses nothing",
    "[sweep][faults]") {
  load_test_tasks();
  const std::string dir = temp_dir();
  std::ofstream(dir + "/spec.yaml") << "task: step\nparams:\n  i: {range: [0, 199], step: 1}\n"
                                       "resources: {cpu_slots: 2}\nout: \""
                                    << dir << "/out\"\n";
  const std::vector<std::string> args = {"--tasks", SWEEP_TEST_TASKS, "sweep", dir + "/spec.yaml", "--no-progress"};
  // The disk goes bad after the journal's fifth fsync: every later one fails with EIO.
  auto first = isorun::test::run_captured(ISORUN_CLI, args, failing_fsync("/out/results.jsonl", 5));
  INFO(first.err);
  CHECK(first.code == 125);  // stopped: it cannot record results
  const auto journaled = lines(dir + "/out/results.jsonl");
  CHECK(journaled.size() > 0);
  CHECK(journaled.size() < 200);
  for (const auto& l : journaled) CHECK_NOTHROW(json::parse(l));
  CHECK_THAT(first.err, Catch::Contains("cannot make the sweep journal durable (fsync): Input/output error"));
  CHECK_THAT(first.err,
             Catch::Contains(std::to_string(journaled.size()) +
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
TEST_CASE(
    "2,000 trials, 5% crashing and 5% timing out, the sweep killed -9 three times: each trial journaled once, "
    "rightly",
    "[sweep][large][resume]") {
  const std::string dir = temp_dir(), out = dir + "/out", journal = out + "/results.jsonl";
  std::ofstream(dir + "/spec.yaml") << "task: chaos\nparams:\n  arg0: {range: [0, 1999], step: 1}\n"
                                       "resources: {cpu_slots: 2}\npolicy: {timeout: 300ms}\nout: \""
                                    << out << "\"\n";
  const std::vector<std::string> args = {"--tasks", SWEEP_TEST_TASKS,   "--grace",      "50ms",
                                         "sweep",   dir + "/spec.yaml", "--no-progress"};
  fs::create_directories(out);
  std::ofstream{journal};                                  // there from the start, so that its growth can be watched
  for (const std::size_t kill_at : {300u, 900u, 1500u}) {  // journal lines at which the sweep is killed
    auto sweep = start_cli(args, {});
    REQUIRE(wait_for_lines(journal, kill_at));
    ::kill(sweep.pid(), SIGKILL);
    sweep.reap();
  }
  auto last = start_cli(args, {});
  CHECK(last.reap().code == 1);                      // done; some trials failed
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
