// Runner failures: exceptions, crashes, timeouts, cancellation, a killed supervisor, misbehaving
// workers, and resources running out; each classified, nothing left behind.
#include <catch2/catch.hpp>

#include <sys/eventfd.h>

#include <thread>

#include "isorun/runner/admission.hpp"
#include "isorun/runner/queued_job.hpp"
#include "runner_tasks.hpp"

using namespace runner_tests;

TEST_CASE("a task's exception is rethrown as task_error with its type and message", "[runner]") {
  auto f = isorun::isolated(throws);
  try {
    f(7);
    FAIL("expected task_error");
  } catch (const isorun::task_error& e) {
    CHECK(e.type_name() == "std::runtime_error");
    CHECK(e.message() == "bad value 7");
  }
  try {
    f(1);
    FAIL("expected task_error");
  } catch (const isorun::task_error& e) {
    CHECK(e.type_name() == "runner_tests::custom_failure");
    CHECK(e.message() == "custom failure 42");
  }
  auto r = f.try_call(7);
  CHECK_FALSE(r.ok());
  CHECK(r.status().kind == isorun::outcome_kind::task_error);
  CHECK(isorun::exit_code(r.status().kind) == 1);
}

TEST_CASE("SIGSEGV and abort are reported as worker_crashed with the signal", "[runner]") {
  try {
    isorun::isolated(segfaults, {.echo_stderr = false})(0);
    FAIL("expected worker_crashed");
  } catch (const isorun::worker_crashed& e) {
    CHECK(e.signal() == SIGSEGV);
    CHECK(e.exit_code() == -1);
    REQUIRE_FALSE(e.stderr_tail().empty());
    CHECK(e.stderr_tail().back() == "about to crash");
    CHECK(std::string(e.what()).find("SIGSEGV") != std::string::npos);
  }
  auto r = isorun::isolated(aborts).try_call(0);
  CHECK(r.status().kind == isorun::outcome_kind::crashed);
  CHECK(r.status().exit.signal == SIGABRT);
}

TEST_CASE("a worker that exits without a result is a crash with its exit code", "[runner]") {
  auto r = isorun::isolated(exits_early).try_call(3);
  REQUIRE(r.status().kind == isorun::outcome_kind::crashed);
  CHECK(r.status().exit.code == 3);
  CHECK(r.status().message.find("without delivering a result") != std::string::npos);
  CHECK_THROWS_AS(r.value(), isorun::worker_crashed);
}

TEST_CASE("a timeout stops the task and the grandchild it started, escalating to SIGKILL", "[runner]") {
  const temp_fifo tf;
  const std::string& fifo = tf.path;
  auto f = isorun::isolated(hang_with_grandchild, {.timeout = 5s, .grace = 200ms});
  auto call = f.async(fifo);
  auto [worker, grandchild] = read_pids(fifo);
  REQUIRE(worker == call.pid());
  auto r = call.try_get();
  CHECK(r.status().kind == isorun::outcome_kind::timeout);
  CHECK(r.status().exit.signal == SIGKILL);  // SIGTERM was ignored
  CHECK(process_gone(worker));
  CHECK(process_gone(grandchild));
  CHECK_THROWS_AS(r.value(), isorun::task_timeout);
}

TEST_CASE("cancel() stops an async call and everything it started", "[runner]") {
  const temp_fifo tf;
  const std::string& fifo = tf.path;
  auto call = isorun::isolated(hang_with_grandchild, {.grace = 100ms}).async(fifo);
  auto [worker, grandchild] = read_pids(fifo);
  CHECK_FALSE(call.wait_for(0ms));
  call.cancel();
  auto r = call.try_get();
  CHECK(r.status().kind == isorun::outcome_kind::cancelled);
  CHECK(process_gone(worker));
  CHECK(process_gone(grandchild));
}

TEST_CASE("a second cancel() kills at once, without waiting out the grace period", "[runner]") {
  const temp_fifo tf;
  // The task ignores SIGTERM and the grace period is an hour: only the second cancel ends it.
  auto call = isorun::isolated(hang_with_grandchild, {.grace = std::chrono::hours(1)}).async(tf.path);
  auto [worker, grandchild] = read_pids(tf.path);
  call.cancel();
  call.cancel();
  auto r = call.try_get();
  CHECK(r.status().kind == isorun::outcome_kind::cancelled);
  CHECK(r.status().exit.signal == SIGKILL);
  CHECK(process_gone(worker));
  CHECK(process_gone(grandchild));
}

namespace {
// An interruption whose descriptor is readable again after each ask until it has been asked
// `rearm` times: asked as a wait begins, then as often as the test says, never on a clock.
struct test_interruption {
  int fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  int asked = 0;
  bool elsewhere = false;
  std::thread::id waiter = std::this_thread::get_id();
  ~test_interruption() { ::close(fd); }
  isorun::runner::job::interruption ask(int rearm, int true_from) {
    return {fd, [=, this] {
              std::uint64_t n = 0;
              [[maybe_unused]] auto r = ::read(fd, &n, sizeof n);
              elsewhere = elsewhere || std::this_thread::get_id() != waiter;
              if (++asked < rearm) [[maybe_unused]]
                auto w = ::write(fd, &(n = 1), sizeof n);
              return asked >= true_from;
            }};
  }
};
}  // namespace

TEST_CASE(
    "a wait asks its interruption as it begins and when its descriptor is readable; each true takes the "
    "stop's next step",
    "[runner]") {
  const temp_fifo tf;
  isorun::runner::job_spec spec;
  spec.task = "hang_with_grandchild";
  spec.args = isorun::detail::encode_args(tf.path);
  spec.grace = std::chrono::hours(1);  // the task ignores SIGTERM: only the stop's second step ends it
  auto job = isorun::runner::job::start(std::move(spec));
  auto [worker, grandchild] = read_pids(tf.path);
  test_interruption i;
  // The second answer stops it (SIGTERM), the third kills it; nothing asks a fourth time.
  const auto& r = job->wait(i.ask(3, 2));
  CHECK(i.asked == 3);
  CHECK_FALSE(i.elsewhere);
  CHECK(r.status.kind == isorun::outcome_kind::cancelled);
  CHECK(r.status.exit.signal == SIGKILL);
  CHECK(process_gone(worker));
  CHECK(process_gone(grandchild));
}

TEST_CASE("a wait is not asked on a clock: a call that runs a while is asked once, as its wait begins", "[runner]") {
  char dir[] = "/tmp/isorun-quiet-XXXXXX";
  REQUIRE(::mkdtemp(dir));
  const std::string d = dir;
  REQUIRE(::mkfifo((d + "/pids").c_str(), 0600) == 0);
  REQUIRE(::mkfifo((d + "/go").c_str(), 0600) == 0);
  isorun::runner::job_spec spec;
  spec.task = "runs_until_told";
  spec.args = isorun::detail::encode_args(d);
  auto job = isorun::runner::job::start(std::move(spec));
  { std::ifstream(d + "/pids") >> std::ws; }
  // Told to return a while from now: a wait that looked on a clock (every 100 ms, as it did)
  // would ask several times meanwhile.
  std::thread teller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
    std::ofstream(d + "/go") << 7 << std::endl;
  });
  test_interruption i;
  const auto& r = job->wait(i.ask(1, 99));
  teller.join();
  CHECK(r.status.ok());
  CHECK(i.asked == 1);
  std::filesystem::remove_all(d);
}

TEST_CASE("a call interrupted while it waits for admission ends cancelled, without a worker", "[runner][admission]") {
  auto a = std::make_shared<isorun::runner::admission>(
      isorun::runner::admission::limits{.gpus = {}, .cpu_slots = 1, .name = "the test"});
  auto slot = a->admit({});  // the only CPU slot is taken
  auto spec = std::make_shared<isorun::runner::job_spec>();
  spec->task = "hang_with_grandchild";  // never started
  auto call = isorun::runner::queue_call(*a, nullptr, {}, spec, {});
  test_interruption i;
  const auto& r = call->wait(i.ask(2, 2));
  CHECK(i.asked == 2);
  CHECK(r.status.kind == isorun::outcome_kind::cancelled);
  CHECK_FALSE(call->started());
  CHECK(a->waiting() == 0);
}

TEST_CASE("dropping an unfinished async handle cancels the worker", "[runner]") {
  const temp_fifo tf;
  const std::string& fifo = tf.path;
  pid_t worker = 0, grandchild = 0;
  {
    auto call = isorun::isolated(hang_with_grandchild, {.grace = 100ms}).async(fifo);
    std::tie(worker, grandchild) = read_pids(fifo);
  }
  CHECK(process_gone(worker));
  CHECK(process_gone(grandchild));
}

TEST_CASE("killing the supervisor with SIGKILL takes its workers and their children down", "[runner]") {
  auto victim = start_victim({});
  int worker = 0, grandchild = 0;
  REQUIRE(std::fscanf(victim.out.get(), "%d %d", &worker, &grandchild) == 2);
  victim.out.reset();
  ::kill(victim.process.pid(), SIGKILL);
  CHECK(process_gone(worker));
  CHECK(process_gone(grandchild));
  CHECK(victim.process.reap().signal == SIGKILL);
}

namespace {
isorun::runner::job_result run_bad_worker(const std::string& mode,
                                          const std::vector<isorun::runner::gpu_info>& gpus = {}) {
  isorun::runner::job_spec spec;
  spec.task = "anything";
  spec.executable = ISORUN_BAD_WORKER;
  spec.extra_env = {"BAD_WORKER_MODE=" + mode};
  spec.gpus = gpus;
  spec.stderr_echo_fd = -1;
  auto job = isorun::runner::job::start(std::move(spec));
  return job->wait();
}
}  // namespace

TEST_CASE("misbehaving workers are classified and never crash the supervisor", "[runner]") {
  using k = isorun::outcome_kind;
  const int shm = isorun::test::shm_entries();
  {
    auto valid = run_bad_worker("valid");
    REQUIRE(valid.status.kind == k::success);
    CHECK(isorun::detail::to_result<std::string>(valid).value() == "ok");
  }
  {
    auto valid = run_bad_worker("inline_valid");  // a small result sent in `done`
    REQUIRE(valid.status.kind == k::success);
    CHECK(valid.sent_inline);
    CHECK(isorun::detail::to_result<std::string>(valid).value() == "ok");
  }
  const int fds = isorun::test::open_fds();  // after the first job filled the segment pool

  struct expectation {
    const char* mode;
    k kind;
    const char* says;
  };
  const expectation cases[] = {
      {"corrupt_checksum", k::invalid_result, "checksum mismatch"},
      {"bad_magic", k::invalid_result, "wrong magic"},
      {"oversize_claim", k::invalid_result, "exceeds the limit"},
      {"wrong_encoding", k::invalid_result, "different encoding"},
      {"garbage_control", k::invalid_result, "malformed control message"},
      {"oversized_control", k::invalid_result, "exceeds the 65536-byte limit"},
      {"inline_corrupt_checksum", k::invalid_result, "checksum mismatch"},
      {"inline_oversize_claim", k::invalid_result, "worker result rejected"},
      {"inline_streamed_magic", k::invalid_result, "wrong magic"},
      {"wrong_devices", k::invalid_result, "handshake mismatch"},
      {"wrong_pid", k::invalid_result, "handshake mismatch"},
      {"exit_without_result", k::crashed, "without delivering a result"},
  };
  for (const auto& c : cases) {
    INFO(c.mode);
    auto r = run_bad_worker(c.mode);
    CHECK(r.status.kind == c.kind);
    CHECK_THAT(r.status.message, Catch::Contains(c.says));
    CHECK(r.payload.empty());
  }
  {
    // A checksum-valid payload that does not decode as the declared type.
    auto garbage = run_bad_worker("garbage_payload");
    REQUIRE(garbage.status.kind == k::success);
    auto decoded = isorun::detail::to_result<std::string>(garbage);
    CHECK(decoded.status().kind == k::invalid_result);
    CHECK_THROWS_AS(decoded.value(), isorun::invalid_result);
  }
  // The result was complete before the crash: it counts.
  CHECK(run_bad_worker("crash_after_done").status.kind == k::success);

  CHECK(isorun::test::shm_entries() == shm);
  CHECK(isorun::test::open_fds() == fds);
}

TEST_CASE("many calls, failures included, leave no descriptors, children or /dev/shm entries", "[runner]") {
  auto ok = isorun::isolated(concat);
  auto bad = isorun::isolated(throws);
  auto crash = isorun::isolated(aborts);
  ok("warm", "up", 1);  // first call creates the segment pool
  const int fds = isorun::test::open_fds();
  for (int i = 0; i < 20; ++i) {
    CHECK(ok("a", "b", 2) == "abab");
    CHECK_FALSE(bad.try_call(i).ok());
    CHECK(crash.try_call(0).status().kind == isorun::outcome_kind::crashed);
  }
  CHECK(isorun::test::open_fds() == fds);
  CHECK(::waitpid(-1, nullptr, WNOHANG) == -1);
  CHECK(isorun::test::shm_entries() == 0);
}

namespace {
// Children of this process that have exited but were not reaped.
int zombie_children() {
  int n = 0;
  const std::string self = std::to_string(::getpid());
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    std::ifstream in(e.path() / "stat");
    std::string line;
    if (!std::getline(in, line)) continue;
    // pid (comm) state ppid ...: the comm may hold spaces, so read after its closing parenthesis.
    std::istringstream rest(line.substr(line.rfind(')') + 1));
    std::string state, ppid;
    rest >> state >> ppid;
    n += state == "Z" && ppid == self;
  }
  return n;
}

std::size_t resident_kib() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stoul(line.substr(6));
  return 0;
}
}  // namespace

TEST_CASE("10,000 trivial tasks, 64 in flight: no descriptor, memory, zombie or /dev/shm growth",
          "[runner][large][load]") {
  const auto f = isorun::isolated(scale, {.echo_stderr = false});
  auto run = [&](int n) {
    std::deque<isorun::call_handle<std::vector<double>>> in_flight;
    int ok = 0;
    for (int i = 0; i < n; ++i) {
      if (in_flight.size() == 64) {
        ok += in_flight.front().try_get().ok();
        in_flight.pop_front();
      }
      in_flight.push_back(f.async(std::vector<double>{double(i)}, 2.0));
    }
    for (auto& h : in_flight) ok += h.try_get().ok();
    return ok;
  };
  REQUIRE(run(500) == 500);  // pools, threads and caches reach their steady size first
  // Idle pooled segments are a bounded cache whose size follows how the calls overlapped: they
  // are let go before each count, so that only what a call leaves behind is counted.
  auto& segments = isorun::serialization::segment_pool::instance();
  segments.clear();
  const int fds = isorun::test::open_fds(), shm = isorun::test::shm_entries();
  const std::size_t rss = resident_kib();
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(run(10000) == 10000);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  segments.clear();
  CHECK(isorun::test::open_fds() == fds);
  CHECK(isorun::test::shm_entries() == shm);
  CHECK(zombie_children() == 0);
  const std::size_t grown = resident_kib() > rss ? resident_kib() - rss : 0;
  CHECK(grown < 16 * 1024);  // KiB: steady state, not a leak per task (10,000 x 2 KiB would be 20 MiB)
  WARN("load: 10,000 tasks, 64 in flight, " << static_cast<int>(10000 / seconds) << " tasks/s; fds " << fds << " -> "
                                            << isorun::test::open_fds() << ", RSS +" << grown << " KiB");
}

TEST_CASE(
    "a result segment that cannot grow (file size limit): a clear error, nothing left behind, and it works again after",
    "[runner][faults]") {
  // isorun's segments are anonymous memory files, never in /dev/shm; what stops one growing is
  // memory, or a file size limit, which the worker inherits. (A worker dies of SIGXFSZ by
  // default there: it must report EFBIG instead.)
  isorun::stop_standby();
  auto& pool = isorun::serialization::segment_pool::instance();
  REQUIRE(isorun::isolated(pid_and_calls)(0).ends_with(" 1"));
  pool.clear();
  const int fds = isorun::test::open_fds();
  rlimit old{};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
  for (auto task : {make_pattern, fill_in_place}) {
    pool.clear();  // no segment that has the room already
    rlimit low = old;
    low.rlim_cur = 1_MiB;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &low) == 0);
    std::string what;
    try {
      isorun::isolated(task)(4_MiB, 1);
    } catch (const isorun::error& e) {
      what = e.what();
    }
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &old) == 0);
    CHECK_THAT(what, Catch::Contains("File too large"));
    pool.clear();
    CHECK(isorun::test::open_fds() == fds);
    const isorun::blob b = isorun::isolated(task)(4_MiB, 1);  // the limit lifted: it works again
    CHECK(b.size() == 4_MiB);
  }
  CHECK(isorun::test::shm_entries() == 0);
}

TEST_CASE("the process limit is reached while a worker starts: a clear error, nothing leaked, and it works again after",
          "[runner][faults]") {
  // RLIMIT_NPROC binds every user but root, so as root the helper runs as user nobody.
  std::string exe = ISORUN_NPROC_LIMIT;
  std::vector<std::string> args;
  if (::geteuid() == 0) {
    args = {"--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", exe};
    exe = "/usr/bin/setpriv";
    if (isorun::test::run_captured(
            exe, {"--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/test", "-x", ISORUN_NPROC_LIMIT})
            .code != 0) {
      WARN("the process-limit check runs as user nobody, who cannot reach " << ISORUN_NPROC_LIMIT
                                                                            << " (build in a folder others can read)");
      return;
    }
  }
  const auto r = isorun::test::run_captured(exe, args);
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  std::map<std::string, std::string> said;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);)
    if (const auto colon = line.find(": "); colon != std::string::npos)
      said[line.substr(0, colon)] = line.substr(colon + 2);
  CHECK(said.count("started") == 0);
  CHECK_THAT(said["refused"],
             Catch::Contains("cannot start") && Catch::Contains("the process limit, ulimit -u, is reached"));
  const auto fds = said["fds"];
  CHECK(fds.substr(0, fds.find(' ')) == fds.substr(fds.find(' ') + 1));
  CHECK(said["children"] == "none");
  CHECK(said["after"] == "16");
}

TEST_CASE("descriptors run out while a worker starts: a clear error, nothing leaked, and it works again after",
          "[runner][faults]") {
  isorun::stop_standby();
  auto& pool = isorun::serialization::segment_pool::instance();
  REQUIRE(isorun::isolated(pid_and_calls)(0).ends_with(" 1"));
  pool.clear();  // idle pooled segments hold descriptors too: count from none
  const int fds = isorun::test::open_fds();
  rlimit old{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &old) == 0);
  // Each step of a start that needs a descriptor fails in turn: the cancel eventfd, the
  // segments, the control socket, the stderr pipe, /dev/null for stdin.
  for (rlim_t extra = 0; extra < 8; ++extra) {
    rlimit low = old;
    low.rlim_cur = static_cast<rlim_t>(fds) + extra;
    REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
    std::string what;
    try {
      isorun::isolated(pid_and_calls)(0);
    } catch (const isorun::internal_error& e) {
      what = e.what();
    }
    REQUIRE(::setrlimit(RLIMIT_NOFILE, &old) == 0);
    INFO("with " << extra << " descriptors to spare");
    CHECK_THAT(what, Catch::Contains("Too many open files"));
    pool.clear();
    CHECK(isorun::test::open_fds() == fds);
  }
  CHECK(isorun::isolated(pid_and_calls)(0).ends_with(" 1"));
  CHECK(isorun::test::shm_entries() == 0);
}
