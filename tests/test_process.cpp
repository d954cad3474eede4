// Runner building blocks: process spawning and stopping, sizes and durations, GPU inventory.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "isorun/runner/containment.hpp"
#include "isorun/runner/errors.hpp"
#include "isorun/runner/gpu_inventory.hpp"
#include "isorun/runner/process.hpp"
#include "isorun/runner/units.hpp"
#include "test_support.hpp"

using namespace std::chrono_literals;
namespace r = isorun::runner;

namespace {
r::spawn_options shell(const std::string& script) {
  r::spawn_options o;
  o.executable = "/bin/sh";
  o.args = {"-c", script};
  for (char** e = environ; *e; ++e) o.env.emplace_back(*e);
  return o;
}
// The two ways a child starts: plain (vfork), and born in a cgroup of its own (clone3), where
// this machine lets isorun make one ("" = no cgroup).
std::vector<std::string> start_paths() {
  std::vector<std::string> paths = {""};
  if (r::containment().cgroup) paths.push_back(r::new_child_cgroup());
  else WARN("no cgroup half: " << r::containment().why_not);
  return paths;
}

// The cgroup v2 path a process is in, as /proc/PID/cgroup gives it ("0::/a/b" -> "/a/b").
std::string cgroup_of(const std::string& proc_cgroup) {
  const auto at = proc_cgroup.find("0::");
  return at == std::string::npos ? "" : proc_cgroup.substr(at + 3, proc_cgroup.find('\n', at) - at - 3);
}
}  // namespace

TEST_CASE("exit codes and signals are values", "[process]") {
  CHECK(r::spawn(shell("exit 7")).reap().code == 7);
  auto st = r::spawn(shell("kill -SEGV $$")).reap();
  CHECK(st.signal == SIGSEGV);
  CHECK(st.shell_code() == 128 + SIGSEGV);
  CHECK(r::describe(st).find("SIGSEGV") != std::string::npos);
  CHECK(r::signal_name(SIGKILL) == "SIGKILL");
}

TEST_CASE("a failed exec throws spawn_error and leaves no zombie", "[process]") {
  for (const std::string& cgroup : start_paths()) {
    INFO("cgroup: " << cgroup);
    r::spawn_options o;
    o.executable = "/nonexistent/program";
    o.cgroup = cgroup;
    try {
      r::spawn(o);
      FAIL("expected spawn_error");
    } catch (const r::spawn_error& e) {
      CHECK(e.error() == ENOENT);
      CHECK(std::string(e.what()).find("/nonexistent/program") != std::string::npos);
    }
    isorun::runner::wait_for_watcher_idle();  // (its workers are its to reap)
    CHECK(::waitpid(-1, nullptr, WNOHANG) == -1);
    CHECK(errno == ECHILD);
    if (!cgroup.empty()) CHECK_FALSE(std::filesystem::exists(cgroup));  // removed with the failed start
  }
}

TEST_CASE("descriptors are passed under the requested numbers and nothing else leaks", "[process]") {
  for (const std::string& cgroup : start_paths()) {
    INFO("cgroup: " << cgroup);
    int p[2];
    REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
    int stray = ::open("/dev/null", O_RDONLY);  // not close-on-exec: must still not reach the child
    auto o = shell("echo via-fd-3 >&3; ls /proc/self/fd | wc -l >&3; cat /proc/self/cgroup >&3; echo pid $$ >&3; cat " +
                   (cgroup.empty() ? std::string("/dev/null") : cgroup + "/cgroup.procs") + " >&3");
    o.fds = {{3, p[1]}};
    o.cgroup = cgroup;
    auto c = r::spawn(o);
    ::close(p[1]);
    char buf[128] = {};
    std::string got;
    for (ssize_t n; (n = ::read(p[0], buf, sizeof buf)) > 0;) got.append(buf, static_cast<std::size_t>(n));
    ::close(p[0]);
    ::close(stray);
    CHECK(c.reap().code == 0);
    CHECK(got.rfind("via-fd-3\n", 0) == 0);
    // 0, 1, 2, 3 and the descriptor ls opens for /proc/self/fd.
    CHECK(std::stoi(got.substr(9)) == 5);
    // Born in its cgroup (or in this process's own, without one); reaped, the cgroup is gone.
    std::ifstream own("/proc/self/cgroup");
    const std::string mine = cgroup_of(std::string(std::istreambuf_iterator<char>(own), {}));
    const std::string its = cgroup_of(got);
    if (cgroup.empty()) {
      CHECK(its == mine);
    } else {
      // Its cgroup lists it. To itself the cgroup is "/" in a cgroup namespace rooted there (where
      // isorun may make one), else the mount point and the path it sees make the directory.
      const auto at = got.find("pid ") + 4;
      const std::string pid = got.substr(at, got.find('\n', at) - at);
      CHECK((got.substr(at).find("\n" + pid + "\n") != std::string::npos));
      if (its != "/") {
        CHECK(its != mine);
        CHECK(cgroup.size() >= its.size());
        CHECK(cgroup.compare(cgroup.size() - std::min(its.size(), cgroup.size()), its.size(), its) == 0);
      }
    }
    if (!cgroup.empty()) CHECK_FALSE(std::filesystem::exists(cgroup));
  }
}

TEST_CASE("stop escalates to SIGKILL for a child that ignores SIGTERM, grandchildren included", "[process]") {
  int p[2];
  REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
  auto o = shell("trap '' TERM; sleep 1000 & echo $!; wait");
  o.fds = {{1, p[1]}};
  auto c = r::spawn(o);
  ::close(p[1]);
  FILE* in = ::fdopen(p[0], "r");
  int grandchild = 0;
  REQUIRE(std::fscanf(in, "%d", &grandchild) == 1);
  std::fclose(in);
  auto st = c.stop(r::stop_plan::graceful(100ms));
  CHECK(st.signal == SIGKILL);
  CHECK(isorun::test::process_gone(grandchild));
}

TEST_CASE("a stop plan's steps run in order, only while the child runs", "[process]") {
  // A first step that only waits: a child that exits on its own within it is never signalled.
  int p[2];
  REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
  auto o = shell("cat > /dev/null; exit 3");
  o.fds = {{0, p[0]}};
  auto c = r::spawn(o);
  ::close(p[0]);
  ::close(p[1]);  // EOF: the child exits with 3
  auto st = c.stop({{{0, std::chrono::hours(1)}, {SIGKILL, 0ms}}});
  CHECK(st.code == 3);
  CHECK(st.signal == 0);

  // Driven from an event loop: each advance() takes the next step at once, whatever is due.
  int ready[2];
  REQUIRE(::pipe2(ready, O_CLOEXEC) == 0);
  auto so = shell("trap '' TERM INT; echo ready; while :; do sleep 1; done");
  so.fds = {{1, ready[1]}};
  auto stubborn = r::spawn(so);
  ::close(ready[1]);
  char buf[6] = {};
  REQUIRE(::read(ready[0], buf, 5) == 5);  // the trap is set
  ::close(ready[0]);
  r::stop_escalation e(r::stop_plan::graceful(std::chrono::hours(1), SIGINT));
  CHECK_FALSE(e.started());
  CHECK(e.advance(stubborn) != std::chrono::steady_clock::time_point::max());  // SIGINT: ignored
  CHECK(e.started());
  CHECK_FALSE(stubborn.wait_for(0ms));
  CHECK(e.advance(stubborn) == std::chrono::steady_clock::time_point::max());  // SIGKILL: the last step
  CHECK(stubborn.reap().signal == SIGKILL);
}

TEST_CASE("find_executable resolves like execvp", "[process]") {
  CHECK(r::find_executable("sh").has_value());
  CHECK(r::find_executable("/bin/sh") == std::optional<std::string>("/bin/sh"));
  CHECK_FALSE(r::find_executable("no-such-program-isorun").has_value());
  CHECK_FALSE(r::find_executable("/etc/passwd").has_value());  // not executable
}

TEST_CASE("sizes", "[units]") {
  using isorun::parse_size;
  CHECK(parse_size("2G") == 2ULL << 30);
  CHECK(parse_size("512M") == 512ULL << 20);
  CHECK(parse_size("1.5GiB") == 3ULL << 29);
  CHECK(parse_size("2GB") == 2ULL << 30);
  CHECK(parse_size("4096") == 4096);
  CHECK(parse_size("16k") == 16384);
  CHECK(parse_size("1T") == 1ULL << 40);
  for (const char* bad : {"", "G", "-1G", "2X", "1.5", "2 Gigs", "1e3", "99999999999T"}) {
    INFO(bad);
    CHECK_THROWS_AS(parse_size(bad), isorun::parse_error);
  }
  CHECK_THROWS_WITH(parse_size("2X"), Catch::Contains("e.g. 2G, 512M, 1.5GiB"));
  CHECK(isorun::format_size(3ULL << 29) == "1.50 GiB");
}

TEST_CASE("durations", "[units]") {
  using isorun::parse_duration;
  CHECK(parse_duration("500ms") == 500ms);
  CHECK(parse_duration("30s") == 30s);
  CHECK(parse_duration("5m") == 5min);
  CHECK(parse_duration("1.5s") == 1500ms);
  CHECK(parse_duration("2h") == 2h);
  CHECK_THROWS_WITH(parse_duration("10"), Catch::Contains("has no unit: write 10s, 10ms or 10m"));
  for (const char* bad : {"", "s", "5 minutes", "-3s", "1d"}) {
    INFO(bad);
    CHECK_THROWS_AS(parse_duration(bad), isorun::parse_error);
  }
}

TEST_CASE("simulated GPU inventories", "[inventory]") {
  auto inv = r::gpu_inventory::simulated("2x16G,1x80G");
  REQUIRE(inv.gpus.size() == 3);
  CHECK(inv.gpus[0].uuid == "GPU-sim-0");
  CHECK(inv.gpus[2].total_memory == 80ULL << 30);
  CHECK(inv.at(2).index == 2);
  CHECK(r::gpu_inventory::simulated("16G,24G").gpus[1].total_memory == 24ULL << 30);
  CHECK_THROWS_WITH(inv.at(3), Catch::Contains("does not exist"));
  for (const char* bad : {"", "2x", "0x16G", "axb", "16G,,8G", "2x0"}) {
    INFO(bad);
    CHECK_THROWS_AS(r::gpu_inventory::simulated(bad), isorun::parse_error);
  }
  r::gpu_inventory none;
  none.detail = "no NVIDIA driver";
  CHECK_THROWS_WITH(none.at(0), Catch::Contains("--cpu") && Catch::Contains("ISORUN_SIMULATE_GPUS"));
}
