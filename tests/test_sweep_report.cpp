// The report: axes, data, size, the memory timeline, and the page in Chromium.
#include <catch2/catch.hpp>

#include "sweep_test_support.hpp"

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

TEST_CASE("report axes: a range narrower than its values' precision gets its two ends", "[sweep][report]") {
  // 1e16 and the next doubles: a fifth of the range is a step that adding does not advance by
  // (a fuzzed report once looped there, allocating ticks without end).
  const double lo = 1e16, hi = std::nextafter(std::nextafter(lo, 2e16), 2e16);
  const auto labels = sw::axis_tick_labels(sw::axis_for("v", {json(lo), json(hi)}), 350);
  CHECK(labels.size() == 2);
}
TEST_CASE("report data: outcome counts and the slots' intervals come from the journal", "[sweep][report]") {
  const std::string dir = temp_dir();
  std::ofstream(dir + "/sweep.json") << json{
      {"task", "t"},
      {"subject", "t"},
      {"metric", {{"name", "acc"}, {"maximize", true}}},
      {"runs",
       {{{"run", 1},
         {"slots", {{{"index", 0}, {"device", "cpu"}}, {{"index", 1}, {"device", "cpu"}}}},
         {"wall_s", 3.0}}}}}.dump();
  {
    std::ofstream j(dir + "/results.jsonl");
    auto rec = [&](const std::string& id, const char* outcome, int slot, double start, double wall, double acc) {
      j << json{{"id", id},           {"params", {{"lr", acc / 10}}},
                {"outcome", outcome}, {"slot", slot},
                {"run", 1},           {"start_s", start},
                {"wall_s", wall},     {"result", std::string(outcome) == "success" ? json{{"acc", acc}} : json()}}
               .dump()
        << "\n";
    };
    rec("a", "success", 0, 0.0, 1.0, 0.5);
    rec("b", "crashed", 1, 0.1, 0.4, 0);
    rec("c", "success", 1, 0.6, 1.5, 0.9);
    rec("b", "success", 0, 1.2, 0.5, 0.7);  // a retry in the same run: its last record counts
    j << "{\"id\": \"cut sh";               // a line being written
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
  for (const char* section :
       {"id=\"summary\"", "id=\"params\"", "id=\"parallel\"", "id=\"trials\"", "id=\"slots\"", "id=\"memory\""})
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
  CHECK(sw::results_csv({n}).find("peak_reserved,mem_limit,result,error\n") != std::string::npos);
}
TEST_CASE("a report of 10,000 trials stays small: charts sample or merge, the table is paged", "[sweep][report]") {
  const std::string dir = temp_dir();
  json slots = json::array();
  for (int s = 0; s < 16; ++s) slots.push_back({{"index", s}, {"device", "GPU-sim-" + std::to_string(s / 8)}});
  std::ofstream(dir + "/sweep.json") << json{{"subject", "big"},
                                             {"metric", {{"name", "loss"}, {"maximize", false}}},
                                             {"runs", {{{"run", 1}, {"slots", slots}, {"mem_limit", 1 << 30}}}}}
                                            .dump();
  {
    std::ofstream j(dir + "/results.jsonl");
    for (int i = 0; i < 10000; ++i)
      j << json{{"id", "t" + std::to_string(i)},
                {"params", {{"lr", 1e-4 * (1 + i % 100)}, {"width", i % 7}, {"act", i % 2 ? "relu" : "gelu"}}},
                {"outcome", i % 50 ? "success" : "out_of_memory"},
                {"slot", i % 16},
                {"run", 1},
                {"start_s", 0.01 * (i / 16)},
                {"wall_s", 0.0095},
                {"peak_reserved", (i % 1000) << 20},
                {"mem_limit", 1 << 30},
                {"result", i % 50 ? json{{"loss", 1.0 / (1 + i)}} : json()}}
               .dump()
        << "\n";
  }
  const std::string page = sw::render_report(sw::load_report_data(dir));
  CHECK(page.size() < 6'000'000);
  CHECK(occurrences(page, "<circle") <= 2 * 2000);  // two numeric parameters, sampled
  CHECK(occurrences(page, "<polyline") <= 800 + 50);
  CHECK(occurrences(page, "class=\"busy\"") > 0);      // 10,000 bars merged into busy spans
  CHECK(occurrences(page, "<tr><td") == 0);            // rows are drawn by the page, 50 at a time
  CHECK(page.find("\"t9999\"") != std::string::npos);  // ... from the data, all of it
  fs::remove_all(dir);
}
TEST_CASE("a sweep writes its report; a trial that ran out of memory shows what was live", "[sweep][report]") {
  const std::string dir = temp_dir();
  std::ofstream(dir + "/spec.yaml") << "task: fill_mib\nparams:\n  arg0: [16, 64, 400]\n"
                                       "resources: {cpu_slots: 2, mem_limit: 256M, alloc_conf: \"history:10000\"}\n"
                                       "out: \""
                                    << dir << "/out\"\n";
  auto r = isorun::test::run_captured(ISORUN_CLI,
                                      {"--tasks", SWEEP_TEST_TASKS, "sweep", dir + "/spec.yaml", "--no-progress"});
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
  CHECK(page.find(by_size[400]["id"].get<std::string>() + " · out_of_memory") <
        page.find(by_size[16]["id"].get<std::string>() + " · success"));

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
TEST_CASE("the digits sweep's report loads in Chromium with every section and no console error", "[browser]") {
  const std::string dir = temp_dir();
  std::ofstream(dir + "/spec.yaml")
      << "task: digits\nmetric: {name: accuracy, goal: maximize}\n"
         "params:\n  model: [mlp, softmax]\n  lr: [0.01, 0.1, 1.0]\n  hidden: [16, 64]\n  epochs: 5\n"
         "resources: {cpu_slots: 2, mem_limit: 256M, alloc_conf: \"history:20000\"}\n"
         "out: \""
      << dir << "/out\"\n";
  REQUIRE(isorun::test::run_captured(ISORUN_CLI, {"sweep", dir + "/spec.yaml", "--no-progress"}).code == 0);
  const auto r = in_browser("file://" + dir + "/out/report.html", dir + "/profile");
  INFO(r.log);
  REQUIRE(r.code == 0);
  CHECK(console_lines(r.log).empty());
  CHECK(r.dom.find("data-ready=\"yes\"") != std::string::npos);  // the script ran to its end
  for (const char* section : {"summary", "params", "parallel", "table", "slots", "memory", "timelines"})
    CHECK(r.dom.find(std::string("<section id=\"") + section + "\"") != std::string::npos);
  CHECK(occurrences(r.dom, "<tr><td>") >= 12);  // the script drew the 12 trials' rows
  CHECK(r.dom.find("12 trials; page 1 of 1") != std::string::npos);
  if (const char* keep = std::getenv("ISORUN_REPORT_PNG"))
    in_browser("file://" + dir + "/out/report.html", dir + "/profile", keep);
  fs::remove_all(dir);
}
TEST_CASE("an out-of-memory trial's timeline loads in Chromium, showing what was live", "[browser]") {
  const std::string dir = temp_dir();
  REQUIRE(isorun::test::run_captured(ISORUN_CLI, {"--tasks", SWEEP_TEST_TASKS, "--cpu", "--mem-limit", "256M",
                                                  "--memory-timeline", dir + "/oom.html", "fill_mib", "arg0=400"})
              .code == 3);
  const auto r = in_browser("file://" + dir + "/oom.html", dir + "/profile");
  INFO(r.log);
  REQUIRE(r.code == 0);
  CHECK(console_lines(r.log).empty());
  CHECK(r.dom.find("data-ready=\"yes\"") != std::string::npos);
  CHECK(r.dom.find("Out of memory:") != std::string::npos);
  CHECK(r.dom.find("<polyline class=\"allocated\"") != std::string::npos);
  CHECK(occurrences(r.dom, "<tr><td>") == 1);  // 32 x 8 MiB, one row
  CHECK(r.dom.find("32 × 8.00 MiB</td><td>256.00 MiB</td>") != std::string::npos);
  if (const char* keep = std::getenv("ISORUN_TIMELINE_PNG"))
    in_browser("file://" + dir + "/oom.html", dir + "/profile", keep);
  fs::remove_all(dir);
}
TEST_CASE("a report whose data holds <!--<script> still draws its table in Chromium", "[browser][hostile]") {
  // "<!--<script>" in a script element's text would switch the HTML parser into its escaped
  // states, and the rest of the page into the script; the data escapes every '<'.
  const std::string dir = temp_dir();
  std::ofstream(dir + "/sweep.json") << json{{"task", "t"}, {"subject", "t"}, {"runs", json::array()}}.dump();
  std::ofstream(dir + "/results.jsonl")
      << json{{"id", "0000000000000001"},
              {"params", {{"p", "<!--<script>"}}},
              {"outcome", "task_error"},
              {"error", "<!--<script> </script> \u2028 & >"}}
             .dump()
      << "\n"
      << json{{"id", "0000000000000002"}, {"params", {{"p", "x"}}}, {"outcome", "success"}}.dump() << "\n";
  sw::write_report(dir);
  const auto r = in_browser("file://" + dir + "/report.html", dir + "/profile");
  INFO(r.log);
  REQUIRE(r.code == 0);
  CHECK(console_lines(r.log).empty());
  CHECK(r.dom.find("data-ready=\"yes\"") != std::string::npos);
  CHECK(occurrences(r.dom, "<tr><td>") == 2);
  CHECK(r.dom.find("&lt;!--&lt;script&gt; &lt;/script&gt;") != std::string::npos);  // the error, as text in its cell
  fs::remove_all(dir);
}

// ---- Sweeps on Slurm (tests/slurm/run_tests.sh starts a single-node cluster for these) ----
