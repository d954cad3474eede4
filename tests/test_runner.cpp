// Runner: real worker processes, real shared memory. The tasks below run in re-executed copies
// of this binary (see catch_main.cpp).
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <filesystem>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "isorun/alloc/device_buffer.hpp"
#include "isorun/serialization/result_stream.hpp"
#include "isorun/isorun.hpp"
#include "isorun/runner/job.hpp"
#include "isorun/runner/containment.hpp"
#include "isorun/runner/process.hpp"
#include "isorun/runner/launcher.hpp"
#include "isorun/runner/standby.hpp"
#include "isorun/serialization/segment_pool.hpp"
#include "test_support.hpp"

using namespace std::chrono_literals;
using namespace isorun::literals;
using isorun::test::process_gone;

// Before main: the API's inventory is read once, from this simulated 2-GPU machine.
static const int simulated_gpus = (::setenv("ISORUN_SIMULATE_GPUS", "2x16G", 1), 0);

namespace {

struct point {
  int x = 0;
  double y = 0;
  std::string label;
  std::vector<int> tags;
  template <class A>
  void serialize(A& ar) {
    ar(CEREAL_NVP(x), CEREAL_NVP(y), CEREAL_NVP(label), CEREAL_NVP(tags));
  }
  bool operator==(const point&) const = default;
};

point echo_point(const point& p) {
  point q = p;
  q.x += 1;
  q.label += "!";
  q.tags.push_back(static_cast<int>(q.tags.size()));
  return q;
}

std::string concat(std::string a, const std::string& b, int times) {
  std::string out;
  for (int i = 0; i < times; ++i) out += a + b;
  return out;
}

std::vector<double> scale(const std::vector<double>& v, double k) {
  std::vector<double> out(v);
  for (double& x : out) x *= k;
  return out;
}

std::uint64_t pattern_word(std::uint64_t i, std::uint64_t seed) { return (i + seed) * 0x9E3779B97F4A7C15ULL; }

isorun::blob make_pattern(std::uint64_t size, std::uint64_t seed) {
  isorun::blob b(size);
  auto* words = reinterpret_cast<std::uint64_t*>(b.mutable_data());
  for (std::uint64_t i = 0; i < size / 8; ++i) words[i] = pattern_word(i, seed);
  return b;
}

// make_pattern, then the first 256 bytes name the mapping that held the blob in the worker
// (as /proc/self/maps does): a memfd where the worker placed it in the result segment.
isorun::blob locate_pattern(std::uint64_t size, std::uint64_t seed) {
  isorun::blob b = make_pattern(size, seed);
  const std::string where = isorun::test::mapping_of(b.data()).substr(0, 255);
  std::memcpy(b.mutable_data(), where.c_str(), where.size() + 1);
  return b;
}

// Keeps a large blob alive past the task, as a cache would, and returns a view into it of another
// size: the kept blob lay where the result goes, and must keep its bytes while the view (which
// reads from it) is encoded there.
isorun::blob view_of_kept(std::uint64_t size, std::uint64_t seed) {
  static isorun::blob kept;
  kept = make_pattern(size, seed);
  return isorun::blob(nullptr, kept.data() + 4096, size - 4096);
}

// Makes a large blob, then forks a child that overwrites it and exits; returns the blob with the
// name of the mapping that held it in its first 256 bytes (as locate_pattern). A child's writes are
// its own after fork(), even to a blob that lay in the shared result segment.
isorun::blob forked_writer(std::uint64_t size, std::uint64_t seed) {
  isorun::blob b = make_pattern(size, seed);
  const pid_t child = ::fork();
  if (child < 0) throw std::runtime_error("fork failed");
  if (child == 0) {
    std::memset(b.mutable_data(), 0, b.size());
    ::_exit(0);
  }
  int status = 0;
  if (::waitpid(child, &status, 0) != child || !WIFEXITED(status)) throw std::runtime_error("the child failed");
  const std::string where = isorun::test::mapping_of(b.data()).substr(0, 255);
  std::memcpy(b.mutable_data(), where.c_str(), where.size() + 1);
  return b;
}

// Two large blobs alive at once, one returned: only one can lie where the result goes.
isorun::blob one_of_two(std::uint64_t size, std::uint64_t seed, bool first) {
  isorun::blob a = make_pattern(size, first ? seed : seed + 1);
  isorun::blob b = make_pattern(size, first ? seed + 1 : seed);
  return first ? std::move(a) : std::move(b);
}

// Writes its result where the result will be: nothing is copied on either side.
isorun::blob fill_in_place(std::uint64_t size, std::uint64_t seed) {
  isorun::blob b = isorun::this_worker().output_blob(size);
  auto* words = reinterpret_cast<std::uint64_t*>(b.mutable_data());
  for (std::uint64_t i = 0; i < size / 8; ++i) words[i] = pattern_word(i, seed);
  return b;
}

struct wrapped {
  int tag = 0;
  isorun::blob bytes;
  template <class A>
  void serialize(A& ar) {
    ar(tag, bytes);
  }
};

// output_blob in a result that is not a bare blob: an ordinary buffer, still correct.
wrapped wrap_in_place(std::uint64_t size) {
  wrapped w{7, isorun::this_worker().output_blob(size)};
  std::memset(w.bytes.mutable_data(), 0x5a, size);
  return w;
}

// Byte `i` of the pattern make_pattern writes (also past the last whole word).
std::byte pattern_byte(std::uint64_t i, std::uint64_t seed) {
  const std::uint64_t w = pattern_word(i / 8, seed);
  std::byte b[8];
  std::memcpy(b, &w, 8);
  return b[i % 8];
}

// Makes `size` bytes of the pattern in the worker's device memory (on a simulated GPU the host
// cannot touch it; in a CPU worker it is host memory), filled piece by piece as a kernel would,
// and returns them through the result stream.
isorun::blob from_device(std::uint64_t size, std::uint64_t seed) {
  auto& w = isorun::this_worker();
  isorun::alloc::device_buffer d(w.allocator(), size);
  std::vector<std::byte> piece(8 << 20);
  for (std::uint64_t off = 0; off < size; off += piece.size()) {
    const std::uint64_t n = std::min<std::uint64_t>(piece.size(), size - off);
    for (std::uint64_t i = 0; i < n; ++i) piece[i] = pattern_byte(off + i, seed);
    d.copy_from_host(piece.data(), n, off);
  }
  return w.device_result(d);
}

// Misuses of device_result: a stand-in returned without its stream, a second stream.
isorun::blob streams_wrongly(int how) {
  if (how == 0) return isorun::blob::streamed(10);
  isorun::alloc::device_buffer d(isorun::this_worker().allocator(), 64);
  d.copy_from_host(std::vector<char>(64, 'x').data(), 64);
  auto first = isorun::this_worker().device_result(d);
  return isorun::this_worker().device_result(d);
}

std::uint64_t sum_blob(const isorun::blob& b) {
  std::uint64_t s = 0;
  for (std::byte c : b.bytes()) s += static_cast<std::uint8_t>(c);
  return s;
}

struct custom_failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

int throws(int which) {
  if (which == 1) throw custom_failure("custom failure 42");
  throw std::runtime_error("bad value " + std::to_string(which));
}

int segfaults(int) {
  std::fprintf(stderr, "about to crash\n");
  std::fflush(stderr);
  ::raise(SIGSEGV);
  return 0;
}

int aborts(int) { std::abort(); }

int exits_early(int code) { std::_Exit(code); }

// "pid calls": which process ran it, and how many calls that process has served.
std::string pid_and_calls(int) {
  static int calls = 0;
  return std::to_string(::getpid()) + " " + std::to_string(++calls);
}

int sleeps_long(int) {
  for (;;) ::pause();
}

std::string visible_devices(int) {
  const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
  const char* o = std::getenv("CUDA_DEVICE_ORDER");
  const auto& w = isorun::this_worker();
  return std::string(v ? v : "<unset>") + "|" + (o ? o : "<unset>") + "|" + std::to_string(w.device()) + "|" +
         std::to_string(w.mem_limit());
}

// A worker on several GPUs: what it sees, each device's allocator and cap, and `each` bytes held on
// every device at once (more than one cap in all: the cap is per device). An allocation past a
// cap fails with that device's OOM message.
std::string on_devices(std::uint64_t each) {
  auto& w = isorun::this_worker();
  const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
  std::string out = std::string(v ? v : "<unset>") + "|" + isorun::to_string(w.kind());
  std::vector<isorun::alloc::device_buffer> held;
  for (std::size_t i = 0; i < w.devices().size(); ++i) {
    const auto& d = w.devices()[i];
    out += "|" + std::to_string(d.index) + "@" + std::to_string(d.ordinal) + ":" + d.uuid + ":" +
           std::to_string(w.allocator(i).cap() >> 30) + "G";
    held.emplace_back(w.allocator(i), each);
  }
  try {
    w.allocator(w.devices().size());
    out += "|allocator past the last device";
  } catch (const std::out_of_range&) {
  }
  return out + "|peak " + std::to_string(w.peaks().first >> 30) + "G";
}

// Starts a grandchild, ignores SIGTERM (so stopping must escalate to SIGKILL), reports both pids
// through the FIFO at `path`, then waits forever.
int hang_with_grandchild(const std::string& path) {
  pid_t g = ::fork();
  if (g == 0) {
    for (;;) ::pause();
  }
  ::signal(SIGTERM, SIG_IGN);
  std::ofstream(path) << ::getpid() << " " << g << std::endl;
  for (;;) ::pause();
}

void no_result(int) {}

// What a task finds when it starts: whether its allocator exists already (a warm worker made it
// while waiting), the device it sees, and its allocator's cap.
std::string warm_state(int) {
  auto& w = isorun::this_worker();
  const bool ready = w.has_allocator();
  const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
  return std::string(ready ? "ready" : "cold") + "|" + (v ? v : "<unset>") + "|" + std::to_string(w.allocator().cap());
}

// Leaves its process group (setsid) with the result segment's descriptor, then waits for the
// worker's exit and for `dir`/go, and rewrites every result segment it holds. Returns its pid
// and the text it should have left alone.
std::string escapes_to_rewrite(const std::string& dir) {
  int pid_pipe[2], exit_pipe[2];
  if (::pipe(pid_pipe) != 0 || ::pipe(exit_pipe) != 0) throw std::runtime_error("pipe");
  if (::fork() == 0) {
    ::setsid();
    ::close(exit_pipe[1]);
    const pid_t self = ::getpid();
    [[maybe_unused]] auto w = ::write(pid_pipe[1], &self, sizeof self);
    char c;
    while (::read(exit_pipe[0], &c, 1) > 0) {  // EOF: the worker is gone
    }
    { std::ifstream go(dir + "/go"); }
    for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
      const int fd = std::stoi(entry.path().filename().string());
      std::uint64_t magic = 0;
      if (::pread(fd, &magic, sizeof magic, 0) == sizeof magic && magic == isorun::serialization::result_magic)
        [[maybe_unused]] auto n = ::pwrite(fd, "XXXXXXXX", 8, 200);
    }
    ::_exit(0);
  }
  ::close(exit_pipe[0]);  // the write end stays open in this process until it exits
  pid_t child = 0;
  if (::read(pid_pipe[0], &child, sizeof child) != sizeof child) throw std::runtime_error("no pid");
  return std::to_string(child) + " " + std::string(1000, 'a');
}

// Leaves a process outside the worker's group holding the worker's descriptors, the result
// segment's among them. Once the FIFO `dir`/go is opened, it tries to change the result segment
// (a write, a writable mapping, a resize) and writes "refused changed" to the FIFO `dir`/report.
isorun::blob escapee(const std::string& dir) {
  int left[2];  // the child says it has left the worker's group before the worker goes on
  if (::pipe(left) != 0) throw std::runtime_error("pipe");
  if (::fork() == 0) {
    ::setsid();
    ::close(left[0]);
    ::close(left[1]);  // the worker's read returns
    { std::ifstream go(dir + "/go"); }  // blocks until the test opens it
    int refused = 0, changed = 0;
    for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
      const int fd = std::stoi(entry.path().filename().string());
      std::uint64_t magic = 0;
      if (::pread(fd, &magic, sizeof magic, 0) != sizeof magic || magic != isorun::serialization::result_magic) continue;
      const char x = 'X';
      (::pwrite(fd, &x, 1, 100) == 1 ? changed : refused) += 1;
      void* m = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      (m != MAP_FAILED ? changed : refused) += 1;
      (::ftruncate(fd, 0) == 0 ? changed : refused) += 1;
    }
    std::ofstream(dir + "/report") << refused << " " << changed << std::endl;
    ::_exit(0);
  }
  // Otherwise the worker could exit, and its group be killed, before the child left it.
  ::close(left[1]);
  char none;
  [[maybe_unused]] auto n = ::read(left[0], &none, 1);
  ::close(left[0]);
  isorun::blob b = isorun::this_worker().output_blob(4096);  // mapped after the fork: only the fd escaped
  std::memset(b.mutable_data(), 'a', b.size());
  return b;
}

// Its result area is still mapped writable by a child when it reports: the result cannot be
// sealed, so it is handed over only after the worker's group is gone.
isorun::blob clings(int) {
  isorun::blob b = isorun::this_worker().output_blob(4096);
  std::memset(b.mutable_data(), 'b', b.size());
  if (::fork() == 0)
    for (;;) ::pause();
  return b;
}

// A result whose destructor, in the worker, waits until the FIFO `dir`/free is opened, then
// leaves the file `dir`/freed behind. The supervisor's decoded copy does neither.
struct slow_to_free {
  std::string dir;
  bool in_worker = false;  // not sent
  slow_to_free() = default;
  explicit slow_to_free(std::string d) : dir{std::move(d)}, in_worker{true} {}
  slow_to_free(slow_to_free&& o) noexcept : dir{std::move(o.dir)}, in_worker{std::exchange(o.in_worker, false)} {}
  slow_to_free& operator=(slow_to_free&&) = delete;
  ~slow_to_free() {
    if (!in_worker) return;
    { std::ifstream wait(dir + "/free"); }
    std::ofstream(dir + "/freed") << "freed\n";
  }
  template <class Archive>
  void serialize(Archive& ar) {
    ar(dir);
  }
};

slow_to_free frees_slowly(const std::string& dir) { return slow_to_free(dir); }

// The same with a large argument, so that its request segment is large.
slow_to_free frees_slowly_after_large_request(const std::string& dir, const isorun::blob& /*ballast*/) {
  return slow_to_free(dir);
}

int prints(const std::string& text) {
  std::printf("%s\n", text.c_str());
  return 0;
}

// Holds `mib` MiB from the worker's capped allocator.
std::uint64_t hold(int mib) {
  auto& a = isorun::this_worker().allocator();
  std::vector<isorun::alloc::device_buffer> held;
  for (int i = 0; i < mib; ++i) held.emplace_back(a, 1u << 20);
  return a.cap();
}

}  // namespace

ISORUN_TASK(echo_point);
ISORUN_TASK(concat);
ISORUN_TASK(scale);
ISORUN_TASK(make_pattern);
ISORUN_TASK(sum_blob);
ISORUN_TASK(fill_in_place);
ISORUN_TASK(locate_pattern);
ISORUN_TASK(view_of_kept);
ISORUN_TASK(one_of_two);
ISORUN_TASK(forked_writer);
ISORUN_TASK(from_device);
ISORUN_TASK(streams_wrongly);
ISORUN_TASK(wrap_in_place);
ISORUN_TASK(throws);
ISORUN_TASK(segfaults);
ISORUN_TASK(aborts);
ISORUN_TASK(exits_early);
ISORUN_TASK(visible_devices);
ISORUN_TASK(on_devices);
ISORUN_TASK(pid_and_calls);
ISORUN_TASK(sleeps_long);
ISORUN_TASK(hang_with_grandchild);
ISORUN_TASK(no_result);
ISORUN_TASK(hold);
ISORUN_TASK(warm_state);
ISORUN_TASK(prints);
ISORUN_TASK(escapee);
ISORUN_TASK(escapes_to_rewrite);
ISORUN_TASK(clings);
ISORUN_TASK(frees_slowly);
ISORUN_TASK(frees_slowly_after_large_request);

namespace {

// Reads "WORKER GRANDCHILD" from a FIFO written by hang_with_grandchild.
std::pair<pid_t, pid_t> read_pids(const std::string& fifo) {
  std::ifstream in(fifo);  // blocks until the task opens it for writing
  long w = 0, g = 0;
  in >> w >> g;
  return {static_cast<pid_t>(w), static_cast<pid_t>(g)};
}

// A FIFO in a fresh temporary folder, removed with it at the end of the test.
struct temp_fifo {
  std::string dir, path;
  temp_fifo() {
    char tmpl[] = "/tmp/isorun-test-XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    dir = tmpl;
    path = dir + "/pids";
    REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
  }
  ~temp_fifo() {
    ::unlink(path.c_str());
    ::rmdir(dir.c_str());
  }
};

}  // namespace

TEST_CASE("structs, strings and vectors round-trip through a worker", "[runner]") {
  auto f = isorun::isolated(echo_point);
  point p{41, 2.5, "hi", {7, 8}};
  point q = f(p);
  CHECK(q == point{42, 2.5, "hi!", {7, 8, 2}});

  CHECK(isorun::isolated(concat)("ab", "c", 3) == "abcabcabc");
  CHECK(isorun::isolated(scale)(std::vector<double>{1, -2, 3.5}, 2.0) == std::vector<double>{2, -4, 7});
}

TEST_CASE("a 256 MiB blob result arrives intact and is read in place", "[runner]") {
  const std::uint64_t size = 256_MiB;
  isorun::blob b = isorun::isolated(make_pattern)(size, 7);
  REQUIRE(b.size() == size);
  CHECK(b.is_view());  // aliases the shared-memory segment: no copy on the receiving side
  const auto* words = reinterpret_cast<const std::uint64_t*>(b.data());
  std::uint64_t mismatches = 0;
  for (std::uint64_t i = 0; i < size / 8; ++i) mismatches += words[i] != pattern_word(i, 7);
  CHECK(mismatches == 0);
}

TEST_CASE("blob results of changing sizes arrive intact through a segment mapped ahead of them", "[runner]") {
  // A CPU worker with a blob result maps its pooled segment, as large as an earlier result made
  // it, while the task runs: the next result may be smaller, larger (the mapping grows), or
  // written in place into it.
  auto intact = [](const isorun::blob& b, std::uint64_t size, std::uint64_t seed) {
    if (b.size() != size) return false;
    const auto* words = reinterpret_cast<const std::uint64_t*>(b.data());
    for (std::uint64_t i = 0; i < size / 8; ++i)
      if (words[i] != pattern_word(i, seed)) return false;
    return true;
  };
  std::uint64_t seed = 1;
  for (std::uint64_t size : {96_MiB, 40_MiB, 160_MiB, 8_MiB}) {
    INFO(size / 1_MiB << " MiB");
    CHECK(intact(isorun::isolated(make_pattern)(size, seed), size, seed));
    ++seed;
    CHECK(intact(isorun::isolated(fill_in_place)(size, seed), size, seed));
    ++seed;
  }
}

TEST_CASE("a large blob the task returns was made where the result goes: nothing is copied", "[runner]") {
  const std::uint64_t size = 48_MiB;
  // A first result of this size grows the pooled segment to hold it; placing never grows it.
  REQUIRE(isorun::isolated(make_pattern)(size, 1).size() == size);
  auto intact_after_name = [](const isorun::blob& b, std::uint64_t size, std::uint64_t seed) {
    std::uint64_t wrong = b.size() != size;
    for (std::uint64_t i = 256; i < b.size(); ++i) wrong += b.data()[i] != pattern_byte(i, seed);
    return wrong == 0;
  };
  auto where = [](const isorun::blob& b) { return std::string(reinterpret_cast<const char*>(b.data())); };

  const isorun::blob placed = isorun::isolated(locate_pattern)(size, 2);
  CHECK_THAT(where(placed), Catch::Contains("memfd:"));
  CHECK(intact_after_name(placed, size, 2));
  CHECK(placed.is_view());

  isorun::isolated_options off;
  off.env = {"ISORUN_PLACE_BLOBS=0"};  // pages of its own, copied by the encoder
  const isorun::blob copied = isorun::isolated(locate_pattern, off)(size, 3);
  CHECK(where(copied).empty());
  CHECK(intact_after_name(copied, size, 3));

  const isorun::blob small = isorun::isolated(locate_pattern)(1_MiB, 4);  // below 32 MiB: not placed
  CHECK(where(small).empty());
  CHECK(intact_after_name(small, 1_MiB, 4));
}

TEST_CASE("a blob placed in the result segment keeps its bytes when another result is written there, or a child writes it",
          "[runner]") {
  const std::uint64_t size = 48_MiB;
  REQUIRE(isorun::isolated(make_pattern)(size, 1).size() == size);
  // The result is a view into the kept blob: if the kept blob were not moved out of the segment
  // first, the encoder would copy the segment onto itself, 4 KiB further on.
  std::uint64_t wrong = 0;
  {
    const isorun::blob v = isorun::isolated(view_of_kept)(size, 5);
    REQUIRE(v.size() == size - 4096);
    for (std::uint64_t i = 0; i < v.size(); ++i) wrong += v.data()[i] != pattern_byte(4096 + i, 5);
    CHECK(wrong == 0);
  }  // its segment goes back to the pool, for the next call to place its blob in
  // A child the task forks writes a copy: the result is the task's bytes.
  const isorun::blob f = isorun::isolated(forked_writer)(size, 6);
  CHECK_THAT(std::string(reinterpret_cast<const char*>(f.data())), Catch::Contains("memfd:"));
  wrong = f.size() != size;
  for (std::uint64_t i = 256; i < f.size(); ++i) wrong += f.data()[i] != pattern_byte(i, 6);
  CHECK(wrong == 0);
  for (const bool first : {true, false}) {
    INFO((first ? "the first blob returned" : "the second blob returned"));
    const isorun::blob b = isorun::isolated(one_of_two)(size, 7, first);
    REQUIRE(b.size() == size);
    wrong = 0;
    for (std::uint64_t i = 0; i < size; ++i) wrong += b.data()[i] != pattern_byte(i, 7);
    CHECK(wrong == 0);
  }
}

TEST_CASE("blob arguments reach the task intact", "[runner]") {
  std::vector<std::uint8_t> bytes(1 << 20);
  std::uint64_t expected = 0;
  for (std::size_t i = 0; i < bytes.size(); ++i) expected += bytes[i] = static_cast<std::uint8_t>(i * 31);
  CHECK(isorun::isolated(sum_blob)(isorun::blob(bytes.data(), bytes.size())) == expected);
}

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
    CHECK(e.type_name() == "(anonymous namespace)::custom_failure");
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

TEST_CASE("void tasks return normally", "[runner]") { CHECK_NOTHROW(isorun::isolated(no_result)(1)); }

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
  int out[2];
  REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
  isorun::runner::spawn_options o;
  o.executable = ISORUN_VICTIM;
  for (char** e = environ; *e; ++e) o.env.emplace_back(*e);
  o.fds = {{1, out[1]}};
  auto victim = isorun::runner::spawn(o);
  ::close(out[1]);
  FILE* in = ::fdopen(out[0], "r");
  int worker = 0, grandchild = 0;
  REQUIRE(std::fscanf(in, "%d %d", &worker, &grandchild) == 2);
  std::fclose(in);
  ::kill(victim.pid(), SIGKILL);
  CHECK(process_gone(worker));
  CHECK(process_gone(grandchild));
  CHECK(victim.reap().signal == SIGKILL);
}

TEST_CASE("the worker sees exactly its assigned GPU (simulated inventory)", "[runner]") {
  REQUIRE(isorun::gpus().source == isorun::runner::gpu_inventory::origin::simulated);
  REQUIRE(isorun::gpus().gpus.size() == 2);
  CHECK(isorun::isolated(visible_devices, {.gpu = 1, .mem_limit = 6_GiB})(0) ==
        "GPU-sim-1|PCI_BUS_ID|1|" + std::to_string(6_GiB));
  CHECK(isorun::isolated(visible_devices)(0) == "|PCI_BUS_ID|-1|0");  // CPU: no GPU visible
}

TEST_CASE("a worker on several GPUs sees exactly them, in PCI bus order, each with its own capped allocator",
          "[runner][multi-gpu]") {
  REQUIRE(isorun::gpus().gpus.size() == 2);
  const std::string both = "GPU-sim-0,GPU-sim-1|simulated|0@0:GPU-sim-0:6G|1@1:GPU-sim-1:6G|peak 5G";
  // 5 GiB held on each of two GPUs under a 6 GiB cap: 10 GiB in all, within the cap on each.
  CHECK(isorun::isolated(on_devices, {.gpus = {1, 0}, .mem_limit = 6_GiB})(5_GiB) == both);
  CHECK(isorun::isolated(on_devices, {.gpu_count = 2, .mem_limit = 6_GiB})(5_GiB) == both);
  CHECK(isorun::isolated(on_devices, {.gpus = {1}, .mem_limit = 6_GiB})(1_GiB) ==
        "GPU-sim-1|simulated|1@0:GPU-sim-1:6G|peak 1G");
  // Past the cap on one device: that device's OOM, named.
  auto over = isorun::isolated(on_devices, {.gpus = {0, 1}, .mem_limit = 6_GiB}).try_call(7_GiB);
  REQUIRE_FALSE(over.ok());
  CHECK(over.status().kind == isorun::outcome_kind::out_of_memory);
  CHECK_THAT(over.status().message, Catch::Contains("--mem-limit 6144 MiB on GPU 0"));
  CHECK(over.status().device == "GPU-sim-0,GPU-sim-1");
}

TEST_CASE("impossible requests for several GPUs are usage errors and start nothing", "[runner][multi-gpu]") {
  const int fds = isorun::test::open_fds();
  CHECK_THROWS_WITH(isorun::isolated(on_devices, {.gpu_count = 3, .mem_limit = 1_GiB})(0),
                    Catch::Contains("3 GPUs asked for, but there are 2"));
  CHECK_THROWS_WITH(isorun::isolated(on_devices, {.gpus = {1, 1}})(0), Catch::Contains("GPU 1 is listed twice"));
  CHECK_THROWS_WITH(isorun::isolated(on_devices, {.gpus = {0, 2}})(0), Catch::Contains("GPU 2 does not exist"));
  CHECK_THROWS_WITH(isorun::isolated(on_devices, {.gpus = {0, 1}, .mem_limit = 17_GiB})(0), Catch::Contains("exceeds GPU 0"));
  CHECK_THROWS_WITH(isorun::isolated(on_devices, {.gpu = 0, .gpus = {1}})(0), Catch::Contains("give one of gpu"));
  CHECK(::waitpid(-1, nullptr, WNOHANG) == -1);  // no child was started
  CHECK(isorun::test::open_fds() == fds);
}

TEST_CASE("impossible requests are usage errors and start nothing", "[runner]") {
  const int fds = isorun::test::open_fds();
  CHECK_THROWS_AS(isorun::isolated(visible_devices, {.gpu = 5})(0), isorun::usage_error);
  CHECK_THROWS_WITH(isorun::isolated(visible_devices, {.gpu = 5})(0), Catch::Contains("available: 0..1"));
  CHECK_THROWS_WITH(isorun::isolated(visible_devices, {.gpu = 0, .mem_limit = 32_GiB})(0),
                    Catch::Contains("exceeds GPU 0"));
  int (*unregistered)(int) = [](int x) { return x; };
  CHECK_THROWS_WITH(isorun::isolated(unregistered)(1), Catch::Contains("not a registered task"));
  CHECK(::waitpid(-1, nullptr, WNOHANG) == -1);  // no child was started
  CHECK(isorun::test::open_fds() == fds);
}

TEST_CASE("a worker launched before its work waits for it, and takes its GPU from the assignment", "[runner]") {
  namespace r = isorun::runner;
  r::local_launcher launcher;
  {
    // Launched and never assigned: stopped with its handle, nothing left.
    r::launched_worker idle = launcher.launch({.label = "idle"});
    const pid_t pid = idle.process.pid();
    idle = {};
    CHECK(isorun::test::process_gone(pid));
  }
  r::launched_worker w = launcher.launch({.label = "standby"});
  const pid_t pid = w.process.pid();
  r::job_spec spec;
  spec.task = "visible_devices";
  spec.args = isorun::detail::encode_args(0);
  spec.gpus = {isorun::gpus().gpus.at(1)};
  spec.mem_limit = 6_GiB;
  auto job = r::job::start(std::move(spec), std::move(w));
  CHECK(job->pid() == pid);
  const auto& res = job->wait();
  REQUIRE(res.status.kind == isorun::outcome_kind::success);
  // It was exec'd seeing no GPU; the assignment brought GPU 1 and the cap.
  CHECK(isorun::detail::to_result<std::string>(res).value() == "GPU-sim-1|PCI_BUS_ID|1|" + std::to_string(6_GiB));
}

namespace {
// Standby pools are process-wide; other tests check that no child is left, so each standby test
// stops them when it ends.
struct stop_standby_at_end {
  ~stop_standby_at_end() { isorun::runner::stop_standby(); }
};
}  // namespace

TEST_CASE("a standby worker serves exactly one call, and calls take standby workers", "[runner][standby]") {
  stop_standby_at_end guard;
  auto& pool = isorun::runner::standby_for({.label = "standby"}, 2);  // the pool isolated() uses below
  std::set<std::string> pids;
  for (int i = 0; i < 6; ++i) {
    pool.fill();
    const auto waiting = pool.waiting_pids();
    REQUIRE(waiting.size() >= 2);
    const std::string got = isorun::isolated(pid_and_calls, {.standby = 2})(0);
    const auto space = got.find(' ');
    CHECK(got.substr(space + 1) == "1");                              // a process that ran nothing before
    CHECK(got.substr(0, space) == std::to_string(waiting.front()));  // the oldest waiting worker
    pids.insert(got.substr(0, space));
  }
  CHECK(pids.size() == 6);  // one process per call
}

TEST_CASE("a standby pool launches like any launcher: waiting workers for its spec, fresh ones otherwise",
          "[runner][standby]") {
  stop_standby_at_end guard;
  auto& pool = isorun::runner::standby_for({.label = "standby"}, 2);
  pool.fill();
  const auto waiting = pool.waiting_pids();
  // Another spec (an extra variable): launched now, the waiting workers untouched.
  auto other = pool.launch({.label = "other", .extra_env = {"ISORUN_TEST_OTHER=1"}});
  CHECK(std::find(waiting.begin(), waiting.end(), other.process.pid()) == waiting.end());
  CHECK(pool.waiting_pids() == waiting);
  // The pool's own spec, whatever the label: the oldest waiting worker.
  auto same = pool.launch({.label = "some_task"});
  CHECK(same.process.pid() == waiting.front());
}

TEST_CASE("a standby worker that died while waiting is skipped, and the call still runs", "[runner][standby]") {
  stop_standby_at_end guard;
  auto& pool = isorun::runner::standby_for({.label = "standby"}, 2);
  pool.fill();
  const pid_t victim = pool.waiting_pids().front();
  ::kill(victim, SIGKILL);
  REQUIRE(process_gone(victim));  // exited (a zombie until the pool reaps it)
  const std::string got = isorun::isolated(pid_and_calls, {.standby = 2})(0);
  CHECK(got.substr(0, got.find(' ')) != std::to_string(victim));
  CHECK(got.substr(got.find(' ') + 1) == "1");
}

TEST_CASE("a call on a standby worker can be cancelled as it is handed over", "[runner][standby]") {
  stop_standby_at_end guard;
  auto& pool = isorun::runner::standby_for({.label = "standby"}, 1);
  pool.fill();
  auto h = isorun::isolated(sleeps_long, {.standby = 1}).async(0);
  const pid_t pid = h.pid();
  h.cancel();
  auto r = h.try_get();
  CHECK(r.status().kind == isorun::outcome_kind::cancelled);
  CHECK(process_gone(pid));
}

TEST_CASE("a warm standby worker has its GPU and capped allocator ready before its task arrives", "[runner][standby]") {
  stop_standby_at_end guard;
  namespace r = isorun::runner;
  const isorun::isolated_options warm{.gpu = 1, .mem_limit = 6_GiB, .standby = 1, .warm_context = true};
  auto probe = r::job_spec_for("warm_state", isorun::serialization::encoding::binary, {}, {isorun::gpus().gpus.at(1)}, warm);
  auto& pool = r::standby_for(r::launch_spec_for(probe), 1);  // the pool isolated() uses below
  pool.fill();
  const pid_t waiting = pool.waiting_pids().front();
  CHECK(isorun::isolated(warm_state, warm)(0) == "ready|GPU-sim-1|" + std::to_string(6_GiB));
  CHECK(isorun::test::process_gone(waiting));  // it served that call and exited

  // Another cap cannot use a worker prepared for this one: a worker is launched for it, and the
  // prepared one keeps waiting.
  pool.fill();
  const auto before = pool.waiting_pids();
  CHECK(isorun::isolated(warm_state, {.gpu = 1, .mem_limit = 4_GiB})(0) == "cold|GPU-sim-1|" + std::to_string(4_GiB));
  CHECK(pool.waiting_pids() == before);

  // A worker prepared for one GPU refuses an assignment for another (the supervisor never makes
  // one; a worker checks anyway): it stops, and the job is classified, not run on the wrong GPU.
  r::local_launcher launcher;
  auto on_gpu_0 = launcher.launch(r::launch_spec_for(r::job_spec_for(
      "warm_state", isorun::serialization::encoding::binary, {}, {isorun::gpus().gpus.at(0)}, warm)));
  auto spec = r::job_spec_for("warm_state", isorun::serialization::encoding::binary, isorun::detail::encode_args(0),
                              {isorun::gpus().gpus.at(1)}, warm);
  spec.stderr_echo_fd = -1;
  auto job = r::job::start(std::move(spec), std::move(on_gpu_0));
  const auto& res = job->wait();
  CHECK(res.status.kind == isorun::outcome_kind::crashed);
  REQUIRE_FALSE(res.status.stderr_tail.empty());
  CHECK_THAT(res.status.stderr_tail.back(), Catch::Contains("prepared GPU GPU-sim-0"));
}

TEST_CASE("a job on a standby worker: its time counts from its assignment, its stdout goes to its own file",
          "[runner][standby]") {
  stop_standby_at_end guard;
  namespace r = isorun::runner;
  auto& pool = r::standby_for({.label = "standby"}, 2);
  pool.fill();
  const auto filled = std::chrono::steady_clock::now();
  char dir[] = "/tmp/isorun-standby-XXXXXX";
  REQUIRE(::mkdtemp(dir));
  std::vector<std::shared_ptr<r::job>> jobs;
  for (const char* text : {"first", "second"}) {
    r::job_spec spec;
    spec.task = "prints";
    spec.args = isorun::detail::encode_args(std::string(text));
    spec.stdout_to = r::stdout_mode::file;
    spec.stdout_path = std::string(dir) + "/" + text + ".out";
    jobs.push_back(r::job::start(std::move(spec), pool));
  }
  for (auto& j : jobs) {
    const auto& res = j->wait();
    REQUIRE(res.status.kind == isorun::outcome_kind::success);
    // Launched before `filled`, assigned after it: the wall time is the job's, not the worker's.
    CHECK(res.status.wall < std::chrono::steady_clock::now() - filled);
  }
  for (const char* text : {"first", "second"}) {
    std::ifstream in(std::string(dir) + "/" + text + ".out");
    std::string line;
    CHECK(std::getline(in, line));
    CHECK(line == text);
  }
  std::filesystem::remove_all(dir);
}

// Chooses process-group containment for the workers started while it lives (cgroup
// containment would kill an escaped process before it could try anything).
struct process_group_containment {
  process_group_containment() { ::setenv("ISORUN_CONTAINMENT", "process-group", 1); }
  ~process_group_containment() { ::unsetenv("ISORUN_CONTAINMENT"); }
};

TEST_CASE("an early result is handed over sealed: no process can change it afterwards", "[runner][early]") {
  // A process that escaped the worker's group must still be there to try: the seal is what stops it.
  process_group_containment pinned;
  // A large result first: result segments come from the pool largest first, so the escapee's
  // is a large one, the kind a CPU worker maps ahead of a task (and of its fork) for a result
  // that is not early.
  REQUIRE(isorun::isolated(make_pattern)(64_MiB, 3).size() == 64_MiB);
  char dir[] = "/tmp/isorun-early-XXXXXX";
  REQUIRE(::mkdtemp(dir));
  const std::string d = dir;
  REQUIRE(::mkfifo((d + "/go").c_str(), 0600) == 0);
  REQUIRE(::mkfifo((d + "/report").c_str(), 0600) == 0);
  auto r = isorun::isolated(escapee, {.early_result = true}).try_call(d);
  REQUIRE(r.ok());
  CHECK(r.status().exit_pending);  // handed over on `done`, not at the exit
  { std::ofstream go(d + "/go"); }  // the escaped process now tries its three changes
  int refused = -1, changed = -1;
  std::ifstream(d + "/report") >> refused >> changed;
  CHECK(refused == 3);
  CHECK(changed == 0);
  const auto& b = r.value();
  CHECK(std::all_of(b.bytes().begin(), b.bytes().end(), [](std::byte c) { return c == std::byte{'a'}; }));
  std::filesystem::remove_all(d);
}

TEST_CASE("a descendant that left the worker's group is killed with its cgroup before the result is validated",
          "[runner][containment]") {
  ::unsetenv("ISORUN_CONTAINMENT");  // the default
  const auto& contained = isorun::runner::containment();
  if (!contained.cgroup) {
    WARN("skipped: children are contained by their process group alone here (" << contained.why_not << ")");
    return;
  }
  char dir[] = "/tmp/isorun-contain-XXXXXX";
  REQUIRE(::mkdtemp(dir));
  const std::string d = dir;
  REQUIRE(::mkfifo((d + "/go").c_str(), 0600) == 0);
  auto cgroups_here = [&] {
    std::size_t n = 0;
    for (const auto& e : std::filesystem::directory_iterator(contained.where)) n += e.is_directory();
    return n;
  };
  const std::size_t cgroups_before = cgroups_here();
  auto r = isorun::isolated(escapes_to_rewrite).try_call(d);
  REQUIRE(r.ok());
  const pid_t escaped = std::stoi(r.value());
  // Already gone when the call returned (no waiting here): nothing is left to change the result.
  CHECK(process_gone(escaped, 0));
  const int go = ::open((d + "/go").c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  CHECK(go < 0);
  CHECK(errno == ENXIO);  // no reader: nobody waits to rewrite the segment
  if (go >= 0) ::close(go);
  CHECK(r.value().substr(r.value().find(' ') + 1) == std::string(1000, 'a'));
  // Its cgroup is gone too (others may still be there: standby workers, exits finishing behind).
  CHECK(cgroups_here() <= cgroups_before);
  std::filesystem::remove_all(d);
}

TEST_CASE("an early result still mapped writable by the task's child waits for the worker's group to go",
          "[runner][early]") {
  auto r = isorun::isolated(clings, {.early_result = true}).try_call(0);
  REQUIRE(r.ok());
  CHECK_FALSE(r.status().exit_pending);
  CHECK(r.status().exit.success());
  const auto& b = r.value();
  CHECK(std::all_of(b.bytes().begin(), b.bytes().end(), [](std::byte c) { return c == std::byte{'b'}; }));
}

TEST_CASE("an early result is handed over before the worker frees the task's result value, which it then does",
          "[runner][early]") {
  char dir[] = "/tmp/isorun-free-XXXXXX";
  REQUIRE(::mkdtemp(dir));
  const std::string d = dir;
  REQUIRE(::mkfifo((d + "/free").c_str(), 0600) == 0);
  // A long grace: the worker is not to be killed while its result's destructor waits for the test.
  auto h = isorun::isolated(frees_slowly, {.grace = std::chrono::hours(1), .early_result = true}).async(d);
  const pid_t pid = h.pid();
  auto r = h.try_get();  // would never return if the value were freed before `done`
  REQUIRE(r.ok());
  CHECK(r.status().exit_pending);
  CHECK(r.value().dir == d);
  CHECK_FALSE(std::filesystem::exists(d + "/freed"));
  { std::ofstream free(d + "/free"); }  // the destructor goes on
  CHECK(process_gone(pid));
  CHECK(std::filesystem::exists(d + "/freed"));
  std::filesystem::remove_all(d);
}

TEST_CASE("after an early hand-over, the worker's request segment is reused only once the worker is reaped",
          "[runner][early]") {
  // A worker still exiting maps its request (read-only, but shared: the kernel refuses to seal a
  // file so mapped). Were its segment handed to the next call as the result segment, that
  // result could not be sealed, and its early hand-over would quietly wait for the exit.
  isorun::stop_standby();
  isorun::serialization::segment_pool::instance().clear();
  char dir[] = "/tmp/isorun-reuse-XXXXXX";
  REQUIRE(::mkdtemp(dir));
  const std::string d = dir;
  REQUIRE(::mkfifo((d + "/free").c_str(), 0600) == 0);
  auto slow = isorun::isolated(frees_slowly_after_large_request, {.grace = std::chrono::hours(1), .early_result = true})
                  .async(d, isorun::blob(2_MiB));
  const pid_t slow_pid = slow.pid();
  auto first = slow.try_get();
  REQUIRE(first.ok());
  REQUIRE(first.status().exit_pending);  // its worker now waits in the result's destructor
  // A small request passes over a large idle segment; a result takes the largest one there is.
  auto next = isorun::isolated(pid_and_calls, {.early_result = true}).try_call(0);
  REQUIRE(next.ok());
  CHECK(next.status().exit_pending);
  { std::ofstream free(d + "/free"); }
  CHECK(process_gone(slow_pid));
  std::filesystem::remove_all(d);
}

TEST_CASE("a call's pid stays its worker's once the worker is reaped", "[runner]") {
  auto h = isorun::isolated(pid_and_calls).async(0);
  auto r = h.try_get();  // the worker is gone by now
  REQUIRE(r.ok());
  CHECK(h.pid() == std::stoi(r.value()));
}

TEST_CASE("a streamed result is handed over early with no seal: the bytes are the supervisor's already", "[runner][early][stream]") {
  auto early = isorun::isolated(from_device, {.gpu = 0, .early_result = true}).try_call(20_MiB, 9);
  REQUIRE(early.ok());
  CHECK(early.status().exit_pending);
  CHECK(early.value().size() == 20_MiB);
  CHECK(early.value().data()[20_MiB - 1] == pattern_byte(20_MiB - 1, 9));
}

TEST_CASE("early results on standby workers: each call's worker is gone afterwards, failures are as usual",
          "[runner][early][standby]") {
  stop_standby_at_end guard;
  const isorun::isolated_options opts{.standby = 2, .early_result = true};
  for (int i = 0; i < 5; ++i) {
    auto h = isorun::isolated(pid_and_calls, opts).async(0);
    const pid_t pid = h.pid();
    auto r = h.try_get();
    REQUIRE(r.ok());
    CHECK(r.status().exit_pending);
    CHECK(r.value() == std::to_string(pid) + " 1");
    CHECK(process_gone(pid));  // reaped behind the caller's back
  }
  auto failed = isorun::isolated(throws, opts).try_call(3);
  CHECK(failed.status().kind == isorun::outcome_kind::task_error);
  CHECK_FALSE(failed.status().exit_pending);  // only a result is handed over early
  auto crashed = isorun::isolated(segfaults, {.echo_stderr = false, .early_result = true}).try_call(0);
  CHECK(crashed.status().kind == isorun::outcome_kind::crashed);
}

TEST_CASE("killing a supervisor with standby workers waiting leaves nothing behind", "[runner][standby]") {
  const int shm = isorun::test::shm_entries();
  int out[2];
  REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
  isorun::runner::spawn_options o;
  o.executable = ISORUN_VICTIM;
  o.args = {"standby"};
  for (char** e = environ; *e; ++e) o.env.emplace_back(*e);
  o.fds = {{1, out[1]}};
  auto victim = isorun::runner::spawn(o);
  ::close(out[1]);
  FILE* in = ::fdopen(out[0], "r");
  std::vector<int> waiting(3);
  REQUIRE(std::fscanf(in, "%d %d %d", &waiting[0], &waiting[1], &waiting[2]) == 3);
  std::fclose(in);
  ::kill(victim.pid(), SIGKILL);
  for (int pid : waiting) CHECK(process_gone(pid));
  CHECK(victim.reap().signal == SIGKILL);
  CHECK(isorun::test::shm_entries() == shm);
}

TEST_CASE("a job's times: the worker's encoding, then its reaping, then the validation", "[runner]") {
  // (Not with early_result: its exit would finish behind, on a thread still holding descriptors
  // while the next test counts them.)
  namespace r = isorun::runner;
  r::job_spec spec;
  spec.task = "make_pattern";
  spec.args = isorun::detail::encode_args(std::uint64_t{40_MiB}, std::uint64_t{5});
  auto job = r::job::start(std::move(spec));
  const auto& res = job->wait();
  REQUIRE(res.status.kind == isorun::outcome_kind::success);
  const std::int64_t encoded = res.encode_begin_ns + static_cast<std::int64_t>(res.encode_ns);
  CHECK(res.encode_begin_ns > 0);
  CHECK(encoded <= res.reaped_ns);
  CHECK(res.reaped_ns <= res.received_ns);
}

namespace {
isorun::runner::job_result run_bad_worker(const std::string& mode, const std::vector<isorun::runner::gpu_info>& gpus = {}) {
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
  const int fds = isorun::test::open_fds(), shm = isorun::test::shm_entries();
  const std::size_t rss = resident_kib();
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(run(10000) == 10000);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(isorun::test::open_fds() == fds);
  CHECK(isorun::test::shm_entries() == shm);
  CHECK(zombie_children() == 0);
  const std::size_t grown = resident_kib() > rss ? resident_kib() - rss : 0;
  CHECK(grown < 16 * 1024);  // KiB: steady state, not a leak per task (10,000 x 2 KiB would be 20 MiB)
  WARN("load: 10,000 tasks, 64 in flight, " << static_cast<int>(10000 / seconds) << " tasks/s; fds " << fds << " -> "
                                           << isorun::test::open_fds() << ", RSS +" << grown << " KiB");
}

TEST_CASE("results over 4 GiB use 64-bit sizes end to end", "[runner][large]") {
  const std::uint64_t size = 4_GiB + 512_MiB;
  isorun::blob b = isorun::isolated(make_pattern)(size, 3);
  REQUIRE(b.size() == size);
  const auto* words = reinterpret_cast<const std::uint64_t*>(b.data());
  std::uint64_t mismatches = 0;
  for (std::uint64_t i = 0; i < size / 8; i += 4097) mismatches += words[i] != pattern_word(i, 3);
  CHECK(words[size / 8 - 1] == pattern_word(size / 8 - 1, 3));
  CHECK(mismatches == 0);
}

TEST_CASE("the worker's allocator enforces the cap and reports its peaks", "[runner][alloc]") {
  auto f = isorun::isolated(hold, {.mem_limit = 32_MiB});
  auto r = f.try_call(20);
  REQUIRE(r.ok());
  CHECK(r.value() == 32_MiB);
  CHECK(r.status().peak_allocated == 20_MiB);
  CHECK(r.status().peak_reserved >= 20_MiB);
  CHECK(r.status().peak_reserved <= 32_MiB);
  try {
    f(40);
    FAIL("expected out_of_memory");
  } catch (const isorun::out_of_memory& e) {
    CHECK_THAT(e.what(), Catch::Contains("cap 32.00 MiB"));
  }
  CHECK_THROWS_AS(isorun::isolated(hold, {.alloc_conf = "strategy:nope"})(1), isorun::usage_error);
}

TEST_CASE("map runs a task over inputs on packed slots and keeps input order", "[runner][map]") {
  std::vector<int> inputs = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  auto results = isorun::map(exits_early, inputs, {.cpu_slots = 3, .echo_stderr = false});
  REQUIRE(results.size() == inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    CHECK(results[i].status().kind == isorun::outcome_kind::crashed);
    CHECK(results[i].status().exit.code == static_cast<int>(i));  // each result is its own input's
  }
  auto on_gpus = isorun::map(visible_devices, std::vector<int>(6, 0), {.all_gpus = true, .mem_limit = 8_GiB});
  std::map<std::string, int> seen;
  for (auto& r : on_gpus) seen[r.value().substr(0, 9)]++;
  CHECK(seen.size() == 2);  // both simulated GPUs were used
  CHECK_THROWS_AS(isorun::map(visible_devices, std::vector<int>{0}, {.all_gpus = true, .mem_limit = 64_GiB}),
                  isorun::usage_error);
  // Parameter sets as inputs: typed results with outcomes.
  std::vector<point> configs = {{1, 0.5, "a", {}}, {2, 1.5, "b", {}}};
  auto trials = isorun::map(echo_point, configs, {.mem_limit = 64_MiB, .cpu_slots = 2});
  REQUIRE(trials.size() == 2);
  CHECK(trials[1].value().label == "b!");
  CHECK(trials[0].value().x == 2);
}

TEST_CASE("output_blob: a result written in place in shared memory", "[runner]") {
  const std::uint64_t size = 64_MiB;
  isorun::blob b = isorun::isolated(fill_in_place)(size, 5);
  REQUIRE(b.size() == size);
  CHECK(b.is_view());
  const auto* words = reinterpret_cast<const std::uint64_t*>(b.data());
  std::uint64_t mismatches = 0;
  for (std::uint64_t i = 0; i < size / 8; ++i) mismatches += words[i] != pattern_word(i, 5);
  CHECK(mismatches == 0);

  wrapped w = isorun::isolated(wrap_in_place)(1_MiB);
  CHECK(w.tag == 7);
  REQUIRE(w.bytes.size() == 1_MiB);
  CHECK(static_cast<unsigned char>(w.bytes.data()[12345]) == 0x5a);

  isorun::blob local = isorun::this_worker().output_blob(16);  // outside a worker: owned
  CHECK_FALSE(local.is_view());
  CHECK(local.mutable_data() != nullptr);
}

TEST_CASE("device_result: a blob in device memory streams to the supervisor, into memory only it maps", "[runner][stream]") {
  isorun::stop_standby();
  auto& rings = isorun::serialization::segment_pool::rings();  // kept warm between calls
  REQUIRE(isorun::isolated(from_device)(1, 1).size() == 1);  // and the segment pool warmed up
  rings.clear();
  const int fds_before = isorun::test::open_fds(), shm_before = isorun::test::shm_entries();
  // Sizes around the ring's slots (8 MiB, 8 of them) and the checksum's 4 MiB chunks: one byte;
  // a payload (8-byte length + bytes) of exactly one slot; one byte more; several turns of the ring.
  const std::uint64_t slot = isorun::serialization::ring_slot_bytes;
  for (const std::uint64_t size : {std::uint64_t{1}, slot - 8, slot - 7, 4_MiB + 5, 150_MiB + 3}) {
    for (const bool gpu : {true, false}) {
      INFO("size " << size << (gpu ? " on the simulated GPU" : " in a CPU worker"));
      isorun::isolated_options opts;
      if (gpu) opts.gpu = 0;
      auto r = isorun::isolated(from_device, opts).try_call(size, size);
      REQUIRE(r.ok());
      const isorun::blob& b = r.value();
      REQUIRE(b.size() == size);
      CHECK(b.is_view());
      std::uint64_t wrong = 0;
      for (std::uint64_t i = 0; i < size; ++i) wrong += b.data()[i] != pattern_byte(i, size);
      CHECK(wrong == 0);
      // In private anonymous memory, not in a shared segment a worker could still reach.
      CHECK(isorun::test::mapping_of(b.data()).empty());
    }
  }
  rings.clear();
  CHECK(isorun::test::open_fds() == fds_before);
  CHECK(isorun::test::shm_entries() == shm_before);
  // Outside a worker: an ordinary copy.
  {
    isorun::alloc::caching_allocator& a = isorun::this_worker().allocator();
    isorun::alloc::device_buffer d(a, 100);
    d.copy_from_host(std::string(100, 'q').data(), 100);
    const isorun::blob local = isorun::this_worker().device_result(d, 10);
    CHECK_FALSE(local.is_view());
    CHECK(local.size() == 10);
    CHECK(local.data()[9] == std::byte{'q'});
    CHECK_THROWS_AS(isorun::this_worker().device_result(d, 101), std::out_of_range);
  }
}

TEST_CASE("device_result misused: each misuse is the task's error, with what to do", "[runner][stream]") {
  auto none = isorun::isolated(streams_wrongly).try_call(0);
  REQUIRE(none.status().kind == isorun::outcome_kind::task_error);
  CHECK_THAT(none.status().message, Catch::Contains("return what device_result() returned"));
  auto twice = isorun::isolated(streams_wrongly, {.gpu = 0}).try_call(1);
  REQUIRE(twice.status().kind == isorun::outcome_kind::task_error);
  CHECK_THAT(twice.status().message, Catch::Contains("already called"));
}

TEST_CASE("a result segment that cannot grow (file size limit): a clear error, nothing left behind, and it works again after",
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
    if (isorun::test::run_captured(exe, {"--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/test", "-x",
                                         ISORUN_NPROC_LIMIT}).code != 0) {
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
    if (const auto colon = line.find(": "); colon != std::string::npos) said[line.substr(0, colon)] = line.substr(colon + 2);
  CHECK(said.count("started") == 0);
  CHECK_THAT(said["refused"], Catch::Contains("cannot start") && Catch::Contains("the process limit, ulimit -u, is reached"));
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
