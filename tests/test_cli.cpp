// The `isorun` command line, run as a real program.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "isorun/runner/process.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using run_result = isorun::test::captured;
using running = isorun::test::started;

running start(const std::vector<std::string>& args, const std::vector<std::string>& env_extra = {}) {
  return isorun::test::start_captured(ISORUN_CLI, args, env_extra);
}

run_result finish(running& r) { return isorun::test::finish_captured(r); }

run_result run(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
  return isorun::test::run_captured(ISORUN_CLI, args, env);
}

std::vector<std::string> with_tasks(std::vector<std::string> args) {
  args.insert(args.begin(), {"--tasks", CLI_TEST_TASKS});
  return args;
}

std::string marker() {
  static int n = 0;
  return (fs::temp_directory_path() / ("isorun-cli-marker-" + std::to_string(::getpid()) + "-" + std::to_string(n++)))
      .string();
}

}  // namespace

TEST_CASE("runs a task from the default task directory and prints its result as JSON", "[cli]") {
  auto r = run({"--cpu", "hello", "name=tester", "repeat=2"});
  REQUIRE(r.code == 0);
  json j = json::parse(r.out);
  CHECK(j["message"] == "hello, tester hello, tester");
  CHECK(j["device"] == "cpu");
  CHECK(r.err.find("hello succeeded on cpu") != std::string::npos);
}

TEST_CASE("key=value arguments are typed by the task's defaults", "[cli]") {
  auto r = run(with_tasks({"-q", "--cpu", "typed", "n=5", "x=2", "flag=true", "s=a b", "v=[3,4,5]"}));
  REQUIRE(r.code == 0);
  json j = json::parse(r.out);
  CHECK(j["n"] == 5);
  CHECK(j["x"] == 2.0);
  CHECK(j["flag"] == true);
  CHECK(j["s"] == "a b");
  CHECK(j["v"] == json::array({3, 4, 5}));
  CHECK(r.err.empty());
}

TEST_CASE("--json prints a full record, for failures too", "[cli]") {
  auto ok = run(with_tasks({"--json", "--cpu", "where", "arg0=0"}));
  REQUIRE(ok.code == 0);
  json j = json::parse(ok.out);
  CHECK(j["outcome"] == "success");
  CHECK(j["result"] == " cap=0");  // CPU: CUDA_VISIBLE_DEVICES is empty
  auto bad = run(with_tasks({"--json", "--cpu", "fail", "arg0=nope"}));
  CHECK(bad.code == 1);
  json b = json::parse(bad.out);
  CHECK(b["outcome"] == "task_error");
  CHECK(b["error_type"] == "std::domain_error");
  CHECK(b["message"] == "nope");
}

TEST_CASE("ISORUN_ERROR_FILE gets a refusal as a record; what isorun runs does not inherit the variable",
          "[cli][error-record]") {
  char dir_template[] = "/tmp/isorun-error-record-XXXXXX";
  REQUIRE(::mkdtemp(dir_template) != nullptr);
  const fs::path dir = dir_template, file = dir / "error.json";
  auto read_file = [](const fs::path& p) {
    std::ifstream in(p);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string var = "ISORUN_ERROR_FILE=" + file.string();
  // Bad input: exit 2, the record in the file as --json prints it.
  auto bad = run({"--cpu", "--mem-limit", "lots", "hello"}, {var});
  CHECK(bad.code == 2);
  REQUIRE(fs::exists(file));
  const json record = json::parse(read_file(file));
  CHECK(record["outcome"] == "usage");
  CHECK(record["exit_code"] == 2);
  CHECK_THAT(record["message"].get<std::string>(), Catch::Contains("lots"));
  CHECK_THAT(bad.err, Catch::Contains("isorun: error: " + record["message"].get<std::string>()));
  // A command run by isorun does not see the variable; a run that succeeds writes no record.
  fs::remove(file);
  auto ok = run({"-q", "--cpu", "--", "/bin/sh", "-c", "echo \"${ISORUN_ERROR_FILE-unset}\""}, {var});
  CHECK(ok.code == 0);
  CHECK(ok.out == "unset\n");
  CHECK_FALSE(fs::exists(file));
  // Never written through a link.
  fs::create_symlink(dir / "victim", file);
  std::ofstream(dir / "victim") << "precious\n";
  CHECK(run({"--cpu", "--mem-limit", "lots", "hello"}, {var}).code == 2);
  CHECK(read_file(dir / "victim") == "precious\n");
  fs::remove_all(dir);
}

TEST_CASE("each outcome class has its exit code", "[cli]") {
  CHECK(run(with_tasks({"--cpu", "fail", "arg0=x"})).code == 1);
  auto oom = run(with_tasks({"--cpu", "oom"}));
  CHECK(oom.code == 3);
  CHECK(oom.err.find("out_of_memory") != std::string::npos);
  auto crash = run(with_tasks({"--cpu", "crash"}));
  CHECK(crash.code == 4);
  CHECK(crash.err.find("SIGSEGV") != std::string::npos);
  auto slow = run(with_tasks({"--cpu", "--timeout", "300ms", "--grace", "100ms", "wait_forever"}));
  CHECK(slow.code == 124);
  CHECK(slow.err.find("timed out after") != std::string::npos);
}

TEST_CASE("--host-mem-limit ends a task past it out of memory (exit 3), and a command, saying so",
          "[cli][host-memory]") {
  // Where no cgroup can enforce it, the flag is refused (exit 2): the bad-input test checks that.
  // Caps with room for a sanitizer build's worker (its shadow memory and quarantine count too).
  auto probe = run(with_tasks({"-q", "--cpu", "--host-mem-limit", "512M", "filled", "arg0=1"}));
  if (probe.code == 2) {
    WARN("skipped: " << probe.err);
    return;
  }
  CHECK(probe.code == 0);
  auto task = run(with_tasks({"--cpu", "--host-mem-limit", "256M", "filled", "arg0=2048"}));
  CHECK(task.code == 3);
  CHECK_THAT(task.err, Catch::Contains("host_mem_limit of 256.00 MiB"));
  // A command exits with its own status (killed: 128 + SIGKILL), and isorun says why.
  auto cmd = run({"--cpu", "--host-mem-limit", "256M", "--", "python3", "-c", "b = bytearray(2048 << 20)"});
  CHECK(cmd.code == 128 + SIGKILL);
  CHECK_THAT(cmd.err, Catch::Contains("host_mem_limit of 256.00 MiB"));
  CHECK(run({"--cpu", "-q", "--host-mem-limit", "512M", "--", "python3", "-c", "b = bytearray(16 << 20)"}).code == 0);
}

TEST_CASE("--gpus: these GPUs or any N, seen by the worker and by -- CMD in PCI bus order", "[cli][multi-gpu]") {
  const std::vector<std::string> four = {"ISORUN_SIMULATE_GPUS=4x16G"};
  const std::string cap = " cap=" + std::to_string(6ULL << 30);
  auto listed = run(with_tasks({"-q", "--gpus", "2,0", "--mem-limit", "6G", "where"}), four);
  REQUIRE(listed.code == 0);
  CHECK(json::parse(listed.out) == "GPU-sim-0,GPU-sim-2" + cap);
  auto any = run(with_tasks({"-q", "--gpus", "any:3", "--mem-limit", "6G", "where"}), four);
  REQUIRE(any.code == 0);
  CHECK(json::parse(any.out) == "GPU-sim-0,GPU-sim-1,GPU-sim-2" + cap);
  auto one = run(with_tasks({"-q", "--gpus", "3", "--mem-limit", "6G", "where"}), four);  // as --gpu 3
  REQUIRE(one.code == 0);
  CHECK(json::parse(one.out) == "GPU-sim-3" + cap);
  auto record = run(with_tasks({"--json", "--gpus", "1,3", "where"}), four);
  REQUIRE(record.code == 0);
  CHECK(json::parse(record.out)["device"] == "GPU-sim-1,GPU-sim-3");
  auto cmd = run({"-q", "--gpus", "3,1", "--mem-limit-mode", "advisory", "--mem-limit", "6G", "--", "sh", "-c",
                  "echo $CUDA_VISIBLE_DEVICES $ISORUN_GPU $ISORUN_MEM_LIMIT"},
                 four);
  REQUIRE(cmd.code == 0);
  CHECK(cmd.out == "GPU-sim-1,GPU-sim-3 1,3 " + std::to_string(6ULL << 30) + "\n");
}

TEST_CASE("--gpus refuses what cannot be given: exit 2, nothing started", "[cli][multi-gpu]") {
  const std::vector<std::string> four = {"ISORUN_SIMULATE_GPUS=4x16G"};
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {{"--gpus", "any:5", "where"}, "5 GPUs asked for, but there are 4"},
      {{"--gpus", "1,1", "where"}, "GPU 1 is listed twice"},
      {{"--gpus", "0,4", "where"}, "GPU 4 does not exist"},
      {{"--gpus", "0,1", "--mem-limit", "20G", "where"}, "exceeds GPU 0's 16.00 GiB"},
      {{"--gpus", "0", "--gpu", "0", "where"}, "--gpu and --gpus exclude each other"},
      {{"--gpus", "0", "--cpu", "where"}, "--gpus and --cpu exclude each other"},
      {{"--gpus", "0,x", "where"}, "expected GPU indices such as 0,1"},
      {{"--gpus", "any:0", "where"}, "any:N needs a count of 1 or more"},
      {{"--gpus", "0,4", "--", "true"}, "GPU 4 does not exist"},
  };
  for (const auto& [args, said] : bad) {
    auto a = with_tasks(args);
    if (a.back() == "where") a.push_back("arg0=0");
    auto r = run(a, four);
    INFO(r.err);
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Catch::Contains(said));
  }
}

TEST_CASE("a GPU assignment reaches the worker (simulated inventory)", "[cli]") {
  auto r = run(with_tasks({"-q", "--gpu", "1", "--mem-limit", "6G", "where"}), {"ISORUN_SIMULATE_GPUS=2x16G"});
  REQUIRE(r.code == 0);
  CHECK(json::parse(r.out) == "GPU-sim-1 cap=" + std::to_string(6ULL << 30));
  auto g = run({"gpus"}, {"ISORUN_SIMULATE_GPUS=2x16G"});
  CHECK(g.code == 0);
  CHECK(g.out.find("simulated") != std::string::npos);
  CHECK(g.out.find("GPU-sim-1") != std::string::npos);
}

TEST_CASE("isorun gpus says how workers are contained; a supervisor killed -9 leaves nothing the next one keeps",
          "[cli][containment]") {
  auto pinned = run({"gpus", "--json"}, {"ISORUN_CONTAINMENT=process-group"});
  REQUIRE(pinned.code == 0);
  const json f = json::parse(pinned.out)["containment"];
  CHECK(f["mode"] == "process_group");
  CHECK(f["reason"] == "ISORUN_CONTAINMENT=process-group");
  const std::vector<std::string> chosen = {};  // the default: a cgroup per worker where one can be made
  auto detected = run({"gpus", "--json"}, chosen);
  REQUIRE(detected.code == 0);
  const json c = json::parse(detected.out)["containment"];
  if (c["mode"] != "cgroup") {
    CHECK(c["mode"] == "process_group");
    CHECK_FALSE(c["reason"].get<std::string>().empty());
    WARN("cgroup half skipped: " << c["reason"].get<std::string>());
    return;
  }
  // The directory was that run's own, removed at its exit.
  const std::string where = c["where"];
  CHECK_FALSE(std::filesystem::exists(where));
  // A supervisor killed -9 while its command runs leaves its directory behind...
  auto victim = start({"--cpu", "--", "sh", "-c", "echo started; exec sleep 1000"}, chosen);
  char buf[16];
  REQUIRE(::read(victim.out, buf, sizeof buf) > 0);  // the command runs, in its cgroup
  const std::string left = std::filesystem::path(where).parent_path() /
                           ("isorun-" + std::to_string(victim.process.pid()));
  CHECK(std::filesystem::exists(left));
  ::kill(victim.process.pid(), SIGKILL);
  finish(victim);
  // ...which the next isorun removes, killing what was still in it.
  CHECK(run({"gpus"}, chosen).code == 0);
  CHECK_FALSE(std::filesystem::exists(left));
}

TEST_CASE("bad input: clear message, exit 2, no worker started", "[cli]") {
  struct bad_case {
    std::vector<std::string> args;
    std::vector<std::string> env;
    const char* says;
  };
  const std::string m = marker();
  const std::string touch = "arg0=" + m;
  const bad_case cases[] = {
      {{"--cpu", "no_such_task"}, {}, "unknown task 'no_such_task'"},
      {{"--cpu", "touch", touch},
       {"ISORUN_CONTAINMENT=cgroups"},
       "ISORUN_CONTAINMENT=cgroups: expected cgroup (the default) or process-group"},
      {{"--cpu", "--mem-limit", "2X", "touch", touch}, {}, "invalid size '2X'"},
      {{"--cpu", "--timeout", "soon", "touch", touch}, {}, "invalid duration 'soon'"},
      {{"--cpu", "touch", "justaword"}, {}, "is not key=value"},
      {{"--cpu", "touch", touch, "colour=red"}, {}, "has no parameter 'colour'"},
      {{"--cpu", "typed", "n=many"}, {}, "expected an integer"},
      {{"--cpu", "typed", "v=[1,"}, {}, "expected valid JSON"},
      {{"--cpu", "--frobnicate", "touch", touch}, {}, "unknown option '--frobnicate'"},
      {{"--gpu", "0", "touch", touch},
       {},
       "run on the CPU instead (--cpu; cpu=True in Python), or set ISORUN_SIMULATE_GPUS"},
      {{"--gpu", "7", "touch", touch}, {"ISORUN_SIMULATE_GPUS=2x16G"}, "GPU 7 does not exist"},
      {{"--gpu", "0", "--mem-limit", "20G", "touch", touch}, {"ISORUN_SIMULATE_GPUS=2x16G"}, "exceeds GPU 0"},
      {{"touch", touch}, {"ISORUN_SIMULATE_GPUS=lots"}, "ISORUN_SIMULATE_GPUS"},
      {{"--cpu", "--gpu", "0", "touch", touch}, {}, "exclude each other"},
      {{"--cpu", "--", "no-such-command-isorun"}, {}, "command not found"},
      // found by fuzz_words: bytes that are not UTF-8 cannot become JSON arguments
      {{"--cpu", "touch",
        "arg0=\xb3"
        "a"},
       {},
       "argument 1 of the task is not valid UTF-8 text"},
      {{"--cpu", "--mem-limit", "2G", "--mem-limit-mode", "loose", "--", "true"}, {}, "expected enforced or advisory"},
      {{"--cpu", "--host-mem-limit", "lots", "touch", touch}, {}, "invalid size 'lots'"},
      {{"--cpu", "--host-mem-limit", "1M", "touch", touch}, {}, "below the smallest"},
      {{"--cpu", "--host-mem-limit", "1G", "touch", touch},
       {"ISORUN_CONTAINMENT=process-group"},
       "host-mem-limit cannot be enforced here"},
      {{"--cpu", "--host-mem-limit", "1G", "--", "true"},
       {"ISORUN_CONTAINMENT=process-group"},
       "host-mem-limit cannot be enforced here"},
      // A cap on the GPU memory of a command that has no GPU caps nothing (as in Python).
      {{"--cpu", "--mem-limit", "1G", "--", "true"}, {}, "cap its host memory with --host-mem-limit SIZE"},
      {{"--mem-limit", "1G", "--", "true"}, {}, "(this machine has none)"},
  };
  for (const auto& c : cases) {
    INFO(c.args[0] << " " << c.args[1] << " ... expects: " << c.says);
    auto r = run(with_tasks(c.args), c.env);
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Catch::Contains(c.says));
    CHECK(r.out.empty());
    CHECK_FALSE(fs::exists(m));
  }
  auto lib = run({"--tasks", "/etc/hostname", "--cpu", "touch", touch});
  CHECK(lib.code == 2);
  CHECK_THAT(lib.err, Catch::Contains("cannot load task library"));
  auto missing = run({"--tasks", "/nonexistent.so", "tasks"});
  CHECK(missing.code == 2);
  CHECK_THAT(missing.err, Catch::Contains("no such file"));
  CHECK_FALSE(fs::exists(m));
  // The same command line without the mistake does run.
  REQUIRE(run(with_tasks({"-q", "--cpu", "touch", touch})).code == 0);
  CHECK(fs::exists(m));
  fs::remove(m);
}

TEST_CASE("`isorun tasks` lists tasks with their signature and parameters", "[cli]") {
  auto r = run(with_tasks({"tasks"}));
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("typed(typed_args) -> typed_args"));
  CHECK_THAT(r.out, Catch::Contains("n=1"));
  CHECK_THAT(r.out, Catch::Contains("hello(greeting_args) -> greeting"));
  auto j = run(with_tasks({"tasks", "--json"}));
  REQUIRE(j.code == 0);
  bool found = false;
  for (const auto& t : json::parse(j.out))
    if (t["name"] == "typed") {
      found = true;
      CHECK(t["parameters"]["x"] == 0.5);
    }
  CHECK(found);
}

TEST_CASE("-- CMD mirrors the command's status and exports the assignment", "[cli]") {
  CHECK(run({"--cpu", "--", "sh", "-c", "exit 7"}).code == 7);
  CHECK(run({"-q", "--cpu", "--", "sh", "-c", "kill -TERM $$"}).code == 128 + SIGTERM);
  auto env = run({"--gpu", "1", "--mem-limit", "1G", "--", "sh", "-c",
                  "echo $CUDA_VISIBLE_DEVICES $CUDA_DEVICE_ORDER $ISORUN_MEM_LIMIT"},
                 {"ISORUN_SIMULATE_GPUS=2x16G"});
  CHECK(env.code == 0);
  CHECK(env.out == "GPU-sim-1 PCI_BUS_ID 1073741824\n");
  CHECK(env.err.empty());  // the cap is enforced (see [cap]): nothing to warn about
}

TEST_CASE("isorun runs -- CMD itself, without libisorun.so, and hands the rest to isorun-cli", "[cli][front-end]") {
  // The command's parent is the shim; the shim's parent is the isorun that supervises the command.
  const auto r = run({"-q", "--cpu", "--", "sh", "-c",
                      "p=$(cut -d' ' -f4 /proc/$PPID/stat); readlink /proc/$p/exe; cat /proc/$p/maps"});
  REQUIRE(r.code == 0);
  CHECK(r.out.substr(0, r.out.find('\n')) == fs::canonical(ISORUN_CLI).string());
  CHECK(r.out.find("libisorun.so") == std::string::npos);
  CHECK(r.out.find("isorun-cli") == std::string::npos);

  // Started by the dynamic loader run by hand, where /proc/self/exe is the loader: the same.
  std::string loader;
  {
    std::ifstream maps("/proc/self/maps");
    for (std::string line; std::getline(maps, line) && loader.empty();)
      if (const auto at = line.find("/ld-linux"); at != std::string::npos) loader = line.substr(line.find('/'));
  }
  REQUIRE_FALSE(loader.empty());
  const auto by_loader = isorun::test::run_captured(loader, {ISORUN_CLI, "-q", "--cpu", "--", "echo", "by hand"});
  CHECK(by_loader.code == 0);
  CHECK(by_loader.out == "by hand\n");
  const auto task_by_loader = isorun::test::run_captured(loader, {ISORUN_CLI, "-q", "--cpu", "hello", "name=loader"});
  CHECK(task_by_loader.code == 0);
  CHECK(task_by_loader.out.find("hello, loader") != std::string::npos);

  // Copied without its library folder, it says what is missing, for a task and a command alike.
  const fs::path alone = fs::temp_directory_path() / ("isorun-front-end-" + std::to_string(::getpid()));
  fs::create_directories(alone / "bin");
  fs::copy_file(ISORUN_CLI, alone / "bin" / "isorun");
  const std::string copy = (alone / "bin" / "isorun").string();
  const auto task = isorun::test::run_captured(copy, {"--cpu", "hello"});
  CHECK(task.code == 125);
  CHECK(task.err.find("isorun-cli is missing") != std::string::npos);
  const auto command = isorun::test::run_captured(copy, {"--cpu", "--", "true"});
  CHECK(command.code == 125);
  CHECK(command.err.find("isorun-command-shim is missing") != std::string::npos);
  fs::remove_all(alone);

  // Installed in a folder whose name holds a space and started by the loader by hand: the path
  // /proc/self/maps gives is read whole (cut at the space, it named another folder).
  const fs::path spaced = fs::temp_directory_path() / ("isorun-spaced-" + std::to_string(::getpid())) / "my tools";
  fs::create_directories(spaced / "bin");
  fs::create_directories(spaced / "lib");
  fs::copy_file(ISORUN_CLI, spaced / "bin" / "isorun");
  const fs::path lib = fs::path(ISORUN_CLI).parent_path().parent_path() / "lib";
  for (const char* program : {"isorun-cli", "isorun-command-shim"})
    fs::create_symlink(lib / program, spaced / "lib" / program);
  const auto spaced_run = isorun::test::run_captured(
      loader, {(spaced / "bin" / "isorun").string(), "-q", "--cpu", "--", "echo", "spaced"});
  INFO(spaced_run.err);
  CHECK(spaced_run.code == 0);
  CHECK(spaced_run.out == "spaced\n");
  fs::remove_all(spaced.parent_path());
}

TEST_CASE("-- CMD timeout stops the command and its children", "[cli]") {
  auto r = run(
      {"--cpu", "--timeout", "2s", "--grace", "100ms", "--", "sh", "-c", "trap '' TERM; sleep 1000 & echo $!; wait"});
  CHECK(r.code == 124);
  const pid_t grandchild = std::stoi(r.out);
  CHECK(isorun::test::process_gone(grandchild));
}

TEST_CASE("killing the CLI with SIGKILL takes the worker down; SIGINT cancels it", "[cli]") {
  for (int sig : {SIGKILL, SIGINT}) {
    INFO("signal " << sig);
    auto r = start(with_tasks({"--cpu", "--grace", "100ms", "wait_forever"}));
    std::string err;
    char buf[256];
    while (err.find('\n') == std::string::npos) {
      ssize_t n = ::read(r.err, buf, sizeof buf);
      REQUIRE(n > 0);
      err.append(buf, static_cast<std::size_t>(n));
    }
    const pid_t worker = std::stoi(err.substr(err.find("worker-pid ") + 11));
    ::kill(r.process.pid(), sig);
    auto done = finish(r);
    CHECK(isorun::test::process_gone(worker));
    if (sig == SIGINT) CHECK(done.code == 130);
    else CHECK(done.code == 128 + SIGKILL);
  }
}

TEST_CASE("killing the CLI with SIGKILL also takes down a -- CMD and its children", "[cli]") {
  auto r = start({"--cpu", "--", "sh", "-c", "sleep 1000 & echo $!; wait"});
  std::string out;
  char buf[64];
  while (out.find('\n') == std::string::npos) {
    ssize_t n = ::read(r.out, buf, sizeof buf);
    REQUIRE(n > 0);
    out.append(buf, static_cast<std::size_t>(n));
  }
  const pid_t grandchild = std::stoi(out);
  ::kill(r.process.pid(), SIGKILL);
  finish(r);
  CHECK(isorun::test::process_gone(grandchild));
}

TEST_CASE("a full /dev/shm does not matter: results pass through anonymous memory files", "[cli][faults]") {
  // A 4 KiB tmpfs over /dev/shm, in a mount namespace of the test's own (needs the privilege to
  // make one; without it, say so and check nothing).
  if (isorun::test::run_captured("/usr/bin/unshare", {"-m", "true"}).code != 0) {
    WARN("cannot make a mount namespace here (unshare -m): the full /dev/shm check needs one");
    return;
  }
  const std::string script =
      "mount -t tmpfs -o size=4k tmpfs /dev/shm && head -c 8k /dev/zero > /dev/shm/filler; "
      "df -k /dev/shm | tail -1 | awk '{print \"free=\" $4}' >&2; exec \"$0\" \"$@\"";
  auto r = isorun::test::run_captured("/usr/bin/unshare", {"-m", "sh", "-c", script, ISORUN_CLI, "--tasks",
                                                           CLI_TEST_TASKS, "-q", "--cpu", "filled", "arg0=8"});
  INFO(r.err);
  CHECK_THAT(r.err, Catch::Contains("free=0"));  // it is full
  REQUIRE(r.code == 0);
  CHECK(r.out.size() == (8u << 20) + 3);  // the string, its quotes and a newline
}

TEST_CASE("--mem-limit is enforced by the worker's allocator; OOM exits 3 with the numbers", "[cli][alloc]") {
  auto ok = run(with_tasks({"-q", "--json", "--cpu", "--mem-limit", "64M", "hog", "arg0=40"}));
  REQUIRE(ok.code == 0);
  json j = json::parse(ok.out);
  CHECK(j["result"] == "held 40 MiB under a cap of 64 MiB");
  CHECK(j["peak_reserved"] == 40 << 20);
  auto oom = run(with_tasks({"--cpu", "--mem-limit", "64M", "hog", "arg0=100"}));
  CHECK(oom.code == 3);
  CHECK_THAT(oom.err, Catch::Contains("tried to allocate 8.00 MiB") && Catch::Contains("cap 64.00 MiB") &&
                          Catch::Contains("--mem-limit 64 MiB"));
  auto conf = run(with_tasks({"--cpu", "--alloc-conf", "strategy:greedy", "hog", "arg0=1"}));
  CHECK(conf.code == 2);
  CHECK_THAT(conf.err, Catch::Contains("--alloc-conf") && Catch::Contains("expected auto_growth"));
  auto env = run(with_tasks({"--cpu", "hog", "arg0=1"}), {"ISORUN_ALLOC_CONF=colour:red"});
  CHECK(env.code == 2);
  CHECK_THAT(env.err, Catch::Contains("ISORUN_ALLOC_CONF") && Catch::Contains("unknown key 'colour'"));
  auto expandable = run(
      with_tasks({"-q", "--cpu", "--mem-limit", "64M", "--alloc-conf", "strategy:expandable", "hog", "arg0=56"}));
  CHECK(expandable.code == 0);
}

TEST_CASE("a simulated GPU's memory is device memory: host code that touches it crashes the worker",
          "[cli][simulated]") {
  const std::vector<std::string> sim = {"ISORUN_SIMULATE_GPUS=1x4G"};
  auto on_gpu = run(with_tasks({"--gpu", "0", "--mem-limit", "1G", "touch_device"}), sim);
  CHECK(on_gpu.code == 4);
  CHECK_THAT(on_gpu.err, Catch::Contains("SIGSEGV"));
  // On a CPU worker the allocator hands out host memory, so the same code runs.
  CHECK(run(with_tasks({"-q", "--cpu", "--mem-limit", "1G", "touch_device"})).code == 0);
  auto info = run(with_tasks({"-q", "--gpu", "0", "--mem-limit", "1G", "device_info"}), sim);
  REQUIRE(info.code == 0);
  json j = json::parse(info.out);
  CHECK(j["kind"] == "simulated");
  CHECK(j["cap"] == 1ULL << 30);
}

TEST_CASE("the examples' tasks run on a simulated GPU", "[cli][simulated]") {
  const std::vector<std::string> sim = {"ISORUN_SIMULATE_GPUS=2x4G"};
  auto hello = run({"-q", "--gpu", "1", "hello"}, sim);
  REQUIRE(hello.code == 0);
  CHECK(json::parse(hello.out)["device"] == "GPU-sim-1");
  CHECK(run({"-q", "--gpu", "0", "sum_squares", "arg0=10"}, sim).code == 0);
  for (const char* model : {"mlp", "softmax"}) {
    INFO(model);
    auto digits = run({"-q", "--json", "--gpu", "0", "--mem-limit", "1G", "digits", std::string("model=") + model},
                      sim);
    REQUIRE(digits.code == 0);
    json j = json::parse(digits.out);
    CHECK(j["result"]["device"] == "simulated:GPU-sim-0");
    CHECK(j["result"]["accuracy"].get<double>() >= 0.95);
    CHECK(j["peak_allocated"].get<std::uint64_t>() > 0);  // the parameters live on the device
  }
}

TEST_CASE("a GPU without a usable driver: a clear error, not a crash", "[cli]") {
  // The stand-in NVML reports a GPU that has no driver behind it.
  const char* inherited = std::getenv("LD_LIBRARY_PATH");  // the build's own dependencies may need it
  auto r = run(with_tasks({"--gpu", "0", "--mem-limit", "1G", "hog", "arg0=8"}),
               {isorun::test::real_gpus, std::string("LD_LIBRARY_PATH=" FAKE_NVML_DIR) +
                                             (inherited && *inherited ? std::string(":") + inherited : "")});
  CHECK(r.code == 1);
  CHECK_THAT(r.err, Catch::Contains("cannot use GPU GPU-5a7e1d2c") || Catch::Contains("cannot load the CUDA backend"));
  CHECK_THAT(r.err, !Catch::Contains("SIGSEGV"));
}

TEST_CASE("--gpu N looks its GPU up in the inventory cache, which a changed driver or GPU makes stale",
          "[cli][gpu-cache]") {
  // A made-up /proc/driver/nvidia for the stand-in NVML's one GPU, a cache folder of its own, and
  // a log of NVML's initialisations.
  const fs::path dir = fs::temp_directory_path() / ("isorun-gpu-cache-" + std::to_string(::getpid()));
  fs::create_directories(dir / "proc/gpus/0000:00:06.0");
  std::ofstream(dir / "proc/version") << "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04\n";
  auto information = [&](const std::string& uuid) {
    std::ofstream(dir / "proc/gpus/0000:00:06.0/information")
        << "Model: \t\t NVIDIA H100 80GB HBM3\nGPU UUID: \t " << uuid << "\nBus Location: \t 0000:00:06.0\n";
  };
  const std::string uuid = "GPU-5a7e1d2c-0000-4000-8000-00000000fa4e";  // the stand-in's
  information(uuid);
  const char* inherited = std::getenv("LD_LIBRARY_PATH");
  const std::vector<std::string> env = {
      isorun::test::real_gpus,
      std::string("LD_LIBRARY_PATH=" FAKE_NVML_DIR) + (inherited && *inherited ? std::string(":") + inherited : ""),
      "ISORUN_NVIDIA_PROC=" + (dir / "proc").string(), "XDG_CACHE_HOME=" + (dir / "cache").string(),
      "FAKE_NVML_LOG=" + (dir / "nvml.log").string()};
  auto inits = [&] {
    std::ifstream log(dir / "nvml.log");
    return static_cast<int>(std::count(std::istreambuf_iterator<char>(log), {}, '\n'));
  };
  auto hello = [&] {
    auto r = run({"-q", "--gpu", "0", "--mem-limit", "1G", "hello"}, env);
    REQUIRE(r.code == 0);
    return json::parse(r.out)["device"].get<std::string>();
  };
  CHECK(hello() == uuid);  // NVML asked, the cache written
  CHECK(inits() == 1);
  CHECK(fs::exists(dir / "cache/isorun/gpus"));
  CHECK(hello() == uuid);  // from the cache: NVML not started at all
  CHECK(inits() == 1);
  // A cap above the GPU's memory is still refused from the cache.
  auto big = run({"--gpu", "0", "--mem-limit", "100G", "hello"}, env);
  CHECK(big.code == 2);
  CHECK_THAT(big.err, Catch::Contains("exceeds GPU 0's 80"));
  CHECK(inits() == 1);
  // Another driver version: stale, asked again.
  std::ofstream(dir / "proc/version") << "NVRM version: NVIDIA UNIX x86_64 Kernel Module  590.1\n";
  CHECK(hello() == uuid);
  CHECK(inits() == 2);
  CHECK(hello() == uuid);
  CHECK(inits() == 2);
  // A cached UUID the driver no longer names (another GPU in that slot), or a damaged file: not used.
  information("GPU-00000000-1111-2222-3333-444444444444");
  CHECK(hello() == uuid);  // what NVML (the stand-in) says, not the cache
  CHECK(inits() == 3);
  information(uuid);
  std::ofstream(dir / "cache/isorun/gpus") << "isorun gpu cache 1 99999\ngarbage";
  CHECK(hello() == uuid);
  CHECK(inits() == 4);
  // Without the driver's /proc folder there is no cache: NVML every time.
  const auto no_proc = [&] {
    auto e = env;
    e[2] = "ISORUN_NVIDIA_PROC=" + (dir / "absent").string();
    return e;
  }();
  REQUIRE(run({"-q", "--gpu", "0", "hello"}, no_proc).code == 0);
  REQUIRE(run({"-q", "--gpu", "0", "hello"}, no_proc).code == 0);
  CHECK(inits() == 6);
  fs::remove_all(dir);
}

TEST_CASE("every documented exit code, and the messages that go with the rough edges", "[cli][exit]") {
  CHECK(run({"-q", "--cpu", "hello"}).code == 0);
  auto bare = run({});
  CHECK(bare.code == 2);
  CHECK(bare.out.empty());
  CHECK_THAT(bare.err, Catch::Contains("usage: isorun"));
  auto help = run({"--help"});
  CHECK(help.code == 0);
  CHECK_THAT(help.out, Catch::Contains("usage: isorun"));
  // --json reports usage errors as a record too.
  auto usage = run({"--json", "--cpu", "helo"});
  CHECK(usage.code == 2);
  json u = json::parse(usage.out);
  CHECK(u["outcome"] == "usage");
  CHECK(u["exit_code"] == 2);
  CHECK_THAT(u["message"].get<std::string>(), Catch::Contains("unknown task 'helo' (did you mean 'hello'?)"));
  CHECK_THAT(run({"--mem-limt", "2G", "hello"}).err, Catch::Contains("(did you mean '--mem-limit'?)"));
  // Known before anything starts, so usage errors: a cap the allocator cannot use, a duration
  // without its unit, a value out of range for the task's field.
  auto tiny = run({"--cpu", "--mem-limit", "1M", "digits"});
  CHECK(tiny.code == 2);
  CHECK_THAT(tiny.err, Catch::Contains("cannot hold a single 2 MiB segment"));
  auto unitless = run({"--cpu", "--timeout", "10", "hello"});
  CHECK(unitless.code == 2);
  CHECK_THAT(unitless.err, Catch::Contains("has no unit: write 10s, 10ms or 10m"));
  auto big = run(with_tasks({"--cpu", "typed", "n=3000000000"}));
  CHECK(big.code == 2);
  CHECK_THAT(big.err, Catch::Contains("parameter n=3000000000: out of range for the task's type (a 32-bit integer)"));
  CHECK_THAT(run(with_tasks({"--cpu", "typed", "n=99999999999999999999999"})).err, Catch::Contains("out of range"));
  // An oversized result is an invalid result (5), not the task's error.
  auto oversized = run({"--cpu", "--max-result", "10", "hello"});
  CHECK(oversized.code == 5);
  CHECK_THAT(oversized.err,
             Catch::Contains("invalid_result") && Catch::Contains("exceeds the limit of 10 bytes (--max-result)"));
  // isorun itself failing (here: no descriptors left for the worker's channels) is 125.
  auto internal = isorun::test::run_captured("/bin/sh", {"-c", "ulimit -n 8; exec \"$0\" --cpu hello", ISORUN_CLI});
  CHECK(internal.code == 125);
  CHECK_THAT(internal.err, Catch::Contains("internal error"));
  // 1, 3, 4 and 124: "each outcome class has its exit code"; 130: the Ctrl-C test below.
}

TEST_CASE("Ctrl-C on a task says at once what happens", "[cli][signals]") {
  auto r = start(with_tasks({"--cpu", "--grace", "30s", "stubborn"}));
  std::string err;
  char buf[256];
  while (err.find("worker-pid") == std::string::npos) {
    ssize_t n = ::read(r.err, buf, sizeof buf);
    REQUIRE(n > 0);
    err.append(buf, static_cast<std::size_t>(n));
  }
  ::kill(r.process.pid(), SIGINT);
  while (err.find("Ctrl-C again") == std::string::npos) {
    ssize_t n = ::read(r.err, buf, sizeof buf);
    REQUIRE(n > 0);
    err.append(buf, static_cast<std::size_t>(n));
  }
  CHECK_THAT(err, Catch::Contains("isorun: stopping stubborn (SIGTERM, then SIGKILL after 30.00 s)"));
  ::kill(r.process.pid(), SIGINT);  // the task ignores SIGTERM: only this second Ctrl-C ends it
  auto done = finish(r);
  CHECK(done.code == 130);
  CHECK_THAT(done.err, Catch::Contains("isorun: killing stubborn now"));
}

namespace {
// `isorun [flags] -- cap_probe STEPS...` against the stand-in libcuda.so.1, on a simulated GPU.
isorun::test::captured probe(std::vector<std::string> flags, const std::vector<std::string>& steps) {
  flags.insert(flags.begin(), {"--gpu", "0"});
  flags.push_back("--");
  flags.push_back(CAP_PROBE);
  flags.insert(flags.end(), steps.begin(), steps.end());
  return isorun::test::run_captured(ISORUN_CLI, flags,
                                    {"ISORUN_SIMULATE_GPUS=1x16G", std::string("LD_LIBRARY_PATH=") + FAKE_CUDA_DIR});
}
}  // namespace

TEST_CASE("-- CMD under --mem-limit: the driver API is capped, through dlsym and cuGetProcAddress alike",
          "[cli][cap]") {
  // Without a cap the stand-in driver's 16 GiB are all there.
  auto free_run = probe({}, {"info"});
  REQUIRE(free_run.code == 0);
  CHECK(free_run.out == "info 16384 16384\n");

  auto r = probe({"--mem-limit", "256M"}, {"info", "fill", "16", "direct", "info", "free", "info", "fill", "32", "proc",
                                           "free", "create", "200", "create", "100"});
  REQUIRE(r.code == 0);
  CHECK(r.out ==
        "info 256 256\n"      // cuMemGetInfo reports the cap as the total
        "filled 16 code 2\n"  // 16 x 16 MiB, then CUDA_ERROR_OUT_OF_MEMORY
        "info 0 256\n"
        "freed\n"
        "info 256 256\n"     // freeing gives the headroom back
        "filled 8 code 2\n"  // the same cap through a cuGetProcAddress pointer
        "freed\n"
        "create 0\n"  // cuMemCreate (PyTorch's expandable segments) counts too
        "create 2\n");
  // The supervisor says, after the command, that it hit its cap, with the numbers.
  CHECK_THAT(r.err, Catch::Contains("the command reached its --mem-limit of 256.00 MiB: 3 allocations refused "
                                    "(the largest 100.00 MiB)"));
}

TEST_CASE("-- CMD on several GPUs: the cap holds on each device on its own", "[cli][cap][multi-gpu]") {
  auto r = isorun::test::run_captured(
      ISORUN_CLI,
      {"--gpus",    "0,1", "--mem-limit", "256M", "--",   CAP_PROBE,   "fill", "64",        "direct", "info",
       "device",    "1",   "info",        "fill", "64",   "direct",    "info", "create-on", "0",      "64",
       "create-on", "1",   "64",          "free", "info", "create-on", "1",    "64"},
      {"ISORUN_SIMULATE_GPUS=2x16G", std::string("LD_LIBRARY_PATH=") + FAKE_CUDA_DIR});
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out ==
        "filled 4 code 2\n"  // device 0 (current first): 4 x 64 MiB, then refused
        "info 0 256\n"
        "device 1 0\n"
        "info 256 256\n"  // device 1 has its own 256 MiB
        "filled 4 code 2\n"
        "info 0 256\n"
        "create-on 2\n"  // cuMemCreate is charged to the device its properties name
        "create-on 2\n"
        "freed\n"
        "info 256 256\n"
        "create-on 0\n");
  CHECK_THAT(r.err, Catch::Contains("the command reached its --mem-limit of 256.00 MiB per GPU: 4 allocations refused "
                                    "(2 on device 0, 2 on device 1)"));
}

TEST_CASE("-- CMD under --mem-limit: processes share one cap, and a killed one's share comes back", "[cli][cap]") {
  // Another process of the command holds 64 MiB: this one gets the rest.
  auto pair = probe({"--mem-limit", "256M"}, {"pair", "64"});
  REQUIRE(pair.code == 0);
  CHECK(pair.out == "pair 3\n");
  // Killed while holding 64 MiB: its share is taken back when it is needed.
  auto crash = probe({"--mem-limit", "256M"}, {"crash", "64"});
  REQUIRE(crash.code == 0);
  CHECK(crash.out == "crash 4\n");
  // A process that execs leaves its old image's memory behind with the image, and its share too.
  auto exec = probe({"--mem-limit", "256M"}, {"exec", "100", "info"});
  REQUIRE(exec.code == 0);
  CHECK(exec.out == "exec\ninfo 256 256\n");
  // advisory: nothing enforced, as before
  auto advisory = probe({"--mem-limit", "256M", "--mem-limit-mode", "advisory"}, {"info"});
  CHECK(advisory.out == "info 16384 16384\n");
  CHECK_THAT(advisory.err, Catch::Contains("advisory"));
  CHECK(probe({"--mem-limit", "256M", "--mem-limit-mode", "loose"}, {"info"}).code == 2);
}

TEST_CASE("a command's memory timeline draws what the command's processes held, and who held what at a refusal",
          "[cli][cap]") {
  const fs::path dir = fs::temp_directory_path() / ("isorun-cli-timeline-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string page = (dir / "memory.html").string();
  // Another process of the command takes 96 MiB blocks until refused (two) and keeps one; this
  // one fills 64 MiB blocks: two fit, the third is refused (the last refusal) with 128 MiB held
  // here and 96 MiB there.
  auto r = probe({"-q", "--mem-limit", "256M", "--memory-timeline", page},
                 {"holders", "1", "96", "fill", "64", "direct"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out == "holders 1\nfilled 2 code 2\n");
  std::ifstream in(page);
  const std::string html((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK_THAT(html, Catch::Contains("<polyline class=\"reserved\"") && Catch::Contains("cap 256.00 MiB"));
  CHECK_THAT(html, !Catch::Contains("<polyline class=\"allocated\""));  // no allocator's count: what was held
  // there: held, held, refused, one given back; here: held, held, refused; what each still held
  // when it ended, given back with it: two
  CHECK_THAT(html, Catch::Contains(" 9 events"));
  const auto table = html.substr(html.find("by process, largest first"));
  CHECK_THAT(table, Catch::Contains("<td>128.00 MiB</td>") && Catch::Contains("<td>96.00 MiB</td>"));
  CHECK(table.find("128.00 MiB") < table.find("96.00 MiB"));
  CHECK(fs::directory_iterator(dir) != fs::directory_iterator());  // the page, and nothing else
  CHECK(std::distance(fs::directory_iterator(dir), fs::directory_iterator()) == 1);

  // What it needs, said before anything starts (exit 2): an enforced cap on a GPU, and a folder
  // it can write to.
  auto no_cap = run({"--gpu", "0", "--memory-timeline", page, "--", "/bin/true"});
  CHECK(no_cap.code == 2);
  CHECK_THAT(no_cap.err, Catch::Contains("--memory-timeline with -- CMD draws what the cap sees"));
  auto no_gpu = run({"--cpu", "--mem-limit", "1G", "--memory-timeline", page, "--", "/bin/true"});
  CHECK(no_gpu.code == 2);
  CHECK_THAT(no_gpu.err, Catch::Contains("Give it a GPU (--gpu N)"));
  auto no_cap_no_gpu = run({"--cpu", "--memory-timeline", page, "--", "/bin/true"});
  CHECK(no_cap_no_gpu.code == 2);
  CHECK_THAT(no_cap_no_gpu.err, Catch::Contains("draws what the cap sees"));
  auto nowhere = probe({"--mem-limit", "256M", "--memory-timeline", "/proc/isorun-no-such/memory.html"}, {"info"});
  CHECK(nowhere.code == 2);
  CHECK(nowhere.out.empty());  // the command never ran
  CHECK_THAT(nowhere.err, Catch::Contains("cannot write there"));
  fs::remove_all(dir);
}

TEST_CASE("a task's message with terminal control sequences is printed with them made visible", "[cli][hostile]") {
  // OSC (set the window title), CSI (clear the screen), a carriage return that would overwrite
  // the line and a C1 CSI (U+009B); a newline and a tab stay.
  const std::string nasty =
      "\x1b]0;pwned\x07\x1b[2J\rfake\xc2\x9b"
      "1m end\n\tnext é";
  auto r = run(with_tasks({"--cpu", "fail", "arg0=" + nasty}));
  CHECK(r.code == 1);
  for (char c : {'\x1b', '\x07', '\r'}) CHECK(r.err.find(c) == std::string::npos);
  CHECK(r.err.find("\xc2\x9b") == std::string::npos);
  CHECK_THAT(r.err, Catch::Contains("isorun: fail failed on cpu: task_error: std::domain_error: "
                                    "\\x1b]0;pwned\\x07\\x1b[2J\\x0dfake\\u009b1m end\n\tnext é"));
  // A message quoting the spec's own words (an error before anything runs) too.
  auto bad = run(with_tasks({"--cpu", "fail", "bogus\x1b[2J=1"}));
  CHECK(bad.code == 2);
  CHECK(bad.err.find('\x1b') == std::string::npos);
}

TEST_CASE("a task's bytes that are not UTF-8 reach --json as U+FFFD, not an internal error", "[cli][hostile]") {
  auto r = run(with_tasks({"--json", "--cpu", "fail_latin1", "arg0=0"}));
  INFO(r.err);
  CHECK(r.code == 1);  // the task's failure, not isorun's (125)
  const json j = json::parse(r.out);
  CHECK(j["outcome"] == "task_error");
  CHECK(j["message"] == "caf\xef\xbf\xbd \xef\xbf\xbd");
  auto plain = run(with_tasks({"--cpu", "fail_latin1", "arg0=0"}));
  CHECK(plain.code == 1);
  CHECK_THAT(plain.err, Catch::Contains("std::domain_error: caf\xef\xbf\xbd"));
}

TEST_CASE("--flag=value is --flag value, in a run, a -- CMD and a sweep", "[cli][options]") {
  const std::vector<std::string> sim = {"ISORUN_SIMULATE_GPUS=2x16G"};
  auto spaced = run(with_tasks({"-q", "--gpu", "1", "--mem-limit", "6G", "where"}), sim);
  auto joined = run({"--tasks=" CLI_TEST_TASKS, "-q", "--gpu=1", "--mem-limit=6G", "where"}, sim);
  REQUIRE(joined.code == 0);
  CHECK(joined.out == spaced.out);
  CHECK(json::parse(joined.out) == "GPU-sim-1 cap=" + std::to_string(6ULL << 30));
  // Options after the task's name, as before it.
  auto after = run(with_tasks({"typed", "n=5", "--cpu", "--json"}));
  REQUIRE(after.code == 0);
  CHECK(json::parse(after.out)["result"]["n"] == 5);
  auto cmd = run({"-q", "--gpu=1", "--mem-limit-mode=advisory", "--mem-limit=1G", "--", "sh", "-c",
                  "echo $ISORUN_MEM_LIMIT \"$@\"", "sh", "--gpu=0", "k=v"},
                 sim);
  REQUIRE(cmd.code == 0);
  CHECK(cmd.out == "1073741824 --gpu=0 k=v\n");  // after --, the command's own words, untouched

  const fs::path dir = fs::temp_directory_path() / ("isorun-cli-sweep-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto sweep = run({"--grace=1s", "sweep", "--grid=x=1,2,3", "--out=" + (dir / "out").string(), "--cpu-slots=2",
                    "--metric=x:min", "--top=2", "--no-progress", "--", "sh", "-c", "echo '{\"x\": {x}}'"});
  INFO(sweep.err);
  REQUIRE(sweep.code == 0);
  CHECK_THAT(sweep.err, Catch::Contains("3 trials (3 to run) on 2 CPU slots"));
  std::ifstream journal(dir / "out" / "results.jsonl");
  CHECK(std::count(std::istreambuf_iterator<char>(journal), {}, '\n') == 3);
  // --flag=value of a sweep flag is checked as its spaced form is.
  auto bad = run({"sweep", "--grid=x=1", "--standby=two", "--out=" + (dir / "o2").string(), "--", "true"});
  CHECK(bad.code == 2);
  CHECK_THAT(bad.err, Catch::Contains("--standby two: expected a whole number"));
  fs::remove_all(dir);
}

TEST_CASE("a mistyped flag gets a did-you-mean in every command", "[cli][options]") {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--mem-limt", "2G", "hello"}, "unknown option '--mem-limt' (did you mean '--mem-limit'?); see isorun --help"},
      {{"--mem-limt=2G", "hello"}, "unknown option '--mem-limt=2G' (did you mean '--mem-limit'?)"},
      {{"hello", "--jsno"}, "unknown option '--jsno' (did you mean '--json'?)"},
      {{"--cpu", "--", "true", "--jsno"}, ""},  // after --: the command's, not a mistake
      {{"sweep", "x.yaml", "--wiat"}, "unknown sweep flag '--wiat' (did you mean '--wait'?); see isorun sweep --help"},
      {{"sweep", "x.yaml", "--cpu-slot=2"}, "(did you mean '--cpu-slots'?)"},
      {{"tasks", "--jsno"}, "(did you mean '--json'?)"},
      {{"gpus", "--jsn"}, "(did you mean '--json'?)"},
      {{"report", "out", "--hlep"}, "unknown option '--hlep' (did you mean '--help'?); see isorun report --help"},
      {{"status", "out", "--hepl"}, "(did you mean '--help'?); see isorun status --help"},
  };
  for (const auto& [args, said] : cases) {
    INFO(args[0] << " " << args[1]);
    auto r = run(args);
    if (said.empty()) {
      CHECK(r.code == 0);
      continue;
    }
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Catch::Contains(said));
    CHECK(r.out.empty());
  }
}

TEST_CASE("every command's --help fits in 100 columns", "[cli][options]") {
  for (const std::vector<std::string>& args : {std::vector<std::string>{"--help"},
                                               {"-h"},
                                               {"sweep", "--help"},
                                               {"sweep", "x.yaml", "-h"},
                                               {"tasks", "--help"},
                                               {"gpus", "--help"},
                                               {"report", "--help"},
                                               {"status", "--help"}}) {
    INFO(args[0]);
    auto r = run(args);
    CHECK(r.code == 0);
    CHECK_THAT(r.out, Catch::StartsWith("usage: isorun"));
    std::istringstream lines(r.out);
    for (std::string line; std::getline(lines, line);) {
      INFO(line);
      CHECK(line.size() <= 100);
    }
  }
  // Each flag of the table is in its command's help.
  CHECK_THAT(run({"--help"}).out, Catch::Contains("--memory-timeline FILE.html") && Catch::Contains("-q, --quiet"));
  CHECK_THAT(run({"sweep", "--help"}).out, Catch::Contains("--gpus-per-trial N") && Catch::Contains("--no-progress"));
  // A bare `isorun sweep` is a usage error: the usage on stderr.
  auto bare = run({"sweep"});
  CHECK(bare.code == 2);
  CHECK(bare.out.empty());
  CHECK_THAT(bare.err, Catch::StartsWith("usage: isorun"));
}

TEST_CASE("the rough edges of the command line: exit 2, what was wrong", "[cli][options]") {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--cpu", "hello", "--gpu"}, "--gpu needs a value; see isorun --help"},
      {{"sweep", "x.yaml", "--out"}, "--out needs a value"},
      {{"--memory-timeline=", "hello"}, "--memory-timeline needs a value after '='"},
      {{"hello", "--", "true"}, "give a TASK or -- CMD, not both"},
      {{"--cpu", "--"}, "'--' must be followed by a command to run"},
      {{"report"}, "isorun report OUT: give one sweep output folder"},
      {{"status", "a", "b"}, "isorun status OUT: give one sweep output folder"},
      {{"gpus", "extra"}, "unexpected argument 'extra'"},
      {{"sweep", "a.yaml", "b.yaml"}, "unexpected argument 'b.yaml'; see isorun sweep --help"},
      {{"sweep", "step", "--grid", "i=1", "--retry=out_of_memory=1"}, "OOM is never retried"},
      {{"--gpus=any:0", "hello"}, "any:N needs a count of 1 or more"},
      // A flag that takes a value, followed by another flag: the value is missing, not "--x".
      {{"sweep", "hello", "--grid", "name=a", "--out", "--fail-fast"},
       "--out needs a value, but '--fail-fast' follows it"},
      {{"--memory-timeline", "--quiet", "hello"}, "--memory-timeline needs a value, but '--quiet' follows it"},
      // A single run's options before `sweep`: said, not ignored.
      {{"--gpus", "0", "sweep", "--grid", "a=1", "--", "true"}, "--gpus before 'sweep' is an option of a single run"},
      {{"--cpu", "sweep", "--grid", "a=1", "--", "true"}, "--cpu before 'sweep'"},
      {{"-q", "sweep", "--grid", "a=1", "--", "true"}, "--quiet before 'sweep'"},
      {{"--json", "sweep", "--grid", "a=1", "--", "true"}, "--json before 'sweep'"},
      {{"--max-result", "1K", "sweep", "--grid", "a=1", "--", "true"}, "--max-result before 'sweep'"},
  };
  for (const auto& [args, said] : cases) {
    INFO(args[0]);
    auto r = run(args);
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Catch::Contains(said));
  }
  auto version = run({"--version"});
  CHECK(version.code == 0);
  CHECK_THAT(version.out, Catch::Matches("isorun [0-9]+\\.[0-9]+\\.[0-9]+\n"));
}

TEST_CASE("Ctrl-C on a -- CMD is handed to the command, which ends as it chooses", "[cli][signals]") {
  auto r = start(
      {"--cpu", "--", "sh", "-c", "trap 'echo got INT; exit 3' INT; echo ready; sleep 1000 >/dev/null 2>&1 & wait"});
  std::string out;
  char buf[64];
  while (out.find("ready\n") == std::string::npos) {
    ssize_t n = ::read(r.out, buf, sizeof buf);
    REQUIRE(n > 0);
    out.append(buf, static_cast<std::size_t>(n));
  }
  ::kill(r.process.pid(), SIGINT);
  auto done = finish(r);
  CHECK(done.code == 3);  // the command's own status, mirrored
  CHECK(out + done.out == "ready\ngot INT\n");
}
