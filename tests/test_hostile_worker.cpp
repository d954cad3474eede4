// Tasks that turn on the machinery around them: the worker's control socket, which is open in
// their own process, and the cgroups that contain them. Real workers, as in test_runner.cpp (the
// tasks below run in re-executed copies of this binary).
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include "isorun/isorun.hpp"
#include "isorun/runner/containment.hpp"
#include "isorun/runner/process.hpp"
#include "isorun/serialization/control.hpp"
#include "isorun/serialization/segment_pool.hpp"
#include "runner_tasks.hpp"
#include "test_support.hpp"

using namespace std::chrono_literals;
using namespace isorun::literals;
using isorun::test::process_gone;

namespace {
namespace ser = isorun::serialization;

// Writes junk to the worker's control socket, without waiting, until its buffer is full or the
// supervisor hangs up, then returns: the worker's own `done` would find no room left.
std::string jams_control(int) {
  const char junk[] = "not a control message";
  while (::send(ser::control_fd, junk, sizeof junk, MSG_DONTWAIT | MSG_NOSIGNAL) > 0) {
  }
  return "returned";
}

// One junk frame, then waits for ever: only the supervisor can end it.
std::string junk_then_waits(int) {
  const char junk[] = "not a control message";
  ::send(ser::control_fd, junk, sizeof junk, MSG_NOSIGNAL);
  for (;;) ::pause();
}

// A `done` as the worker would send it: its pid and the devices it sees.
ser::done_message well_formed_done() {
  ser::done_message done;
  done.pid = ::getpid();
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) done.visible_devices = v;
  if (const char* v = std::getenv("CUDA_DEVICE_ORDER")) done.device_order = v;
  return done;
}

// Well-formed `done`s, as many as the socket takes.
std::string floods_control(int) {
  const ser::done_message done = well_formed_done();
  try {
    for (;;) ser::send_message(ser::control_fd, done);
  } catch (const std::system_error&) {  // the supervisor hung up
  }
  return "returned";
}

// Reports `done` itself and returns: the worker's own `done` is one more than the protocol has.
std::string forges_done(int) {
  ser::send_message(ser::control_fd, well_formed_done());
  return "returned";
}

// Returns "stale" for 0; else reports `done` itself, with no result written, and exits before
// the worker can send its own.
std::string forges_done_and_exits(int forge) {
  if (!forge) return "stale";
  ser::send_message(ser::control_fd, well_formed_done());
  ::_exit(0);
}

// Grows the result segment it holds (so that, let go, it would be the pool's largest), reports
// `done` itself with a small result that fails validation, then waits for `dir`/go and writes
// 'X' over every isorun segment it holds, and leaves `dir`/written.
std::string rejected_then_writes(const std::string& dir) {
  std::vector<int> segments;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    if (std::filesystem::read_symlink(e.path(), ec).string().starts_with("/memfd:isorun-segment"))
      segments.push_back(std::stoi(e.path().filename().string()));
  }
  for (int fd : segments)
    if (::ftruncate(fd, 8 << 20) != 0) throw std::runtime_error("ftruncate");
  ser::done_message done = well_formed_done();
  done.inline_result = std::string(ser::header_size + 8, 'g');  // no header: rejected
  ser::send_message(ser::control_fd, done);
  { std::ifstream go(dir + "/go"); }
  const std::string xs(1 << 20, 'X');
  for (int fd : segments)
    if (::pwrite(fd, xs.data(), xs.size(), 0) < 0) throw std::runtime_error("pwrite");
  std::ofstream(dir + "/written") << "written\n";
  return "returned";
}

// The descriptors of the isorun segments this process holds (its request, result, ring).
std::vector<int> held_segments() {
  std::vector<int> segments;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    if (std::filesystem::read_symlink(e.path(), ec).string().starts_with("/memfd:isorun-segment"))
      segments.push_back(std::stoi(e.path().filename().string()));
  }
  return segments;
}

// Grows every segment it holds to `to` bytes (sparse: it costs this process nothing), then
// returns a result that goes through the result segment (larger than what `done` carries).
std::string grows_segments(std::uint64_t to) {
  for (int fd : held_segments())
    if (::ftruncate(fd, static_cast<off_t>(to)) != 0) throw std::runtime_error("ftruncate");
  return std::string(64 << 10, 'r');
}

// Forks a child that leaves the worker's group, maps every segment the worker holds writable
// (so the worker cannot seal its result) and says so; then the worker returns a 1 MiB blob of
// 'a' written in place. Once the FIFO `dir`/go is opened, the child unmaps and tries to shrink
// each segment to nothing, and writes "refused changed" to the FIFO `dir`/report.
// (The worker has threads: its child makes only system calls. Anything that allocates could
// wait for ever on a lock another thread held at the fork.)
isorun::blob shrinks_later(const std::string& dir) {
  int mapped[2];
  if (::pipe(mapped) != 0) throw std::runtime_error("pipe");
  isorun::blob b = isorun::this_worker().output_blob(1 << 20);  // the result segment, grown and mapped
  std::memset(b.mutable_data(), 'a', b.size());
  const std::vector<int> segments = held_segments();
  const std::string go = dir + "/go", report = dir + "/report";
  std::vector<std::pair<int, void*>> maps;
  maps.reserve(segments.size());
  if (::fork() == 0) {
    ::setsid();
    for (int fd : segments) {
      struct stat st {};
      if (::fstat(fd, &st) == 0 && st.st_size > 0)
        maps.emplace_back(fd, ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    }
    ::close(mapped[0]);
    ::close(mapped[1]);                     // the worker's read returns
    ::close(::open(go.c_str(), O_RDONLY));  // blocks until the test opens it
    int refused = 0, changed = 0;
    for (auto [fd, m] : maps) {
      if (m != MAP_FAILED) ::munmap(m, 4096);
      (::ftruncate(fd, 0) == 0 ? changed : refused) += 1;
    }
    const char line[] = {static_cast<char>('0' + refused), ' ', static_cast<char>('0' + changed), '\n'};
    const int out = ::open(report.c_str(), O_WRONLY);
    [[maybe_unused]] auto n = ::write(out, line, sizeof line);
    ::_exit(0);
  }
  ::close(mapped[1]);
  char none;
  [[maybe_unused]] auto n = ::read(mapped[0], &none, 1);
  ::close(mapped[0]);
  return b;
}

// Forks a child that tries to move itself into the cgroup `where` (the supervisor's, named from
// outside) and, if it moved, leaves the worker's process group too and waits for ever. Returns
// "CGROUP ERRNO PID": the worker's cgroup as it sees it, the errno of the move (0: it moved) and
// the child's pid.
std::string leaves_cgroup(const std::string& where) {
  int report[2];
  if (::pipe(report) != 0) throw std::runtime_error("pipe");
  const std::string procs_file = where + "/cgroup.procs";  // (made here: the child only makes system calls)
  const pid_t child = ::fork();
  if (child < 0) throw std::runtime_error("fork failed");
  if (child == 0) {
    ::close(report[0]);
    const int procs = ::open(procs_file.c_str(), O_WRONLY | O_CLOEXEC);
    const int err = procs < 0 ? errno : ::write(procs, "0", 1) == 1 ? 0 : errno;
    [[maybe_unused]] auto n = ::write(report[1], &err, sizeof err);
    if (err != 0) ::_exit(0);
    ::setsid();
    for (;;) ::pause();
  }
  ::close(report[1]);
  int err = -1;
  [[maybe_unused]] auto n = ::read(report[0], &err, sizeof err);
  ::close(report[0]);
  std::string seen;
  std::ifstream in("/proc/self/cgroup");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("0::", 0) == 0) seen = line.substr(3);
  return seen + " " + std::to_string(err) + " " + std::to_string(child);
}

}  // namespace

ISORUN_TASK(jams_control);
ISORUN_TASK(junk_then_waits);
ISORUN_TASK(floods_control);
ISORUN_TASK(forges_done);
ISORUN_TASK(forges_done_and_exits);
ISORUN_TASK(rejected_then_writes);
ISORUN_TASK(leaves_cgroup);
ISORUN_TASK(grows_segments);
ISORUN_TASK(shrinks_later);

namespace {

// Whether this process may create cgroup namespaces (CAP_SYS_ADMIN in its effective set).
bool may_create_cgroup_namespaces() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("CapEff:", 0) == 0) return (std::stoull(line.substr(7), nullptr, 16) >> 21) & 1;
  return false;
}

// Whether the cgroup2 file system that holds `dir` is mounted with nsdelegate: only then does the
// kernel refuse a process in a cgroup namespace a move to a cgroup outside it.
bool cgroup_namespaces_delegate(const std::string& dir) {
  std::ifstream in("/proc/self/mountinfo");
  for (std::string line; std::getline(in, line);) {
    // ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTIONS
    const auto dash = line.find(" - cgroup2 ");
    if (dash == std::string::npos) continue;
    std::istringstream fields(line);
    std::string id, parent, dev, root, mount;
    fields >> id >> parent >> dev >> root >> mount;
    if (dir.rfind(mount + "/", 0) == 0) return line.find("nsdelegate", dash) != std::string::npos;
  }
  return false;
}

}  // namespace

TEST_CASE("a task that writes to its worker's control socket stops the worker at once, as invalid_result",
          "[runner][hostile]") {
  using k = isorun::outcome_kind;
  const int shm = isorun::test::shm_entries();
  struct expectation {
    const char* name;
    std::string (*task)(int);
    const char* says;
  };
  const expectation cases[] = {
      {"jams_control", jams_control, "malformed control message"},
      {"junk_then_waits", junk_then_waits, "malformed control message"},
      {"floods_control", floods_control, "second done"},
      {"forges_done", forges_done, "second done"},
  };
  for (const bool early : {false, true}) {
    for (const auto& c : cases) {
      // An early result is handed over on the first `done`, which a forged one then is (each of
      // the flood's is one).
      if (early && (c.task == forges_done || c.task == floods_control)) continue;
      INFO(c.name << (early ? " (early result)" : ""));
      // The timeout bounds a worker that is never stopped, so that it fails the test instead of
      // hanging it.
      const isorun::isolated_options opts{.timeout = 60s, .echo_stderr = false, .early_result = early};
      auto h = isorun::isolated(c.task, opts).async(0);
      const pid_t pid = h.pid();
      auto r = h.try_get();
      CHECK(r.status().kind == k::invalid_result);
      CHECK_THAT(r.status().message, Catch::Contains(c.says));
      CHECK_THAT(r.status().message, Catch::Contains("must not write to descriptor 3"));
      CHECK(process_gone(pid, 0));  // stopped and reaped before the call returned
    }
  }
  CHECK(isorun::test::shm_entries() == shm);
}

TEST_CASE("a forged success without a result is not given the result of the call before", "[runner][hostile]") {
  const auto f = isorun::isolated(forges_done_and_exits, {.echo_stderr = false});
  REQUIRE(f(0) == "stale");  // its result segment goes back to the pool, and serves the next call
  auto r = f.try_call(1);
  CHECK(r.status().kind == isorun::outcome_kind::invalid_result);
  CHECK_THAT(r.status().message, Catch::Contains("worker result rejected"));
}

TEST_CASE("a rejected early result's segment is not used again while its worker still runs",
          "[runner][hostile][early]") {
  isorun::stop_standby();
  isorun::serialization::segment_pool::instance().clear();
  char dir[] = "/tmp/isorun-rejected-XXXXXX";
  REQUIRE(::mkdtemp(dir));
  const std::string d = dir;
  REQUIRE(::mkfifo((d + "/go").c_str(), 0600) == 0);
  // A long grace: the worker is not to be killed while it waits for the test.
  auto h = isorun::isolated(rejected_then_writes,
                            {.grace = std::chrono::hours(1), .echo_stderr = false, .early_result = true})
               .async(d);
  const pid_t pid = h.pid();
  auto r = h.try_get();
  CHECK(r.status().kind == isorun::outcome_kind::invalid_result);
  // The next result goes to the largest idle segment, which the rejected worker's would be.
  const isorun::blob b = isorun::isolated(runner_tests::make_pattern)(std::uint64_t{1} << 20, std::uint64_t{5});
  { std::ofstream go(d + "/go"); }  // the rejected worker writes over what it holds, and exits
  CHECK(process_gone(pid));
  CHECK(std::filesystem::exists(d + "/written"));
  bool intact = true;
  for (std::size_t i = 0; i < b.size(); ++i) intact &= b.data()[i] == runner_tests::pattern_byte(i, 5);
  CHECK(intact);
  std::filesystem::remove_all(d);
}

TEST_CASE("a result segment grown far past any result is refused, and the caller maps none of it",
          "[runner][hostile]") {
  REQUIRE(isorun::test::reset_peak_resident());
  const std::size_t before = isorun::test::peak_resident_kib();
  for (const bool early : {false, true}) {
    INFO((early ? "early result" : "result after the exit"));
    auto r = isorun::isolated(grows_segments, {.echo_stderr = false, .max_result = 1_GiB, .early_result = early})
                 .try_call(64_GiB);
    CHECK(r.status().kind == isorun::outcome_kind::invalid_result);
    CHECK_THAT(r.status().message, Catch::Contains("segment grew to 68719476736 bytes") &&
                                       Catch::Contains("largest payload it may hold (1073741824 bytes)"));
  }
  // Mapped whole and faulted in, each would have cost this process 64 GiB.
  CHECK(isorun::test::peak_resident_kib() < before + 64 * 1024);
  // The pool hands out none of them again: the next calls, given the largest idle segment for
  // their result, succeed and map no more than they need.
  for (int i = 0; i < 3; ++i)
    CHECK(isorun::isolated(grows_segments, {.echo_stderr = false})(512_MiB).size() == 64 << 10);
  CHECK(isorun::test::peak_resident_kib() < before + 64 * 1024);
}

TEST_CASE("a result segment grown within the limit costs the caller only the result it declares", "[runner][hostile]") {
  REQUIRE(isorun::test::reset_peak_resident());
  const std::size_t before = isorun::test::peak_resident_kib();
  const std::string got = isorun::isolated(grows_segments, {.echo_stderr = false})(512_MiB);
  CHECK(got == std::string(64 << 10, 'r'));
  CHECK(isorun::test::peak_resident_kib() < before + 64 * 1024);  // not the 512 MiB the worker left
}

TEST_CASE("a process the worker left behind cannot shrink the result the caller holds", "[runner][hostile]") {
  runner_tests::process_group_containment pinned;  // (no cgroup kill: the child must outlive the worker)
  char dir[] = "/tmp/isorun-shrink-XXXXXX";
  REQUIRE(::mkdtemp(dir));
  const std::string d = dir;
  REQUIRE(::mkfifo((d + "/go").c_str(), 0600) == 0);
  REQUIRE(::mkfifo((d + "/report").c_str(), 0600) == 0);
  auto r = isorun::isolated(shrinks_later, {.echo_stderr = false}).try_call(d);
  REQUIRE(r.ok());
  { std::ofstream go(d + "/go"); }  // the child now tries to shrink every segment to nothing
  int refused = -1, changed = -1;
  std::ifstream(d + "/report") >> refused >> changed;
  CHECK(refused >= 1);  // its result segment at least
  CHECK(changed == 0);
  // Shrunk under the caller's mapping, reading the result would kill this process (SIGBUS).
  const auto& b = r.value();
  REQUIRE(b.size() == 1 << 20);
  CHECK(std::all_of(b.bytes().begin(), b.bytes().end(), [](std::byte c) { return c == std::byte{'a'}; }));
  std::filesystem::remove_all(d);
}

TEST_CASE("a worker's processes cannot move into the supervisor's cgroup", "[runner][hostile][containment]") {
  const auto* found = runner_tests::cgroup_containment();
  if (!found) return;
  const auto& contained = *found;
  auto r = isorun::isolated(leaves_cgroup).try_call(contained.where);
  REQUIRE(r.ok());
  std::istringstream in(r.value());
  std::string seen;
  int err = -1;
  pid_t child = -1;
  REQUIRE(in >> seen >> err >> child);
  const bool escaped = !process_gone(child, 0);
  if (escaped) ::kill(child, SIGKILL);  // (not to be left behind by a failure)
  if (!may_create_cgroup_namespaces()) {
    WARN(
        "skipped: without CAP_SYS_ADMIN workers share this process's cgroup namespace, and a task's "
        "child can move into the supervisor's cgroup (containment holds against accidents only)");
    return;
  }
  CHECK(seen == "/");  // its own cgroup is the root of all it can name
  if (!cgroup_namespaces_delegate(contained.where)) {
    WARN(
        "skipped: the cgroup2 file system here is mounted without nsdelegate, so the kernel lets a "
        "process in a cgroup namespace move to a cgroup outside it");
    return;
  }
  CHECK(err == ENOENT);  // the kernel refuses a move to a cgroup outside the writer's namespace
  CHECK_FALSE(escaped);  // so it stayed in the worker's cgroup, and went with it
}

TEST_CASE("a forked copy of a supervisor leaves its workers' cgroups alone when it exits", "[runner][containment]") {
  if (!runner_tests::cgroup_containment()) return;
  auto victim = runner_tests::start_victim({"forks"});
  const int kept = std::fgetc(victim.out.get());
  CHECK(victim.process.reap().success());
  CHECK(kept == '1');
}

TEST_CASE("a supervisor that ends removes its cgroup, killing what moved into it", "[runner][hostile][containment]") {
  if (!runner_tests::cgroup_containment()) return;
  auto victim = runner_tests::start_victim({"escape"});
  char where[4096] = {};
  int stray = 0;
  const bool told = std::fscanf(victim.out.get(), "%4095s %d", where, &stray) == 2;
  victim.out.reset();
  const auto exited = victim.process.reap();
  REQUIRE(told);
  REQUIRE(stray > 0);
  CHECK(exited.success());
  const bool killed = process_gone(stray, 0);  // before the supervisor's exit was complete
  if (!killed) ::kill(stray, SIGKILL);         // (not to be left behind by a failure)
  CHECK(killed);
  CHECK_FALSE(std::filesystem::exists(where));
  if (std::filesystem::exists(where)) {
    CHECK(process_gone(stray));
    ::rmdir(where);
  }
}
