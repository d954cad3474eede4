// Out-of-memory retries at larger caps, end to end: command trials under the driver-API cap on
// simulated GPUs (the stand-in libcuda), task trials under the capped allocator, packing by
// memory, resume at the journaled cap, and the input that is refused.
#include <catch2/catch.hpp>

#include "sweep_test_support.hpp"

namespace {

constexpr std::uint64_t MiB = 1ULL << 20, GiB = 1ULL << 30;

// A command trial that needs {mib} MiB of device memory (one cuMemCreate through the stand-in
// driver): it prints its result if the cap let it have them, and fails otherwise, as a
// framework's out-of-memory error does. Before that it appends "begin {i} CAP" to {log} (the cap
// in MiB, as cuMemGetInfo reports it), and after it "end {i} CAP"; while {gate} exists, an
// attempt at 2 GiB waits there for a writer.
std::string needs_memory(const std::string& extra_params, const std::string& resources, const std::string& policy,
                         const std::string& out) {
  return std::string("command: [sh, -c, 'cap=$(\"$0\" device 0 info | sed -n \"s/^info [0-9]* //p\"); ") +
         "echo begin {i} $cap >> \"{log}\"; "
         "if [ $cap = 2048 ] && [ -p \"{gate}\" ]; then read x < \"{gate}\"; fi; "
         "r=$(\"$0\" device 0 create {mib}); echo end {i} $cap >> \"{log}\"; "
         "case \"$r\" in *\"create 0\"*) echo \"{\\\"cap\\\": $cap}\";; *) exit 1;; esac', '" +
         CAP_PROBE + "']\nmetric: {name: cap, goal: minimize}\nparams:\n" + extra_params + "resources: " + resources +
         "\npolicy: " + policy + "\nout: \"" + out + "\"\n";
}

std::vector<std::string> simulated(const std::string& gpus) {
  return {"ISORUN_SIMULATE_GPUS=" + gpus, std::string("LD_LIBRARY_PATH=") + FAKE_CUDA_DIR};
}

// Every record of the journal at `file`, in order.
std::vector<json> records(const fs::path& file) {
  std::vector<json> out;
  for (const auto& l : lines(file)) out.push_back(json::parse(l));
  return out;
}

}  // namespace

TEST_CASE(
    "oom_retry: a command that needs 1.5 GiB under a 1 GiB cap succeeds at 2 GiB; one that needs more fails "
    "at max; both journaled per attempt, the final cap in results.csv and the report",
    "[sweep][command][cap][oom-retry]") {
  const std::string dir = temp_dir(), out = dir + "/out";
  std::ofstream(dir + "/spec.yaml") << needs_memory(
      "  i: [1]\n  mib: [1536, 3000]\n  log: [\"" + dir + "/log\"]\n  gate: [\"" + dir + "/gate\"]\n",
      "{gpus: [0], mem_limit: 1G, per_gpu: 2}", "{oom_retry: {factor: 2, max: 2G}}", out);
  auto r = isorun::test::run_captured(ISORUN_CLI, {"sweep", dir + "/spec.yaml", "--no-progress"}, simulated("1x8G"));
  INFO(r.err);
  CHECK(r.code == 1);  // the 3000 MiB trial failed, at max
  const auto all = records(out + "/results.jsonl");
  REQUIRE(all.size() == 4);
  std::map<int, std::vector<json>> by_mib;
  for (const auto& rec : all) by_mib[rec["params"]["mib"].get<int>()].push_back(rec);
  for (int mib : {1536, 3000}) {
    INFO(mib);
    const auto& attempts = by_mib[mib];
    REQUIRE(attempts.size() == 2);
    CHECK(attempts[0]["outcome"] == "out_of_memory");
    CHECK(attempts[0]["attempts"] == 1);
    CHECK(attempts[0]["mem_limit"] == 1 * GiB);
    CHECK(attempts[0]["retry_mem_limit"] == 2 * GiB);
    CHECK_THAT(attempts[0]["error"].get<std::string>(), Catch::Contains("reached its --mem-limit of 1.00 GiB"));
    CHECK(attempts[1]["attempts"] == 2);
    CHECK(attempts[1]["mem_limit"] == 2 * GiB);
    CHECK_FALSE(attempts[1].contains("retry_mem_limit"));
    // Each attempt keeps its own memory timeline: the one that ran out shows why.
    REQUIRE(attempts[0].contains("timeline"));
    REQUIRE(attempts[1].contains("timeline"));
    CHECK(attempts[0]["timeline"] != attempts[1]["timeline"]);
    for (const auto& a : attempts) CHECK(fs::exists(out + "/" + a["timeline"].get<std::string>()));
  }
  CHECK(by_mib[1536][1]["outcome"] == "success");
  CHECK(by_mib[1536][1]["result"]["cap"] == 2048);  // the command saw the larger cap
  CHECK(by_mib[3000][1]["outcome"] == "out_of_memory");
  CHECK_THAT(by_mib[3000][1]["error"].get<std::string>(), Catch::Contains("reached its --mem-limit of 2.00 GiB"));
  CHECK_THAT(r.err, Catch::Contains("1 succeeded, 1 failed"));  // the retried attempts are not counted

  const auto csv = lines(out + "/results.csv");
  REQUIRE(csv.size() == 3);
  CHECK_THAT(csv[0], Catch::StartsWith("id,outcome,attempts,wall_s,device,peak_reserved,mem_limit,"));
  for (std::size_t k = 1; k < csv.size(); ++k)  // 2 attempts, the last at 2 GiB
    CHECK_THAT(csv[k], Catch::Contains(",2,") && Catch::Contains(",2147483648,"));
  std::ifstream page(out + "/report.html");
  const std::string html((std::istreambuf_iterator<char>(page)), {});
  const std::string ok_id = by_mib[1536][1]["id"];
  CHECK_THAT(html, Catch::Contains(ok_id + ": reserved 1.50 GiB, allocated 0 B, cap 2.00 GiB"));
  CHECK_THAT(html, Catch::Contains("1.00 GiB (2 trials retried at larger caps, up to 2.00 GiB)"));  // the summary
  CHECK_THAT(html, Catch::Contains("\"mem_limit\""));  // the table's column
  CHECK(occurrences(html, "2147483648") >= 2);         // each trial's row holds its final cap
  // The timelines drawn are the final attempts': the one that failed at max, none at 1 GiB.
  CHECK_THAT(html, Catch::Contains("of a cap of 2.00 GiB"));
  CHECK_THAT(html, !Catch::Contains("of a cap of 1.00 GiB"));
  fs::remove_all(dir);
}

TEST_CASE("oom_retry: a sweep stopped after an out-of-memory attempt was journaled resumes the trial at the larger cap",
          "[sweep][command][cap][oom-retry][resume]") {
  const std::string dir = temp_dir(), out = dir + "/out", gate = dir + "/gate", log = dir + "/log";
  REQUIRE(::mkfifo(gate.c_str(), 0600) == 0);  // the attempt at 2 GiB waits here: the sweep is stopped then
  std::ofstream{log};                          // (watched from the start)
  std::ofstream(dir + "/spec.yaml") << needs_memory(
      "  i: [1]\n  mib: [1536]\n  log: [\"" + log + "\"]\n  gate: [\"" + gate + "\"]\n",
      "{gpus: [0], mem_limit: 1G, per_gpu: 1}", "{oom_retry: {factor: 2, max: 4G}}", out);
  auto sweep = start_cli({"--grace", "100ms", "sweep", dir + "/spec.yaml", "--no-progress"}, simulated("1x8G"));
  REQUIRE(wait_for_lines(log, 3));  // begin at 1 GiB, end, begin at 2 GiB: the attempt is journaled before it starts
  CHECK(lines(log) == std::vector<std::string>{"begin 1 1024", "end 1 1024", "begin 1 2048"});
  ::kill(sweep.pid(), SIGINT);
  CHECK(sweep.reap().code == 130);
  auto journaled = records(out + "/results.jsonl");
  REQUIRE(journaled.size() == 1);  // the cancelled attempt at 2 GiB is not journaled
  CHECK(journaled[0]["retry_mem_limit"] == 2 * GiB);

  // The same command again: the trial starts at 2 GiB, its second attempt, not at the spec's 1 GiB.
  fs::remove(gate);
  auto again = isorun::test::run_captured(ISORUN_CLI, {"sweep", dir + "/spec.yaml", "--no-progress"},
                                          simulated("1x8G"));
  INFO(again.err);
  CHECK(again.code == 0);
  CHECK_THAT(again.err, Catch::Contains("1 trials (1 to run)"));
  const auto log_lines = lines(log);
  REQUIRE(log_lines.size() == 5);
  CHECK(log_lines[3] == "begin 1 2048");
  journaled = records(out + "/results.jsonl");
  REQUIRE(journaled.size() == 2);
  CHECK(journaled[1]["outcome"] == "success");
  CHECK(journaled[1]["attempts"] == 2);
  CHECK(journaled[1]["mem_limit"] == 2 * GiB);
  // A crafted journal says the same: a record with retry_mem_limit is not the trial's end.
  journaled[1] = journaled[0];
  journaled[1]["attempts"] = 2;
  journaled[1]["mem_limit"] = 2 * GiB;
  journaled[1]["retry_mem_limit"] = 4 * GiB;
  {
    std::ofstream rewrite(out + "/results.jsonl");
    for (const auto& rec : journaled) rewrite << rec.dump() << "\n";
  }
  auto crafted = isorun::test::run_captured(ISORUN_CLI, {"sweep", dir + "/spec.yaml", "--no-progress"},
                                            simulated("1x8G"));
  INFO(crafted.err);
  CHECK(crafted.code == 0);
  CHECK(lines(log).back() == "end 1 4096");
  CHECK(records(out + "/results.jsonl").back()["attempts"] == 3);
  fs::remove_all(dir);
}

TEST_CASE("oom_retry: a searched trial stopped after an out-of-memory attempt resumes at the larger cap too",
          "[sweep][command][cap][oom-retry][resume][search]") {
  const std::string dir = temp_dir(), out = dir + "/out", gate = dir + "/gate", log = dir + "/log";
  REQUIRE(::mkfifo(gate.c_str(), 0600) == 0);
  std::ofstream{log};
  std::string spec = needs_memory("  mib: [1536]\n  log: [\"" + log + "\"]\n  gate: [\"" + gate + "\"]\n",
                                  "{gpus: [0], mem_limit: 1G, per_gpu: 1}", "{oom_retry: {factor: 2, max: 4G}}", out);
  spec.replace(spec.find("{i}"), 3, "{x}");
  spec.replace(spec.find("{i}"), 3, "{x}");
  spec += "search: {type: command, command: [python3, " + std::string(SEARCHER) + ", \"" + dir +
          "/heard\"], params: [x], trials: 1}\n";
  std::ofstream(dir + "/spec.yaml") << spec;
  auto sweep = start_cli({"--grace", "100ms", "sweep", dir + "/spec.yaml", "--no-progress"}, simulated("1x8G"));
  REQUIRE(wait_for_lines(log, 3));  // the searcher's trial (x = 0): at 1 GiB, then its retry at 2 GiB
  CHECK(lines(log) == std::vector<std::string>{"begin 0 1024", "end 0 1024", "begin 0 2048"});
  ::kill(sweep.pid(), SIGINT);
  CHECK(sweep.reap().code == 130);
  fs::remove(gate);
  auto again = isorun::test::run_captured(ISORUN_CLI, {"sweep", dir + "/spec.yaml", "--no-progress"},
                                          simulated("1x8G"));
  INFO(again.err);
  CHECK(again.code == 0);
  const auto log_lines = lines(log);
  REQUIRE(log_lines.size() == 5);
  CHECK(log_lines[3] == "begin 0 2048");  // the trial the searcher proposed, given out again at its larger cap
  const auto journaled = records(out + "/results.jsonl");
  REQUIRE(journaled.size() == 2);
  CHECK(journaled[1]["outcome"] == "success");
  CHECK(journaled[1]["attempts"] == 2);
  fs::remove_all(dir);
}

TEST_CASE("oom_retry: two trials whose retried caps do not fit a GPU together run one after the other",
          "[sweep][command][cap][oom-retry][packing]") {
  const std::string dir = temp_dir(), out = dir + "/out", log = dir + "/log";
  // 3 GiB: two 1 GiB caps side by side, but one 2 GiB cap at a time.
  std::ofstream(dir + "/spec.yaml") << needs_memory(
      "  i: [1, 2]\n  mib: [1536]\n  log: [\"" + log + "\"]\n  gate: [\"" + dir + "/gate\"]\n",
      "{gpus: [0], mem_limit: 1G, per_gpu: 2}", "{oom_retry: {factor: 2, max: 2G}}", out);
  auto r = isorun::test::run_captured(ISORUN_CLI, {"sweep", dir + "/spec.yaml", "--no-progress"}, simulated("1x3G"));
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.err, Catch::Contains("2 GPU slots"));
  // The attempts at 2 GiB never overlap: each one's begin is followed by its own end.
  std::vector<std::string> at_2g;
  for (const auto& l : lines(log))
    if (l.ends_with(" 2048")) at_2g.push_back(l);
  REQUIRE(at_2g.size() == 4);
  for (std::size_t k = 0; k < at_2g.size(); k += 2) {
    INFO(at_2g[k] << " / " << at_2g[k + 1]);
    CHECK(at_2g[k].substr(0, 6) == "begin ");
    CHECK(at_2g[k + 1] == "end" + at_2g[k].substr(5));
  }
  fs::remove_all(dir);
}

TEST_CASE("oom_retry: a task trial under the capped allocator is retried at a larger cap", "[sweep][cap][oom-retry]") {
  const std::string dir = temp_dir(), out = dir + "/out";
  std::ofstream(dir + "/spec.yaml") << "task: fill_mib\nparams:\n  arg0: [96]\nresources: {gpus: [0], mem_limit: 64M}\n"
                                       "policy: {oom_retry: {factor: 2, max: 256M}}\nout: \""
                                    << out << "\"\n";
  auto r = sweep_cli({"sweep", dir + "/spec.yaml", "--no-progress"}, {"ISORUN_SIMULATE_GPUS=1x1G"});
  INFO(r.err);
  CHECK(r.code == 0);
  const auto all = records(out + "/results.jsonl");
  REQUIRE(all.size() == 2);
  CHECK(all[0]["outcome"] == "out_of_memory");
  CHECK(all[0]["mem_limit"] == 64 * MiB);
  CHECK(all[0]["retry_mem_limit"] == 128 * MiB);
  CHECK(all[1]["outcome"] == "success");
  CHECK(all[1]["mem_limit"] == 128 * MiB);
  CHECK(all[1]["result"] == 96);
  fs::remove_all(dir);
}

TEST_CASE("oom_retry: bad input is refused with the line or flag, exit 2, nothing started",
          "[sweep][errors][oom-retry]") {
  const std::string dir = temp_dir(), out = dir + "/out";
  // In the spec, at its line (the lines alone: "spec errors name the YAML line").
  CHECK_THROWS_WITH(sw::parse_spec("task: t\npolicy: {oom_retry: {factor: 0.5, max: 16G}}\n", "t.yaml"),
                    Catch::Contains("line 2: oom_retry factor must be a number of at least 1.1"));
  // A factor barely above 1 would retry a trial a byte at a time: refused, and so are attempts
  // that are no whole number from 2.
  CHECK_THROWS_WITH(sw::parse_spec("task: t\npolicy: {oom_retry: {factor: 1.0000000001, max: 16G}}\n", "t.yaml"),
                    Catch::Contains("line 2: oom_retry factor must be a number of at least 1.1"));
  CHECK_THROWS_WITH(sw::parse_spec("task: t\npolicy: {oom_retry: {factor: 2, max: 16G, max_attempts: 1}}\n", "t.yaml"),
                    Catch::Contains("line 2: oom_retry max_attempts must be a whole number from 2 to 1000"));
  CHECK_THROWS_WITH(
      sw::parse_spec("task: t\npolicy: {oom_retry: {factor: 2, max: 16G, max_attempts: 2.5}}\n", "t.yaml"),
      Catch::Contains("max_attempts must be a whole number"));
  CHECK(sw::parse_spec("task: t\npolicy: {oom_retry: {factor: 1.1, max: 16G, max_attempts: 12}}\n", "t.yaml")
            .oom_retry.max_attempts == 12);
  CHECK_THROWS_WITH(sw::parse_spec("task: t\npolicy: {oom_retry: {factor: 2, max: 16Q}}\n", "t.yaml"),
                    Catch::Contains("line 2: oom_retry max is not a size"));
  CHECK_THROWS_WITH(sw::parse_spec("task: t\npolicy: {oom_retry: {factr: 2, max: 1G}}\n", "t.yaml"),
                    Catch::Contains("unknown key 'factr' (did you mean 'factor'?)"));
  CHECK_THROWS_WITH(sw::parse_spec("task: t\npolicy: {oom_retyr: {}}\n", "t.yaml"),
                    Catch::Contains("unknown policy 'oom_retyr' (did you mean 'oom_retry'?)"));
  const auto spec = sw::parse_spec("task: t\npolicy:\n  oom_retry: {factor: 1.5, max: 16G}\n", "t.yaml");
  CHECK(spec.oom_retry.factor == 1.5);
  CHECK(spec.oom_retry.max == 16 * GiB);
  CHECK(spec.oom_retry.line == 3);
  CHECK(spec.oom_retry.max_attempts == 8);  // the default
  // next_cap: times the factor, the last at exactly max.
  CHECK(sw::next_cap(spec.oom_retry, 4 * GiB) == 6 * GiB);
  CHECK(sw::next_cap(spec.oom_retry, 12 * GiB) == 16 * GiB);
  CHECK(sw::next_cap(spec.oom_retry, 16 * GiB) == 0);
  CHECK(sw::next_cap({}, 1 * GiB) == 0);

  // What needs the rest of the sweep, and the flag: exit 2 naming it, nothing created.
  const std::string base = "task: step\nparams:\n  i: [1]\n  log: [\"" + dir + "/log\"]\nout: \"" + out + "\"\n";
  const std::vector<std::tuple<std::string, std::vector<std::string>, std::string>> bad = {
      {"resources: {cpu_slots: 1}\npolicy:\n  oom_retry: {factor: 2, max: 4G}\n",
       {},
       "spec.yaml: line 8: oom_retry (max 4.00 GiB) retries a trial at a larger cap, and the sweep has no cap to start "
       "from; set one below max (resources: mem_limit: 2.00GiB"},
      {"resources: {cpu_slots: 1, mem_limit: 4G}\npolicy:\n  oom_retry: {factor: 2, max: 2G}\n",
       {},
       "line 8: oom_retry (max 2.00 GiB): max is not above mem_limit 4.00 GiB"},
      {"resources: {gpus: [0], mem_limit: 1G}\npolicy:\n  oom_retry: {factor: 2, max: 12G}\n",
       {},
       "line 8: oom_retry (max 12.00 GiB): a trial at the max needs 12.00 GiB on 1 GPU, more than the sweep's GPUs "
       "have for trials (GPU 0: 6.00 GiB; free memory less room for warm standby contexts)"},
      {"resources: {backend: slurm, mem_limit: 1G}\npolicy:\n  oom_retry: {factor: 2, max: 4G}\n",
       {},
       "line 8: oom_retry (max 4.00 GiB) runs on this machine only, not with backend: slurm"},
      {"resources: {cpu_slots: 1, mem_limit: 1G}\n",
       {"--oom-retry", "2"},
       "--oom-retry '2': no ':' between the factor and the max"},
      {"resources: {cpu_slots: 1, mem_limit: 1G}\n",
       {"--oom-retry", "x:16G"},
       "--oom-retry 'x:16G': the factor 'x' is not a number"},
      {"resources: {cpu_slots: 1, mem_limit: 1G}\n", {"--oom-retry", "2:"}, "--oom-retry '2:': no max after ':'"},
      {"resources: {cpu_slots: 1, mem_limit: 1G}\n", {"--oom-retry", "1:16G"}, "the factor 1 must be at least 1.1"},
      {"resources: {cpu_slots: 1, mem_limit: 1G}\n", {"--oom-retry", "1.0000000001:16G"}, "must be at least 1.1"},
      {"resources: {cpu_slots: 1, mem_limit: 1G}\n",
       {"--oom-retry", "2:16G:1"},
       "the attempts '1' are not a whole number of at least 2"},
      {"resources: {cpu_slots: 1, mem_limit: 1G}\n", {"--oom-retry", "2:16X"}, "the max '16X' is not a size"},
      {"resources: {cpu_slots: 1}\n",
       {"--oom-retry", "2:16G"},
       "--oom-retry (max 16.00 GiB) retries a trial at a larger cap"},
  };
  for (const auto& [more, flags, said] : bad) {
    std::ofstream(dir + "/spec.yaml") << base << more;
    std::vector<std::string> args = {"sweep", dir + "/spec.yaml", "--no-progress"};
    args.insert(args.end(), flags.begin(), flags.end());
    auto r = sweep_cli(args, {"ISORUN_SIMULATE_GPUS=1x8G"});
    INFO(more << "\n" << r.err);
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Catch::Contains("isorun: error: ") && Catch::Contains(said));
    CHECK_FALSE(fs::exists(out));
    CHECK_FALSE(fs::exists(dir + "/log"));
  }
  // The flag sets what the spec would.
  std::ofstream(dir + "/spec.yaml") << base << "resources: {cpu_slots: 1, mem_limit: 1G}\n";
  auto ok = sweep_cli({"sweep", dir + "/spec.yaml", "--no-progress", "--oom-retry", "2:4G"});
  INFO(ok.err);
  CHECK(ok.code == 0);
  fs::remove_all(dir);
}

TEST_CASE("oom_retry: max_attempts ends a trial's retries, though a larger cap would have fit",
          "[sweep][command][cap][oom-retry]") {
  const std::string dir = temp_dir(), out = dir + "/out";
  // It needs 3000 MiB: 1 GiB and 2 GiB run out, 4 GiB would do, but two attempts are all it gets.
  std::ofstream(dir + "/spec.yaml") << needs_memory(
      "  i: [1]\n  mib: [3000]\n  log: [\"" + dir + "/log\"]\n  gate: [\"" + dir + "/gate\"]\n",
      "{gpus: [0], mem_limit: 1G, per_gpu: 1}", "{oom_retry: {factor: 2, max: 4G, max_attempts: 2}}", out);
  auto r = isorun::test::run_captured(ISORUN_CLI, {"sweep", dir + "/spec.yaml", "--no-progress"}, simulated("1x8G"));
  INFO(r.err);
  CHECK(r.code == 1);
  const auto all = records(out + "/results.jsonl");
  REQUIRE(all.size() == 2);
  CHECK(all[0]["retry_mem_limit"] == 2 * GiB);
  CHECK(all[1]["outcome"] == "out_of_memory");
  CHECK(all[1]["mem_limit"] == 2 * GiB);
  CHECK_FALSE(all[1].contains("retry_mem_limit"));
  fs::remove_all(dir);
}
