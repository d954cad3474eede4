// Submitting to Slurm without a cluster: a stand-in sbatch on PATH records the command line and
// the batch script it is given, so what reaches Slurm, and what never may, is checked exactly.
// (The `slurm`-labelled cases in test_sweep_slurm.cpp run the same path on a real test cluster.)
#include <catch2/catch.hpp>

#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "isorun/runner/errors.hpp"
#include "isorun/sweep/slurm.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;
namespace sw = isorun::sweep;
using nlohmann::json;

namespace {

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// A folder holding a stand-in `sbatch` first on PATH while it lives. The stand-in writes its
// arguments NUL-separated to `args` and a copy of the script (its last argument) to `script`,
// and prints a job id as `sbatch --parsable` does.
class fake_sbatch {
 public:
  fake_sbatch() {
    char d[] = "/tmp/isorun-fake-sbatch-XXXXXX";
    REQUIRE(::mkdtemp(d) != nullptr);
    dir_ = d;
    std::ofstream(dir_ / "sbatch") << "#!/bin/sh\n"
                                   << "printf '%s\\0' \"$@\" > '" << (dir_ / "args").string() << "'\n"
                                   << "for last; do :; done\n"
                                   << "cp \"$last\" '" << (dir_ / "script").string() << "'\n"
                                   << "echo '4242;test'\n";
    fs::permissions(dir_ / "sbatch", fs::perms::owner_all);
    const char* path = std::getenv("PATH");
    old_path_ = path ? path : "";
    ::setenv("PATH", (dir_.string() + ":" + old_path_).c_str(), 1);
  }
  ~fake_sbatch() {
    ::setenv("PATH", old_path_.c_str(), 1);
    fs::remove_all(dir_);
  }
  fake_sbatch(const fake_sbatch&) = delete;
  fake_sbatch& operator=(const fake_sbatch&) = delete;

  const fs::path& dir() const { return dir_; }
  bool called() const { return fs::exists(dir_ / "args"); }
  std::vector<std::string> args() const {
    std::vector<std::string> out;
    std::istringstream in(read_all(dir_ / "args"));
    for (std::string a; std::getline(in, a, '\0');) out.push_back(a);
    return out;
  }
  std::string script() const { return read_all(dir_ / "script"); }

 private:
  fs::path dir_;
  std::string old_path_;
};

sw::slurm_spec settings() {
  sw::slurm_spec s;
  s.partition = "gpu";
  s.account = "lab";
  s.time = "1:00:00";
  s.gpus_per_node = 1;
  s.max_running = 2;
  s.extra = {"--comment=two words; touch pwned", "--qos=long"};
  return s;
}

}  // namespace

TEST_CASE("Slurm's settings reach sbatch as arguments; the batch script holds only cd and exec",
          "[sweep][slurm-submit][hostile]") {
  fake_sbatch sbatch;
  // A space and a '%' in the output folder: as a script directive, sbatch would have split the
  // first and expanded the second.
  const fs::path out = sbatch.dir() / "out a%j";
  const auto sub = sw::slurm::submit(settings(), out, {0, 1, 2}, {"/opt/isorun", "sweep", "it's.yaml"}, sbatch.dir(),
                                     "isorun-x");
  CHECK(sub.job == "4242");
  CHECK(sub.batch == 1);
  const fs::path batch = out / "slurm" / "batch-1.json", script = out / "slurm" / "batch-1.sh";
  const std::vector<std::string> expected = {
      "--parsable",    "--job-name=isorun-x",
      "--array=0-2%2", "--output=" + sbatch.dir().string() + "/out a%%j/slurm/logs/%A_%a.out",
      "--no-requeue",  "--partition=gpu",
      "--account=lab", "--time=1:00:00",
      "--gres=gpu:1",  "--comment=two words; touch pwned",
      "--qos=long",    script.string()};
  CHECK(sbatch.args() == expected);

  const json b = json::parse(read_all(batch));
  CHECK(b["tasks"] == json::parse("[[0], [1], [2]]"));
  CHECK(b["sbatch"].get<std::vector<std::string>>() == std::vector<std::string>(expected.begin(), expected.end() - 1));

  // The script sbatch got: no directive, and two lines that are not comments, each word quoted.
  const std::string text = sbatch.script();
  CHECK(text == read_all(script));
  CHECK(text.find("#SBATCH") == std::string::npos);
  std::vector<std::string> commands;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);)
    if (!l.empty() && l[0] != '#') commands.push_back(l);
  REQUIRE(commands.size() == 3);
  CHECK(commands[0] == "cd '" + sbatch.dir().string() + "' || exit 1");
  CHECK(commands[1] == "ISORUN_ERROR_FILE='" + (batch.parent_path() / "errors").string() +
                           "'/\"$SLURM_ARRAY_JOB_ID\"_\"$SLURM_ARRAY_TASK_ID\".json; export ISORUN_ERROR_FILE");
  CHECK(commands[2] ==
        "exec '/opt/isorun' 'sweep' 'it'\\''s.yaml' --node '" + batch.string() + "':\"$SLURM_ARRAY_TASK_ID\"");
  // A sweep over a command given after `--`: --node is isorun's, so it goes before the `--`.
  const std::string over_command = sw::slurm::batch_script(
      batch, {"/opt/isorun", "sweep", "s.yaml", "--", "train", "--node"}, sbatch.dir());
  CHECK_THAT(over_command, Catch::Contains("exec '/opt/isorun' 'sweep' 's.yaml' --node '" + batch.string() +
                                           "':\"$SLURM_ARRAY_TASK_ID\" '--' 'train' '--node'\n"));
  CHECK_THAT(over_command, !Catch::Contains("trap"));
  // Trials that keep checkpoints: Slurm's warning, if it comes before isorun can take it, is
  // ignored rather than end the task (isorun's children get its default back).
  const std::string warned = sw::slurm::batch_script(batch, {"/opt/isorun", "sweep", "s.yaml"}, sbatch.dir(), SIGUSR1);
  CHECK_THAT(warned, Catch::Contains("\ntrap '' " + std::to_string(SIGUSR1) + "\nexec '/opt/isorun'"));
}

TEST_CASE("a Slurm setting that could leave sbatch's options is refused before anything is written",
          "[sweep][slurm-submit][hostile]") {
  using sw::slurm::setting_problem;
  CHECK_THAT(setting_problem("partition", "gpu\necho INJECTED > f"), Catch::Contains("partition holds a newline"));
  CHECK_THAT(setting_problem("time", "1:00\r"), Catch::Contains("control character 13"));
  CHECK_THAT(setting_problem("account", "a b"), Catch::Contains("holds a space"));
  CHECK_THAT(setting_problem("extra", "qos=long"), Catch::Contains("not an sbatch option"));
  CHECK_THAT(setting_problem("extra", "--array=0-99"), Catch::Contains("isorun sets itself"));
  CHECK_THAT(setting_problem("extra", "-o/tmp/x"), Catch::Contains("isorun sets itself"));
  CHECK_THAT(setting_problem("extra", "--wrap=id"), Catch::Contains("isorun sets itself"));
  CHECK(setting_problem("extra", "--qos=long").empty());
  // sbatch takes unambiguous abbreviations of long options (getopt_long): so are they refused.
  for (const char* abbreviated :
       {"--outp=elsewhere/%a.log", "--er=elsewhere/err", "--arr=0-999", "--wra=id", "--parsa"})
    CHECK_THAT(setting_problem("extra", abbreviated), Catch::Contains("(abbreviated), which isorun sets itself"));
  CHECK(setting_problem("extra", "--part=gpu").empty());  // --partition, not --parsable
  CHECK(setting_problem("extra", "--exclusive").empty());
  CHECK(setting_problem("extra", "--comment=several words").empty());
  CHECK(setting_problem("extra", "--output-extra-looking=1").empty());
  // Short options clustered (getopt_long): each letter an option, until one that takes an
  // argument, the rest of the entry (sbatch's -Q and -H take none; -p, -J and -k, optionally, do).
  CHECK_THAT(
      setting_problem("extra", "-Qo/elsewhere/%a.log"),
      Catch::Contains("sets -o (--output, as sbatch reads it: -Q -o /elsewhere/%a.log), which isorun sets itself"));
  CHECK_THAT(setting_problem("extra", "-Ha0-999"),
             Catch::Contains("sets -a (--array, as sbatch reads it: -H -a 0-999)"));
  CHECK_THAT(setting_problem("extra", "-He/elsewhere/err"), Catch::Contains("sets -e (--error"));
  CHECK_THAT(setting_problem("extra", "-QHva"), Catch::Contains("as sbatch reads it: -Q -H -v -a)"));
  CHECK_THAT(setting_problem("extra", "-o/tmp/x"), Catch::Contains("sets -o (--output), which isorun sets itself"));
  CHECK(setting_problem("extra", "-QH").empty());
  CHECK(setting_problem("extra", "-po").empty());     // --partition=o
  CHECK(setting_problem("extra", "-J-o").empty());    // --job-name=-o
  CHECK(setting_problem("extra", "-kQo/x").empty());  // --no-kill=Qo/x
  // Slurm's warning and requeueing are isorun's: checkpoints set them.
  for (const char* own : {"--signal=B:USR1@60", "--sig=USR1", "--requeue", "--no-requeue", "--no-req"})
    CHECK_THAT(setting_problem("extra", own),
               Catch::Contains("which isorun sets itself") && Catch::Contains("checkpoints"));
  CHECK_THAT(setting_problem("extra", "--"), Catch::Contains("not an sbatch option"));
  CHECK(setting_problem("partition", "gpu-a100").empty());

  fake_sbatch sbatch;
  auto refused = [&](const sw::slurm_spec& s, const fs::path& out) {
    try {
      sw::slurm::submit(s, out, {0}, {"/opt/isorun"}, sbatch.dir(), "isorun-x");
    } catch (const isorun::usage_error& e) {
      INFO(e.what());
      CHECK(!sbatch.called());
      CHECK(!fs::exists(out / "slurm" / "batch-1.sh"));
      return std::string(e.what());
    }
    return std::string("submitted");
  };
  // Settings made in C++ (no spec to check them) are checked all the same.
  auto s = settings();
  s.partition = "gpu\necho INJECTED > f";
  CHECK_THAT(refused(s, sbatch.dir() / "o1"), Catch::Contains("Slurm setting partition holds a newline"));
  s = settings();
  s.extra.push_back("--qos=a\n#SBATCH --wrap=id");
  CHECK_THAT(refused(s, sbatch.dir() / "o2"), Catch::Contains("extra holds a newline"));
  // A backslash turns sbatch's filename patterns off; a newline has no place in --output.
  CHECK_THAT(refused(settings(), sbatch.dir() / "back\\slash"), Catch::Contains("backslash"));
  CHECK_THAT(refused(settings(), sbatch.dir() / "new\nline"), Catch::Contains("control character"));
}

TEST_CASE("a spec whose Slurm settings hold a YAML-escaped newline exits 2 naming the line; nothing is submitted",
          "[sweep][slurm-submit][hostile]") {
  fake_sbatch sbatch;
  const fs::path dir = sbatch.dir();
  auto sweep = [&](const std::string& resources) {
    std::ofstream(dir / "spec.yaml") << "task: hello\nparams:\n  name: [a, b]\nresources:\n  backend: slurm\n"
                                     << resources << "out: \"" << (dir / "out").string() << "\"\n";
    return isorun::test::run_captured(ISORUN_CLI, {"sweep", (dir / "spec.yaml").string(), "--no-progress"});
  };
  // The review's example: a spec that looks like pure data.
  auto r = sweep("  partition: \"gpu\\necho INJECTED > " + (dir / "f").string() + "\"\n");
  INFO(r.err);
  CHECK(r.code == 2);
  CHECK_THAT(r.err, Catch::Contains("line 6") && Catch::Contains("partition holds a newline"));
  r = sweep("  extra: [\"--qos=long\", \"--comment=x\\n#SBATCH --wrap=id\"]\n");
  CHECK(r.code == 2);
  CHECK_THAT(r.err, Catch::Contains("line 6") && Catch::Contains("extra holds a newline"));
  r = sweep("  time: \"1:00:00\"\n  account: \"a\\tb\"\n");
  CHECK(r.code == 2);
  CHECK_THAT(r.err, Catch::Contains("line 7") && Catch::Contains("account holds control character 9"));
  CHECK(!sbatch.called());
  CHECK(!fs::exists(dir / "f"));
  CHECK(!fs::exists(dir / "out" / "slurm"));
}

TEST_CASE(
    "a spec whose extra sbatch options hold one of isorun's, clustered, exits 2 naming the line; nothing is "
    "submitted",
    "[sweep][slurm-submit][hostile]") {
  fake_sbatch sbatch;
  const fs::path dir = sbatch.dir();
  // The review's example: short options clustered behind ones that take no argument.
  std::ofstream(dir / "spec.yaml") << "command: [/bin/echo, \"{name}\"]\nparams:\n  name: [a, b]\nresources:\n"
                                   << "  backend: slurm\n"
                                   << "  extra: [\"--qos=long\", \"-Qo" << (dir / "elsewhere").string()
                                   << "/%a.log\", \"-Ha0-999\"]\n"
                                   << "out: \"" << (dir / "out").string() << "\"\n";
  const auto r = isorun::test::run_captured(ISORUN_CLI,
                                            {"sweep", (dir / "spec.yaml").string(), "--no-progress", "--detach"});
  INFO(r.err);
  CHECK(r.code == 2);
  CHECK_THAT(r.err, Catch::Contains("line 6") && Catch::Contains("sets -o (--output, as sbatch reads it: -Q -o "));
  CHECK(!sbatch.called());
  CHECK(!fs::exists(dir / "out" / "slurm"));
}

TEST_CASE(
    "a Slurm sweep takes each record once, and leaves no array to follow, however its records and Slurm's answers interleave",
    "[sweep][slurm-submit]") {
  // Stand-ins for Slurm's commands: sbatch runs every array task of the script, one after the
  // other, before it answers; squeue keeps listing task 0, as Slurm does while an array's tasks
  // are still ending after their trials' records were written.
  fake_sbatch slurm;
  const fs::path bin = slurm.dir();
  std::ofstream(bin / "sbatch")
      << "#!/bin/sh\n"
      << "for last; do :; done\n"
      << "range=$(printf '%s\\n' \"$@\" | sed -n 's/^--array=\\([0-9]*\\)-\\([0-9]*\\).*/\\1 \\2/p')\n"
      << "set -- $range\n"
      << "k=$1\n"
      << "while [ \"$k\" -le \"$2\" ]; do\n"
      << "  SLURM_ARRAY_TASK_ID=$k sh \"$last\" > /dev/null 2>&1 || exit 1\n"
      << "  k=$((k + 1))\n"
      << "done\n"
      << "journal=$(dirname \"$last\")/../results.jsonl\n"
      << "if [ -n \"$ANSWER_LATE\" ]; then  # as an sbatch still answering when records come\n"
      << "  while [ \"$(cat \"$journal\" 2> /dev/null | wc -l)\" -lt 3 ]; do sleep 0.01; done\n"
      << "fi\n"
      << "echo 77\n";
  std::ofstream(bin / "squeue") << "#!/bin/sh\necho 0\n";
  std::ofstream(bin / "scontrol") << "#!/bin/sh\nexit 0\n";
  std::ofstream(bin / "scancel") << "#!/bin/sh\nexit 0\n";
  for (const char* name : {"sbatch", "squeue", "scontrol", "scancel"})
    fs::permissions(bin / name, fs::perms::owner_all);
  const fs::path out = bin / "out";
  std::ofstream(bin / "spec.yaml") << "task: plain_number\nparams:\n  arg0: [1, 2, 3]\n"
                                      "resources: {backend: slurm, cpu_slots: 1}\nout: \""
                                   << out.string() << "\"\n";
  // Records that come after sbatch answered, and records that come while it is still answering
  // (the submitter's poller journals them first): each trial is taken once.
  for (const bool late : {false, true}) {
    INFO("sbatch answers " << (late ? "after the records are journaled" : "at once"));
    fs::remove_all(out);
    auto r = isorun::test::run_captured(
        ISORUN_CLI, {"--tasks", SWEEP_TEST_TASKS, "sweep", (bin / "spec.yaml").string(), "--no-progress"},
        {late ? "ANSWER_LATE=1" : "ANSWER_LATE="});
    INFO(r.err);
    REQUIRE(r.code == 0);
    CHECK_THAT(r.err, Catch::Contains("3 succeeded"));
    std::ifstream journal(out / "results.jsonl");
    std::size_t records = 0;
    for (std::string l; std::getline(journal, l);) records += !l.empty();
    CHECK(records == 3);
    CHECK(json::parse(read_all(out / "slurm" / "jobs.json")) == json::array());  // nothing left to follow
    CHECK(fs::is_empty(out / "slurm" / "results"));
  }
}

namespace {
// Stand-ins for Slurm's commands in `bin`: sbatch runs `before` (a shell snippet, with $out the
// output folder), then every array task of the script, one after the other, and answers; squeue
// lists nothing (every array has ended).
void slurm_running_tasks_after(const fs::path& bin, const std::string& before) {
  std::ofstream(bin / "sbatch")
      << "#!/bin/sh\n"
      << "for last; do :; done\n"
      << "out=$(dirname \"$last\")/..\n"
      << before << "\n"
      << "range=$(printf '%s\\n' \"$@\" | sed -n 's/^--array=\\([0-9]*\\)-\\([0-9]*\\).*/\\1 \\2/p')\n"
      << "set -- $range\n"
      << "k=$1\n"
      << "while [ \"$k\" -le \"$2\" ]; do\n"
      << "  SLURM_ARRAY_TASK_ID=$k sh \"$last\" > /dev/null 2>&1 || exit 1\n"
      << "  k=$((k + 1))\n"
      << "done\n"
      << "echo 77\n";
  std::ofstream(bin / "squeue") << "#!/bin/sh\nexit 0\n";
  std::ofstream(bin / "scontrol") << "#!/bin/sh\nexit 0\n";
  std::ofstream(bin / "scancel") << "#!/bin/sh\nexit 0\n";
  for (const char* name : {"sbatch", "squeue", "scontrol", "scancel"})
    fs::permissions(bin / name, fs::perms::owner_all);
}
}  // namespace

TEST_CASE(
    "Slurm files planted in the folder (a FIFO as a record, a link as a stop file) neither hang the "
    "submitter nor are written through",
    "[sweep][slurm-submit][hostile]") {
  fake_sbatch slurm;
  const fs::path bin = slurm.dir(), out = bin / "out", victim = bin / "victim";
  SECTION("a FIFO among the records is not a record: removed, and the sweep ends") {
    // Planted before any record: the poller's look that takes the last record meets it too.
    slurm_running_tasks_after(bin, "mkdir -p \"$out/slurm/results\"; mkfifo \"$out/slurm/results/planted.json\"");
    std::ofstream(bin / "spec.yaml") << "task: plain_number\nparams:\n  arg0: [1, 2]\n"
                                        "resources: {backend: slurm, cpu_slots: 1}\nout: \""
                                     << out.string() << "\"\n";
    auto r = isorun::test::run_captured(
        ISORUN_CLI, {"--tasks", SWEEP_TEST_TASKS, "sweep", (bin / "spec.yaml").string(), "--no-progress"});
    INFO(r.err);
    CHECK(r.code == 0);
    CHECK_THAT(r.err, Catch::Contains("2 succeeded"));
    CHECK_FALSE(fs::exists(out / "slurm" / "results" / "planted.json"));
  }
  // A sweep whose trials report, and their ids, from the same sweep run here (an id depends on
  // the sweep and the trial only).
  const std::string sweep =
      "command: [sh, -c, 'for i in 1 2 3; do echo \"{\\\"step\\\": $i, \\\"loss\\\": {x}}\"; done']\n"
      "params: {x: [1, 2]}\nmetric: {name: loss, goal: minimize}\n"
      "scheduler: {type: asha, grace_period: 1, max_t: 100, reduction_factor: 2}\n";
  auto trial_ids = [&] {
    std::ofstream(bin / "local.yaml") << sweep << "resources: {cpu_slots: 1}\nout: \"" << (bin / "local").string()
                                      << "\"\n";
    REQUIRE(isorun::test::run_captured(ISORUN_CLI, {"sweep", (bin / "local.yaml").string(), "--no-progress"}).code ==
            0);
    std::vector<std::string> ids;
    std::istringstream journal(read_all(bin / "local" / "results.jsonl"));
    for (std::string line; std::getline(journal, line);) ids.push_back(json::parse(line)["id"].get<std::string>());
    return ids;
  };
  SECTION("a link where the submitter writes a trial's stop file: refused, the file it names untouched") {
    std::ofstream(victim) << "precious\n";
    std::string links = "mkdir -p \"$out/slurm/stop\"";
    for (const auto& id : trial_ids()) links += "; ln -s '" + victim.string() + "' \"$out/slurm/stop/" + id + "\"";
    // Every trial's stop file is a link to the victim before any report exists.
    slurm_running_tasks_after(bin, links);
    std::ofstream(bin / "spec.yaml") << sweep << "resources: {backend: slurm, cpu_slots: 1}\nout: \"" << out.string()
                                     << "\"\n";
    auto r = isorun::test::run_captured(ISORUN_CLI, {"sweep", (bin / "spec.yaml").string(), "--no-progress"});
    INFO(r.err);
    CHECK(read_all(victim) == "precious\n");
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Catch::Contains("is a symbolic link"));
  }
  SECTION("a reports file grown to a sparse line with no newline: skipped, said once, the sweep ends") {
    // 64 MiB of a hole before the nodes' reports, which it makes one line far longer than a report.
    std::string grown = "mkdir -p \"$out/slurm/reports\"";
    const auto ids = trial_ids();
    for (const auto& id : ids) grown += "; truncate -s 64M \"$out/slurm/reports/" + id + ".jsonl\"";
    slurm_running_tasks_after(bin, grown);
    std::ofstream(bin / "spec.yaml") << sweep << "resources: {backend: slurm, cpu_slots: 1}\nout: \"" << out.string()
                                     << "\"\n";
    auto r = isorun::test::run_captured(ISORUN_CLI, {"sweep", (bin / "spec.yaml").string(), "--no-progress"});
    INFO(r.err);
    CHECK(r.code == 0);
    CHECK_THAT(r.err, Catch::Contains("0 failed"));
    for (const auto& id : ids) {
      const std::string warning = "isorun: warning: " + (out / "slurm" / "reports" / (id + ".jsonl")).string() +
                                  " holds a line longer than 1 MiB, which no report is; it is skipped\n";
      const auto first = r.err.find(warning);
      CHECK(first != std::string::npos);
      CHECK(r.err.find(warning, first + 1) == std::string::npos);
    }
  }
}

TEST_CASE(
    "a node's refusal is read from its error record as the folder's files are: a link, a FIFO or words that "
    "are not a usage record hold none",
    "[sweep][slurm-submit][hostile]") {
  fake_sbatch slurm;
  const fs::path dir = slurm.dir(), elsewhere = dir / "elsewhere.json";
  const fs::path record = dir / "errors" / "77_0.json";  // JOB_TASK.json (remote_folder.hpp)
  fs::create_directories(record.parent_path());
  sw::slurm::task_end refused{"FAILED"};
  refused.exit_code = 2;
  std::ofstream(record) << R"({"outcome": "usage", "exit_code": 2, "message": "no GPU 3 here"})"
                        << "\n";
  CHECK(sw::slurm::node_usage_error(refused, record) == std::optional<std::string>("no GPU 3 here"));
  sw::slurm::task_end failed = refused;
  failed.exit_code = 1;
  CHECK_FALSE(sw::slurm::node_usage_error(failed, record));  // Slurm saw another end
  std::ofstream(record, std::ios::trunc) << R"({"outcome": "internal_error", "exit_code": 125, "message": "x"})";
  CHECK_FALSE(sw::slurm::node_usage_error(refused, record));
  std::ofstream(record, std::ios::trunc) << "isorun: error: words, not a record\n";
  CHECK_FALSE(sw::slurm::node_usage_error(refused, record));
  fs::remove(record);
  CHECK_FALSE(sw::slurm::node_usage_error(refused, record));  // exit 2 from something else
  std::ofstream(elsewhere) << R"({"outcome": "usage", "exit_code": 2, "message": "planted"})";
  fs::create_symlink(elsewhere, record);
  CHECK_FALSE(sw::slurm::node_usage_error(refused, record));
  fs::remove(record);
  REQUIRE(::mkfifo(record.c_str(), 0600) == 0);  // no writer: reading it would block for ever
  CHECK_FALSE(sw::slurm::node_usage_error(refused, record));
}
