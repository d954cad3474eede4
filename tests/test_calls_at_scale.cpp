// Calls in numbers: queued calls are records, running ones a few descriptors in the process's
// watcher; no thread per call, streaming maps with a window, cancels that leave nothing behind.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "isorun/runner/executor.hpp"
#include "isorun/runner/map.hpp"
#include "runner_tasks.hpp"
#include "test_support.hpp"

using namespace runner_tests;
using namespace std::chrono_literals;

namespace {

// Threads of this process now.
std::size_t threads_here() {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

// A folder with the FIFOs runs_until_told reads and writes.
struct told_dir {
  std::string path;
  told_dir() {
    char d[] = "/tmp/isorun-scale-XXXXXX";
    REQUIRE(::mkdtemp(d));
    path = d;
    REQUIRE(::mkfifo((path + "/pids").c_str(), 0600) == 0);
    REQUIRE(::mkfifo((path + "/go").c_str(), 0600) == 0);
  }
  ~told_dir() { std::filesystem::remove_all(path); }
  pid_t started() const {
    pid_t pid = 0;
    std::ifstream(path + "/pids") >> pid;
    return pid;
  }
  void tell(int value) const { std::ofstream(path + "/go") << value << std::endl; }
};

}  // namespace

TEST_CASE("calls queued behind a running one cost no thread each, and are cancelled at once", "[runner][scale]") {
  const std::size_t before = threads_here();
  const told_dir d;
  std::optional<isorun::executor> pool(std::in_place,
                                       isorun::executor_options{.cpu_slots = 1, .call = {.echo_stderr = false}});
  auto running = pool->submit(runs_until_told, d.path);
  const pid_t first = d.started();
  std::vector<isorun::call_handle<int>> queued;
  for (int i = 0; i < 2000; ++i) queued.push_back(pool->submit(runs_until_told, d.path));
  CHECK(pool->waiting() == 2000);
  // The watcher's thread (and a standby filler, a stream's copiers, at most): not one per call.
  CHECK(threads_here() <= before + 4);
  pool->shutdown(true);  // the waiting ones end cancelled, without a worker
  CHECK(pool->waiting() == 0);
  std::size_t cancelled = 0;
  for (auto& c : queued) cancelled += c.try_get().status().kind == isorun::outcome_kind::cancelled && !c.started();
  CHECK(cancelled == 2000);
  d.tell(5);
  CHECK(running.get() == 5);
  pool.reset();  // waits for nothing: all have ended
  CHECK(isorun::test::process_gone(first));
}

TEST_CASE("a streaming map keeps a window of calls submitted and takes its inputs as calls end", "[runner][scale]") {
  isorun::executor pool({.cpu_slots = 2, .call = {.echo_stderr = false}});
  const std::size_t window = pool.window();
  std::vector<point> inputs(3 * window + 5);
  std::size_t given = 0, most_ahead = 0, taken = 0;
  bool in_order = true;
  pool.map_each(
      echo_point,
      [&]() -> const point* {
        if (given == inputs.size()) return nullptr;
        most_ahead = std::max(most_ahead, given - taken);
        inputs[given].x = static_cast<int>(given);
        return &inputs[given++];
      },
      [&](std::size_t index, isorun::result<point> r) {
        in_order = in_order && index == taken && r.value().x == static_cast<int>(index) + 1;
        ++taken;
      });
  CHECK(taken == inputs.size());
  CHECK(in_order);
  CHECK(most_ahead <= window);
}

TEST_CASE("a streaming map whose inputs fail cancels the calls it has in flight and leaves nothing",
          "[runner][scale]") {
  isorun::executor pool({.cpu_slots = 1, .call = {.echo_stderr = false}});
  const told_dir d;
  std::vector<std::string> dirs(3, d.path);
  std::size_t given = 0;
  pid_t first = 0;
  CHECK_THROWS_WITH(pool.map_each(
                        runs_until_told,
                        [&]() -> const std::string* {
                          if (given == 2) {
                            first = d.started();  // the first call runs, the second waits: then the inputs fail
                            throw std::runtime_error("no more inputs");
                          }
                          return &dirs[given++];
                        },
                        [](std::size_t, isorun::result<int>) {}),
                    "no more inputs");
  CHECK(first > 0);
  CHECK(isorun::test::process_gone(first));  // cancelled, and waited for
  CHECK(pool.waiting() == 0);
  CHECK(pool.running() == 0);
}

TEST_CASE("a worker flooding its stderr does not starve the other calls the watcher holds", "[runner][scale]") {
  isorun::executor pool({.cpu_slots = 2, .call = {.echo_stderr = false}});
  const told_dir d;
  auto flood = pool.submit(floods_until_told, d.path);
  // Both run at once: the second ends, and is handed over, while the first still writes.
  auto other = pool.submit(pid_and_calls, 0);
  CHECK(other.get().ends_with(" 1"));
  CHECK_FALSE(flood.wait_for(0ms));
  d.tell(1);
  CHECK(flood.get() > 0);
}

TEST_CASE("a queued call that cannot start for want of descriptors fails alone, with the reason", "[runner][scale]") {
  auto& segments = isorun::serialization::segment_pool::instance();
  isorun::executor pool({.cpu_slots = 1, .call = {.echo_stderr = false}});
  const told_dir d;
  auto running = pool.submit(runs_until_told, d.path);
  const pid_t first = d.started();
  REQUIRE(first > 0);
  auto starved = pool.submit(pid_and_calls, 0);  // queued: it starts (on the watcher) as the first ends
  const int go = ::open((d.path + "/go").c_str(), O_WRONLY | O_CLOEXEC);
  REQUIRE(go >= 0);
  segments.clear();  // idle pooled segments would serve the start without a new descriptor
  rlimit old{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &old) == 0);
  rlimit low = old;
  // (Counted as they are: open_fds() would wait for the watcher to hold nothing.)
  std::size_t open_now = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++open_now;
  low.rlim_cur = static_cast<rlim_t>(open_now - 1);  // (less the iterator's own)
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
  REQUIRE(::write(go, "7\n", 2) == 2);
  ::close(go);  // one descriptor to spare: the start needs several
  std::string why;
  try {
    starved.get();
  } catch (const std::exception& e) {
    why = e.what();
  }
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &old) == 0);
  CHECK(running.get() == 7);
  CHECK_THAT(why, Catch::Contains("Too many open files"));
  // The next call runs, and nothing is left behind.
  CHECK(pool.submit(pid_and_calls, 0).get().ends_with(" 1"));
  CHECK(isorun::test::shm_entries() == 0);
}
