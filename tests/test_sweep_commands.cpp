// Command sweeps: any program as the trial, its result and its end classified, Ctrl-C of its children.
#include <catch2/catch.hpp>

#include "sweep_test_support.hpp"

TEST_CASE(
    "a command sweep: parameters in the arguments, results from the last JSON line or $ISORUN_RESULT, "
    "logs, resume",
    "[sweep][command]") {
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
TEST_CASE("resources: host_mem_limit ends a trial past it out of memory; the others go on",
          "[sweep][command][host-memory]") {
  const std::string dir = temp_dir();
  std::ofstream(dir + "/spec.yaml")
      << "command: [python3, -c, 'b = bytearray({mib} << 20); print(\"{\\\"mib\\\": {mib}}\")']\n"
      << "params:\n  mib: [8, 512]\nresources: {host_mem_limit: 64M}\nout: \"" << dir << "/out\"\n";
  auto r = isorun::test::run_captured(ISORUN_CLI, {"sweep", dir + "/spec.yaml", "--no-progress"});
  INFO(r.err);
  if (r.code == 2 && r.err.find("host-mem-limit cannot be enforced here") != std::string::npos) {
    WARN("skipped: " << r.err);  // where no cgroup can enforce it, the spec is refused before anything starts
    fs::remove_all(dir);
    return;
  }
  CHECK(r.code == 1);
  const auto journal = read_journal(dir + "/out/results.jsonl");
  REQUIRE(journal.size() == 2);
  CHECK(journal[json{{"mib", 8}}.dump()]["outcome"] == "success");
  const auto& big = journal[json{{"mib", 512}}.dump()];
  CHECK(big["outcome"] == "out_of_memory");
  CHECK_THAT(big["error"].get<std::string>(), Catch::Contains("host_mem_limit of 64.00 MiB"));
  fs::remove_all(dir);
}

TEST_CASE("a command trial under a cap on a GPU gets a memory timeline in the report",
          "[sweep][command][cap][timeline]") {
  const std::string dir = temp_dir();
  // mode 0 holds 64 MiB and succeeds; 1 fills the 256 MiB cap in 64 MiB steps and fails.
  std::ofstream(dir + "/spec.yaml")
      << "command: [sh, -c, 'if [ {mode} = 0 ]; then \"$0\" device 0 create 64; echo \"{\\\"ok\\\": 1}\"; "
         "else \"$0\" device 0 fill 64 direct; exit 1; fi', '"
      << CAP_PROBE << "']\nparams:\n  mode: [0, 1]\nresources: {gpus: [0], mem_limit: 256M, per_gpu: 2}\nout: \"" << dir
      << "/out\"\n";
  auto r = isorun::test::run_captured(ISORUN_CLI, {"sweep", dir + "/spec.yaml", "--no-progress"},
                                      {"ISORUN_SIMULATE_GPUS=1x16G", std::string("LD_LIBRARY_PATH=") + FAKE_CUDA_DIR});
  INFO(r.err);
  CHECK(r.code == 1);
  const auto journal = read_journal(dir + "/out/results.jsonl");
  REQUIRE(journal.size() == 2);
  for (const auto& [params, rec] : journal.items()) {
    INFO(params);
    const std::string id = rec["id"];
    CHECK(rec["timeline"] == "logs/" + id + ".memory.json");
    // What the cap saw: the cap, and each allocation the command's processes made.
    std::ifstream in(dir + "/out/logs/" + id + ".memory.json");
    const json timeline = json::parse(in);
    REQUIRE(timeline["devices"].size() == 1);
    CHECK(timeline["devices"][0]["cap"] == 256 << 20);
    CHECK_FALSE(timeline["devices"][0]["events"].empty());
    CHECK(timeline.contains("oom") == (rec["outcome"] == "out_of_memory"));
  }
  std::ifstream page(dir + "/out/report.html");
  const std::string html((std::istreambuf_iterator<char>(page)), {});
  CHECK_THAT(html, Catch::Contains("<section id=\"timelines\"><h2>Memory timelines</h2>"));
  CHECK(occurrences(html, "class=\"timeline\"") == 2);  // one per trial
  CHECK_THAT(html, Catch::Contains(" · out_of_memory · mode=1</h3>"));
  // On CPU slots there is no cap on the driver to keep one: no timeline.
  auto cpu = isorun::test::run_captured(ISORUN_CLI, {"sweep", "--grid", "i=1", "--cpu-slots", "1", "--out",
                                                     dir + "/cpu", "--no-progress", "--", "echo", "{i}"});
  CHECK(cpu.code == 0);
  CHECK_FALSE(read_journal(dir + "/cpu/results.jsonl").begin()->contains("timeline"));
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
  CHECK(code_of({"sweep", "--grid", "lr=1,2", "--out", out, "--", "echo", "{lrr}"}) == 2);  // no such parameter
  CHECK(code_of({"sweep", "--grid", "lr=1,2", "--grid", "h=1", "--out", out, "--", "echo", "{lr}"}) == 2);  // h unused
  CHECK(code_of({"sweep", "--grid", "lr=1,2", "--out", out, "--", "no-such-program-here", "{lr}"}) == 2);
  CHECK(code_of({"sweep", "--out", out, "--", "echo", "{lr}"}) == 2);                            // no parameters
  CHECK(code_of({"sweep", "step", "--grid", "lr=1", "--out", out, "--", "echo", "{lr}"}) == 2);  // a task and a command
  CHECK(code_of({"sweep", "--grid", "lr=1", "--out", out, "--"}) == 2);
  std::ofstream(dir + "/spec.yaml") << "command: [echo, \"{lr}\"]\nparams:\n  lr: [1]\n  unused: [2]\n";
  auto r = isorun::test::run_captured(ISORUN_CLI, {"sweep", dir + "/spec.yaml", "--out", out});
  CHECK(r.code == 2);
  CHECK_THAT(r.err, Catch::Contains("spec.yaml: line 4: parameter 'unused' is not used by the command"));
  CHECK_FALSE(fs::exists(out));
  // Backends: a name the table has not, in the spec or the flag; --detach where trials run here.
  std::ofstream(dir + "/spec.yaml", std::ios::trunc)
      << "command: [echo, \"{lr}\"]\nparams:\n  lr: [1]\nresources:\n  backend: kubernetes\n";
  r = isorun::test::run_captured(ISORUN_CLI, {"sweep", dir + "/spec.yaml", "--out", out});
  CHECK(r.code == 2);
  CHECK_THAT(r.err, Catch::Contains("spec.yaml: line 5") && Catch::Contains("backend is local (") &&
                        Catch::Contains(" or slurm ("));
  r = isorun::test::run_captured(ISORUN_CLI,
                                 {"sweep", "--grid", "lr=1", "--backend", "k8s", "--out", out, "--", "echo", "{lr}"});
  CHECK(r.code == 2);
  CHECK_THAT(r.err, Catch::Contains("--backend k8s: expected local (") && Catch::Contains(" or slurm ("));
  r = isorun::test::run_captured(ISORUN_CLI,
                                 {"sweep", "--grid", "lr=1", "--detach", "--out", out, "--", "echo", "{lr}"});
  CHECK(r.code == 2);
  CHECK_THAT(r.err, Catch::Contains("--detach: backend local runs its trials in this process") &&
                        Catch::Contains("backends that can: slurm"));
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
  spec.replace(spec.find("[python3, examples/python/train.py"),
               std::string("[python3, examples/python/train.py").size(),
               "[" + python + ", " + EXAMPLES_DIR + "/python/train.py");
  std::ofstream(dir + "/sweep.yaml") << spec;
  auto r = isorun::test::run_captured(ISORUN_CLI,
                                      {"sweep", dir + "/sweep.yaml", "--out", dir + "/out", "--no-progress"});
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
