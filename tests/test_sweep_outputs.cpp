// A sweep's output folder, its report and what it prints, against hostile input: links and FIFOs
// planted in the folder, a crafted or damaged journal and timelines, control characters in
// strings others wrote. Each runs the real CLI on a real folder.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "isorun/sweep/html_report.hpp"
#include "isorun/sweep/sweep.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;
namespace sw = isorun::sweep;
using nlohmann::json;

namespace {

std::string temp_dir() {
  char dir[] = "/tmp/isorun-outputs-test-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  return dir;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

isorun::test::captured cli(const std::vector<std::string>& args) {
  std::vector<std::string> all = {"--tasks", SWEEP_TEST_TASKS};
  all.insert(all.end(), args.begin(), args.end());
  return isorun::test::run_captured(ISORUN_CLI, all);
}

// A two-trial sweep of `step` on one CPU slot into `out`.
isorun::test::captured step_sweep(const std::string& out, const std::vector<std::string>& more = {}) {
  std::vector<std::string> args = {"sweep", "step",  "--grid", "i=1,2",        "--cpu-slots",
                                   "1",     "--out", out,      "--no-progress"};
  args.insert(args.end(), more.begin(), more.end());
  return cli(args);
}

// The ids of the trials of step_sweep.
std::vector<std::string> step_ids() {
  return {sw::trial_id("step", json{{"i", 1}}), sw::trial_id("step", json{{"i", 2}})};
}

// Files under `dir` whose name ends with ".tmp" (left behind by a write), but for `except`.
std::vector<std::string> temporaries(const fs::path& dir, const std::string& except = "") {
  std::vector<std::string> found;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.path().extension() == ".tmp" && e.path().filename() != except) found.push_back(e.path().string());
  return found;
}

// A folder as a sweep leaves it, written by hand: sweep.json with one run of two slots, the
// journal's lines as given.
void crafted_folder(const fs::path& out, const std::vector<json>& records) {
  fs::create_directories(out / "logs");
  write_file(out / "sweep.json",
             json{{"task", "t"},
                  {"subject", "t"},
                  {"trials", records.size()},
                  {"runs",
                   {{{"run", 1},
                     {"slots", {{{"index", 0}, {"device", "cpu"}}, {{"index", 1}, {"device", "cpu"}}}},
                     {"wall_s", 2.0}}}}}
                 .dump());
  std::ofstream j(out / "results.jsonl");
  for (const auto& r : records) j << r.dump() << "\n";
}

json record(const std::string& id, int i, const char* outcome = "success") {
  return {{"id", id},
          {"params", {{"i", i}}},
          {"outcome", outcome},
          {"slot", 0},
          {"run", 1},
          {"start_s", 0.1 * i},
          {"wall_s", 0.5},
          {"result", {{"score", i}}},
          {"timeline", "logs/" + id + ".memory.json"}};
}

// A valid timeline whose device is GPU `index` (the page says "GPU <index>").
json timeline(int index) {
  return {{"start_ns", 1000},
          {"end_ns", 3000000},
          {"devices",
           {{{"index", index},
             {"cap", 1 << 20},
             {"allocated", 4096},
             {"reserved", 8192},
             {"events", {{{"t_ns", 2000}, {"action", "alloc"}, {"size", 4096}}}}}}}};
}

}  // namespace

TEST_CASE("report.html: a link planted at its name or its old temporary name is replaced, never written through",
          "[sweep][hostile]") {
  const std::string dir = temp_dir(), out = dir + "/out";
  REQUIRE(step_sweep(out).code == 0);
  write_file(dir + "/victim", "precious\n");
  write_file(dir + "/victim2", "precious too\n");
  fs::remove(out + "/report.html");
  fs::create_symlink(dir + "/victim", out + "/report.html.tmp");
  fs::create_symlink(dir + "/victim2", out + "/report.html");
  auto r = cli({"report", out});
  INFO(r.err);
  CHECK(r.code == 0);
  CHECK(read_file(dir + "/victim") == "precious\n");
  CHECK(read_file(dir + "/victim2") == "precious too\n");
  CHECK_FALSE(fs::is_symlink(out + "/report.html"));  // the page replaced the link
  CHECK(read_file(out + "/report.html").find("id=\"trials-data\"") != std::string::npos);
  CHECK(temporaries(out, "report.html.tmp").empty());
  fs::remove_all(dir);
}

TEST_CASE("sweep.lock, results.jsonl and logs/: a link or a FIFO there stops the sweep before it writes anything",
          "[sweep][hostile]") {
  const std::string dir = temp_dir(), out = dir + "/out";
  write_file(dir + "/victim", "precious\n");
  fs::create_directories(out);

  SECTION("sweep.lock a link") {
    fs::create_symlink(dir + "/victim", out + "/sweep.lock");
    auto r = step_sweep(out);
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Catch::Contains(out + "/sweep.lock is a symbolic link"));
  }
  SECTION("sweep.lock a FIFO") {
    REQUIRE(::mkfifo((out + "/sweep.lock").c_str(), 0600) == 0);
    auto r = step_sweep(out);
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Catch::Contains(out + "/sweep.lock is not a regular file"));
  }
  SECTION("results.jsonl a link") {
    fs::create_symlink(dir + "/victim", out + "/results.jsonl");
    auto r = step_sweep(out);
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Catch::Contains(out + "/results.jsonl is a symbolic link"));
  }
  SECTION("logs/ a link to another folder") {
    fs::create_directories(dir + "/elsewhere");
    fs::create_symlink(dir + "/elsewhere", out + "/logs");
    auto r = step_sweep(out);
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Catch::Contains(out + "/logs is a symbolic link"));
    CHECK(fs::is_empty(dir + "/elsewhere"));
  }
  CHECK(read_file(dir + "/victim") == "precious\n");
  fs::remove_all(dir);
}

TEST_CASE("logs/ID.err and .out: a link planted there is not written through; the trial says why", "[sweep][hostile]") {
  const std::string dir = temp_dir(), out = dir + "/out";
  write_file(dir + "/victim", "precious\n");
  fs::create_directories(out + "/logs");
  const auto ids = step_ids();
  fs::create_symlink(dir + "/victim", out + "/logs/" + ids[0] + ".err");
  fs::create_symlink(dir + "/victim", out + "/logs/" + ids[1] + ".out");
  auto r = step_sweep(out);
  INFO(r.err);
  CHECK(r.code == 1);  // both trials failed: neither could have its log
  CHECK(read_file(dir + "/victim") == "precious\n");
  std::istringstream journal(read_file(out + "/results.jsonl"));
  int records = 0;
  for (std::string line; std::getline(journal, line); ++records) {
    const json rec = json::parse(line);
    CHECK(rec["outcome"] == "internal_error");
    CHECK_THAT(rec["error"].get<std::string>(), Catch::Contains("is a symbolic link"));
  }
  CHECK(records == 2);
  fs::remove_all(dir);
}

TEST_CASE("logs/ID.err keeps the first 8 MiB of a trial's stderr, then says it was cut", "[sweep][hostile]") {
  const std::string dir = temp_dir(), out = dir + "/out";
  const std::string note = "isorun: truncated at 8.00 MiB: what it wrote after this was not kept\n";
  const auto cut = [&](const std::string& id) {
    const std::string err = read_file(out + "/logs/" + id + ".err");
    CHECK(err.size() == (std::size_t{8} << 20) + note.size());
    CHECK(err.compare(0, 1024, std::string(1023, 'e') + "\n") == 0);  // its start is kept
    CHECK(err.substr(err.size() - note.size()) == note);
  };
  SECTION("a task's worker") {
    const auto r = cli({"sweep", "spew", "--grid", "arg0=10", "--cpu-slots", "1", "--out", out, "--no-progress"});
    INFO(r.err);
    CHECK(r.code == 0);  // the trial itself is not the worse for it
    cut(sw::trial_id("spew", json{{"arg0", 10}}));
  }
  SECTION("a command") {
    const auto r = cli({"sweep", "--grid", "n=10", "--cpu-slots", "1", "--out", out, "--no-progress", "--", "sh", "-c",
                        "yes $(printf 'e%.0s' $(seq 1023)) | head -n $(({n} * 1024)) >&2; echo '{\"n\": {n}}'"});
    INFO(r.err);
    CHECK(r.code == 0);
    const auto records = read_file(out + "/results.jsonl");
    cut(json::parse(records.substr(0, records.find('\n')))["id"].get<std::string>());
  }
  fs::remove_all(dir);
}

TEST_CASE("an output folder that is itself a link to a folder still works", "[sweep][hostile]") {
  const std::string dir = temp_dir();
  fs::create_directories(dir + "/real");
  fs::create_symlink(dir + "/real", dir + "/out");
  auto r = step_sweep(dir + "/out");
  INFO(r.err);
  CHECK(r.code == 0);
  CHECK(fs::is_regular_file(dir + "/real/report.html"));
  CHECK(fs::is_regular_file(dir + "/real/results.csv"));
  CHECK(cli({"report", dir + "/out"}).code == 0);
  CHECK(temporaries(dir + "/real").empty());
  fs::remove_all(dir);
}

TEST_CASE("--memory-timeline: links at the page's name and beside it are not written through", "[sweep][hostile]") {
  const std::string dir = temp_dir();
  write_file(dir + "/victim", "precious\n");
  write_file(dir + "/victim2", "precious too\n");
  fs::create_symlink(dir + "/victim", dir + "/mem.html");
  fs::create_symlink(dir + "/victim2", dir + "/mem.html.json.tmp");  // the sidecar's old, fixed name
  auto r = cli({"--cpu", "--mem-limit", "128M", "--memory-timeline", dir + "/mem.html", "fill_mib", "arg0=16"});
  INFO(r.err);
  CHECK(r.code == 0);
  CHECK(read_file(dir + "/victim") == "precious\n");
  CHECK(read_file(dir + "/victim2") == "precious too\n");
  CHECK_FALSE(fs::is_symlink(dir + "/mem.html"));
  CHECK(read_file(dir + "/mem.html").find("<svg") != std::string::npos);
  CHECK(temporaries(dir, "mem.html.json.tmp").empty());  // the timeline beside it is gone again
  fs::remove_all(dir);
}

TEST_CASE("isorun report: a timeline is found by its trial's id alone; a bad one is left out with a warning",
          "[sweep][hostile]") {
  const std::string dir = temp_dir(), out = dir + "/out";
  const std::string a = "00000000000000aa", b = "00000000000000bb", c = "00000000000000cc", e = "00000000000000ee";
  json ra = record(a, 1), rb = record(b, 2), rc = record(c, 3), re = record(e, 4);
  write_file(dir + "/secret.json", timeline(4242).dump());
  ra["timeline"] = dir + "/secret.json";  // an absolute path, read by no one
  rb["timeline"] = "../secret.json";      // nor one outside the folder
  crafted_folder(out, {ra, rb, rc, re});
  write_file(out + "/logs/" + c + ".memory.json", "{\"start_ns\": 1, \"devices\": [{\"ind");  // cut short
  write_file(out + "/logs/" + e + ".memory.json", R"({"start_ns": "soon", "devices": []})");  // a wrong type
  write_file(out + "/logs/" + a + ".memory.json", timeline(7).dump());  // a's own, found by its id

  auto r = cli({"report", out});
  INFO(r.err);
  CHECK(r.code == 0);
  const std::string page = read_file(out + "/report.html");
  CHECK(page.find("GPU 4242") == std::string::npos);
  CHECK(page.find("GPU 7") != std::string::npos);
  CHECK_THAT(r.err, Catch::Contains("warning: " + out + "/logs/" + c +
                                    ".memory.json is not a memory timeline: it is not JSON"));
  CHECK_THAT(r.err,
             Catch::Contains("warning: " + out + "/logs/" + e + ".memory.json is not a memory timeline: start_ns"));
  fs::remove_all(dir);
}

TEST_CASE("isorun report: a record's slot or run beyond what sweep.json lists is not drawn", "[sweep][hostile]") {
  const std::string dir = temp_dir(), out = dir + "/out";
  json far = record("00000000000000f1", 1), unknown_run = record("00000000000000f2", 2),
       negative = record("00000000000000f3", 3);
  far["slot"] = 300000000;
  unknown_run["run"] = 7;
  negative["slot"] = -5;
  crafted_folder(out, {record("0000000000000001", 4), far, unknown_run, negative});
  const auto d = sw::load_report_data(out);
  REQUIRE(d.records.size() == 4);
  const auto bars = sw::slot_intervals(d);
  REQUIRE(bars.size() == 1);
  CHECK(bars[0].id == "0000000000000001");
  auto r = cli({"report", out});
  CHECK(r.code == 0);
  CHECK(read_file(out + "/report.html").size() < 200000);
  fs::remove_all(dir);
}

TEST_CASE("isorun report: a journal or sweep.json that is a FIFO or a link to an endless file is refused",
          "[sweep][hostile]") {
  const std::string dir = temp_dir(), out = dir + "/out";
  crafted_folder(out, {record("0000000000000001", 1)});
  std::string name;
  SECTION("results.jsonl a link to /dev/zero") {
    name = "results.jsonl";
    fs::remove(out + "/" + name);
    fs::create_symlink("/dev/zero", out + "/" + name);
  }
  SECTION("results.jsonl a FIFO") {
    name = "results.jsonl";
    fs::remove(out + "/" + name);
    REQUIRE(::mkfifo((out + "/" + name).c_str(), 0600) == 0);
  }
  SECTION("sweep.json a FIFO") {
    name = "sweep.json";
    fs::remove(out + "/" + name);
    REQUIRE(::mkfifo((out + "/" + name).c_str(), 0600) == 0);
  }
  auto r = cli({"report", out});
  CHECK(r.code == 2);
  CHECK_THAT(r.err, Catch::Contains(out + "/" + name + " is") && Catch::Contains("remove it"));
  CHECK_FALSE(fs::exists(out + "/report.html"));
  fs::remove_all(dir);
}

TEST_CASE("journal records with fields of the wrong type or range are no records", "[sweep][hostile]") {
  const std::string dir = temp_dir(), out = dir + "/out";
  json huge_slot = record("00000000000000a1", 1), float_run = record("00000000000000a2", 2),
       bad_params = record("00000000000000a3", 3);
  huge_slot["slot"] = 1e300;
  float_run["run"] = "one";
  bad_params["params"] = json::array({1, 2});
  crafted_folder(out, {record("0000000000000001", 4), huge_slot, float_run, bad_params});
  const auto d = sw::load_report_data(out);
  REQUIRE(d.records.size() == 1);
  CHECK(d.records[0].id == "0000000000000001");
  CHECK(cli({"report", out}).code == 0);
  fs::remove_all(dir);
}

TEST_CASE("control characters in what the sweep prints from a spec or a journal are shown, not obeyed",
          "[sweep][hostile]") {
  const std::string dir = temp_dir(), out = dir + "/out";
  const std::string nasty = "\x1b]0;pwned\x07\x1b[2J";
  fs::create_directories(out);
  write_file(out + "/results.jsonl", "garbage " + nasty + "\n");  // reported as a line that is no record
  write_file(dir + "/spec.yaml",
             "command: [/bin/sh, -c, \"echo '{\\\"v\\\": 1}'\", \"{x}\"]\n"
             "params:\n  x: [\"\\e]0;pwned\\a\\e[2J\"]\nresources: {cpu_slots: 1}\n");
  auto r = isorun::test::run_captured(ISORUN_CLI, {"sweep", dir + "/spec.yaml", "--out", out});
  INFO(r.err);
  CHECK(r.code == 0);
  CHECK(r.out.find('\x1b') == std::string::npos);  // the top table's parameters
  CHECK(r.err.find('\x1b') == std::string::npos);  // the journal warning, the live lines
  CHECK(r.err.find('\x07') == std::string::npos);
  CHECK_THAT(r.out, Catch::Contains("x=\\x1b]0;pwned\\x07\\x1b[2J"));
  CHECK_THAT(r.err, Catch::Contains("(garbage \\x1b]0;pwned\\x07\\x1b[2J)"));
  fs::remove_all(dir);
}

TEST_CASE("the report's embedded data escapes <, >, &, U+2028 and U+2029, and reads back the same",
          "[sweep][hostile]") {
  const std::string dir = temp_dir(), out = dir + "/out";
  const std::string nasty = "<!--<script> </script> & > \xe2\x80\xa8 \xe2\x80\xa9";
  json r = record("0000000000000001", 1, "task_error");
  r["error"] = nasty;
  crafted_folder(out, {r});
  REQUIRE(cli({"report", out}).code == 0);
  const std::string page = read_file(out + "/report.html");
  const std::string open = "<script type=\"application/json\" id=\"trials-data\">";
  const auto begin = page.find(open) + open.size(), end = page.find("</script>", begin);
  REQUIRE(end != std::string::npos);
  const std::string data = page.substr(begin, end - begin);
  for (const char* raw : {"<", ">", "&", "\xe2\x80\xa8", "\xe2\x80\xa9"}) CHECK(data.find(raw) == std::string::npos);
  CHECK_THAT(data, Catch::Contains("\\u003c!--\\u003cscript\\u003e"));
  CHECK(json::parse(data)["rows"][0].back() == nasty);  // what JSON.parse gets back
  fs::remove_all(dir);
}

TEST_CASE("isorun report: trials that do not share their parameters are drawn without reading past them",
          "[sweep][hostile]") {
  // (Found by fuzz_report under ASan: a chart looked up a parameter its trial did not have.)
  const std::string dir = temp_dir(), out = dir + "/out";
  json a = record("0000000000000001", 1), b = record("0000000000000002", 2), c = record("0000000000000003", 3);
  a["params"] = {{"lr", 0.1}, {"model", "mlp"}};
  b["params"] = {{"lr", 0.01}};
  c["params"] = {{"model", "cnn"}, {"depth", 3}};
  crafted_folder(out, {a, b, c});
  const auto d = sw::load_report_data(out);
  CHECK(d.params.size() == 2);  // lr and model vary; depth has one value
  const std::string page = sw::render_report(d);
  CHECK(page.find("id=\"parallel\"") != std::string::npos);
  CHECK(cli({"report", out}).code == 0);
  fs::remove_all(dir);
}

TEST_CASE("a journal line longer than journal::max_line is skipped as it is read, not held", "[sweep][hostile]") {
  const std::string dir = temp_dir(), out = dir + "/out";
  fs::create_directories(out);
  {
    // A line of NUL bytes just past the limit (a sparse file: it takes no disk), then a newline.
    std::ofstream j(out + "/results.jsonl", std::ios::binary);
    j.seekp(static_cast<std::streamoff>(sw::journal::max_line) + 16);
    j << "\n";
  }
  auto r = step_sweep(out);
  INFO(r.err.substr(0, 2000));
  CHECK(r.code == 0);
  CHECK_THAT(r.err, Catch::Contains(out + "/results.jsonl line 1 is longer than 256 MiB: not a trial record; ignored"));
  const auto d = sw::load_report_data(out);
  CHECK(d.records.size() == 2);  // the two trials journaled after it
  fs::remove_all(dir);
}
