// Sweeps fed hostile input by their own trials and files: deeply nested JSON, bytes that are not
// UTF-8, planted links. Each ends as one trial's failure or an ignored line, never the sweep's.
#include <catch2/catch.hpp>

#include "sweep_test_support.hpp"

namespace {

// `{"x": [[...]]}`-like text nested `depth` deep in all (the object counts as one level).
std::string nested(int depth, const std::string& head = "") {
  return "{" + head + "\"x\": " + std::string(static_cast<std::size_t>(depth - 1), '[') +
         std::string(static_cast<std::size_t>(depth - 1), ']') + "}";
}

}  // namespace

TEST_CASE("a trial's deeply nested result or report line is its invalid_result, not the sweep's end",
          "[sweep][command][hostile]") {
  const std::string dir = temp_dir();
  // Each trial prints the line in its file: mode 0 a result line 100,000 deep, 1 a report line
  // that deep and then a plain result, 2 a result exactly at the bound, 3 writes the deep one to
  // $ISORUN_RESULT.
  const std::string deep = nested(100000), report = nested(100000, "\"step\": 0, "), at_bound = nested(64);
  std::ofstream(dir + "/0") << deep << "\n";
  std::ofstream(dir + "/1") << report << "\n{\"ok\": 1}\n";
  std::ofstream(dir + "/2") << at_bound << "\n";
  std::ofstream(dir + "/3") << deep << "\n";
  std::ofstream(dir + "/spec.yaml")
      << "command: [sh, -c, 'if [ {mode} = 3 ]; then cat \"{dir}/3\" > \"$ISORUN_RESULT\"; else cat \"{dir}/{mode}\"; fi']\n"
      << "params:\n  mode: [0, 1, 2, 3]\n  dir: [\"" << dir << "\"]\nresources: {cpu_slots: 2}\nout: \"" << dir
      << "/out\"\n";
  auto r = sweep_cli({"sweep", dir + "/spec.yaml", "--no-progress"});
  INFO(r.err);
  CHECK(r.code == 1);  // two trials failed; the supervisor did not
  const auto journal = read_journal(dir + "/out/results.jsonl");
  REQUIRE(journal.size() == 4);
  auto of = [&](int mode) { return journal[json{{"dir", dir}, {"mode", mode}}.dump()]; };
  CHECK(of(0)["outcome"] == "invalid_result");
  CHECK_THAT(of(0)["error"].get<std::string>(), Catch::Contains("nested deeper than 64 levels"));
  CHECK(of(1)["outcome"] == "success");
  CHECK(of(1)["result"] == json{{"ok", 1}});
  CHECK(of(2)["outcome"] == "success");
  CHECK(of(3)["outcome"] == "invalid_result");
  CHECK_THAT(of(3)["error"].get<std::string>(), Catch::Contains("$ISORUN_RESULT is nested deeper than 64 levels"));

  // The same lines planted in the folder's files are ignored lines, on resume and in the report.
  std::ofstream(dir + "/out/results.jsonl", std::ios::app)
      << "{\"id\":\"0000000000000000\",\"params\":{},\"outcome\":\"success\",\"result\":" << std::string(100000, '[')
      << std::string(100000, ']') << "}\n";
  std::ofstream(dir + "/out/reports.jsonl", std::ios::app)
      << "{\"trial\":\"0000000000000000\",\"step\":1,\"metrics\":" << nested(100000) << "}\n";
  auto again = sweep_cli({"sweep", dir + "/spec.yaml", "--no-progress"});
  INFO(again.err);
  CHECK(again.code == 1);
  CHECK_THAT(again.err, Catch::Contains("results.jsonl line 5 is not a trial record; ignored"));
  auto report_run = sweep_cli({"report", dir + "/out"});
  INFO(report_run.err);
  CHECK(report_run.code == 0);
  fs::remove_all(dir);
}

TEST_CASE("a trial that grows its result segment past any result is its invalid_result; the sweep goes on",
          "[sweep][hostile]") {
  const std::string dir = temp_dir();
  // Odd trials grow their segments past this machine's memory: mapped whole, each would have
  // taken the supervisor with every trial in flight.
  std::ofstream(dir + "/spec.yaml") << "task: grows_result\nparams:\n  arg0: [0, 1, 2, 3]\n"
                                    << "resources: {cpu_slots: 2}\nout: \"" << dir << "/out\"\n";
  auto r = sweep_cli({"sweep", dir + "/spec.yaml", "--no-progress"});
  INFO(r.err);
  CHECK(r.code == 1);  // two trials failed; the supervisor did not
  const auto journal = read_journal(dir + "/out/results.jsonl");
  REQUIRE(journal.size() == 4);
  for (int i = 0; i < 4; ++i) {
    const json rec = journal[json{{"arg0", i}}.dump()];
    INFO(rec.dump());
    if (i % 2) {
      CHECK(rec["outcome"] == "invalid_result");
      CHECK_THAT(rec["error"].get<std::string>(), Catch::Contains("segment grew to"));
    } else {
      CHECK(rec["outcome"] == "success");
      CHECK(rec["result"] == std::string(32 << 10, 'r'));
    }
  }
  fs::remove_all(dir);
}

TEST_CASE("a failing trial's bytes that are not UTF-8 are journaled as U+FFFD, and the sweep finishes",
          "[sweep][command][hostile]") {
  const std::string dir = temp_dir();
  // A Latin-1 byte, and a character cut short, on stderr.
  std::ofstream(dir + "/spec.yaml") << "command: [sh, -c, 'printf \"boom \\377 \\303\\n\" >&2; exit {code}']\n"
                                    << "params:\n  code: [1]\nout: \"" << dir << "/out\"\n";
  auto r = sweep_cli({"sweep", dir + "/spec.yaml", "--no-progress"});
  INFO(r.err);
  CHECK(r.code == 1);  // the trial failed; not an internal error (125)
  const auto journal = read_journal(dir + "/out/results.jsonl");
  REQUIRE(journal.size() == 1);
  const json rec = journal.begin().value();
  CHECK(rec["outcome"] == "task_error");
  CHECK_THAT(rec["error"].get<std::string>(), Catch::Contains("boom \xef\xbf\xbd \xef\xbf\xbd"));
  fs::remove_all(dir);
}

TEST_CASE("results.csv: text cells a spreadsheet would run as formulas get a leading quote, numbers stay",
          "[sweep][command][hostile][outputs]") {
  const std::string dir = temp_dir();
  std::ofstream(dir + "/spec.yaml")
      << "command: [sh, -c, 'echo \"{\\\"note\\\": \\\"=HYPERLINK(1)\\\", \\\"cmd\\\": \\\"@SUM(1)\\\", "
         "\\\"n\\\": -2, \\\"plain\\\": \\\"a-b\\\"}\"', '{tag}']\n"
      << "params:\n  tag: [\"-2+3\", \"+1\"]\nout: \"" << dir << "/out\"\n";
  auto r = sweep_cli({"sweep", dir + "/spec.yaml", "--no-progress"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  const std::string csv = read_file(dir + "/out/results.csv");
  INFO(csv);
  for (const char* cell : {",'-2+3", ",'+1", ",'=HYPERLINK(1)", ",'@SUM(1)", ",-2,", ",a-b"})
    CHECK_THAT(csv, Catch::Contains(cell));
  for (const char* cell : {",-2+3", ",+1,", ",=HYPERLINK", ",@SUM"}) CHECK_THAT(csv, !Catch::Contains(cell));
  fs::remove_all(dir);
}

TEST_CASE("a resume replays only the reports of its own trials that are done: crafted lines prune no one",
          "[sweep][command][hostile][early-stopping][resume]") {
  const std::string dir = temp_dir(), out = dir + "/out";
  // Two trials report steps 1 to 3 with loss x: x = 1 is the best, and is never pruned.
  std::ofstream(dir + "/spec.yaml")
      << "command: [sh, -c, 'for i in 1 2 3; do echo \"{\\\"step\\\": $i, \\\"loss\\\": {x}}\"; done']\n"
      << "params: {x: [1, 2]}\nmetric: {name: loss, goal: minimize}\n"
      << "scheduler: {type: asha, grace_period: 1, max_t: 100, reduction_factor: 2}\n"
      << "resources: {cpu_slots: 1}\nout: \"" << out << "\"\n";
  auto first = sweep_cli({"sweep", dir + "/spec.yaml", "--no-progress"});
  INFO(first.err);
  REQUIRE(first.code == 0);
  const json first_journal = read_journal(out + "/results.jsonl");
  const std::string best = first_journal[json{{"x", 1}}.dump()]["id"];
  REQUIRE_FALSE(best.empty());
  // The journal lost, and reports.jsonl replaced by two lines: a trial the sweep does not have,
  // better than any, and the best trial far worse than it is.
  std::ofstream(out + "/results.jsonl", std::ios::trunc).flush();
  std::ofstream(out + "/reports.jsonl", std::ios::trunc)
      << "{\"trial\":\"0000000000000000\",\"step\":1,\"metrics\":{\"loss\":-1}}\n"
      << "{\"trial\":\"" << best << "\",\"step\":1,\"metrics\":{\"loss\":1e9}}\n";
  auto again = sweep_cli({"sweep", dir + "/spec.yaml", "--no-progress"});
  INFO(again.err);
  CHECK(again.code == 0);
  const auto journal = read_journal(out + "/results.jsonl");
  REQUIRE(journal.size() == 2);
  CHECK(journal[json{{"x", 1}}.dump()]["outcome"] == "success");
  CHECK_FALSE(journal[json{{"x", 1}}.dump()].value("pruned", false));
  fs::remove_all(dir);
}

TEST_CASE("a record whose text is not UTF-8 is journaled with U+FFFD, never refused", "[sweep][journal][hostile]") {
  const std::string dir = temp_dir();
  {
    sw::journal j(dir);
    sw::trial_record r;
    r.id = "0000000000000001";
    r.params = json{{"x", 1}};
    r.kind = isorun::outcome_kind::task_error;
    r.error = "boom \xff \xc3";  // by a path that did not make it valid
    CHECK_NOTHROW(j.append({r}));
  }
  const sw::journal again(dir);
  REQUIRE(again.latest().count("0000000000000001") == 1);
  CHECK(again.latest().at("0000000000000001").error == "boom \xef\xbf\xbd \xef\xbf\xbd");
  fs::remove_all(dir);
}
