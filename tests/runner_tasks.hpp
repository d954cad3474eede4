#pragma once
// The tasks and helpers the runner tests share. The tasks run in re-executed copies of the test
// binary (see catch_main.cpp); runner_tasks.cpp registers them, once.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "isorun/alloc/device_buffer.hpp"
#include "isorun/isorun.hpp"
#include "isorun/runner/containment.hpp"
#include "isorun/runner/job.hpp"
#include "isorun/runner/launcher.hpp"
#include "isorun/runner/process.hpp"
#include "isorun/runner/standby.hpp"
#include "isorun/serialization/result_stream.hpp"
#include "isorun/serialization/segment_pool.hpp"
#include "test_support.hpp"

namespace runner_tests {

using namespace std::chrono_literals;
using namespace isorun::literals;
using isorun::test::process_gone;

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

inline point echo_point(const point& p) {
  point q = p;
  q.x += 1;
  q.label += "!";
  q.tags.push_back(static_cast<int>(q.tags.size()));
  return q;
}

inline std::string concat(std::string a, const std::string& b, int times) {
  std::string out;
  for (int i = 0; i < times; ++i) out += a + b;
  return out;
}

inline std::vector<double> scale(const std::vector<double>& v, double k) {
  std::vector<double> out(v);
  for (double& x : out) x *= k;
  return out;
}

inline std::uint64_t pattern_word(std::uint64_t i, std::uint64_t seed) { return (i + seed) * 0x9E3779B97F4A7C15ULL; }

inline isorun::blob make_pattern(std::uint64_t size, std::uint64_t seed) {
  isorun::blob b(size);
  auto* words = reinterpret_cast<std::uint64_t*>(b.mutable_data());
  for (std::uint64_t i = 0; i < size / 8; ++i) words[i] = pattern_word(i, seed);
  return b;
}

// make_pattern, then the first 256 bytes name the mapping that held the blob in the worker
// (as /proc/self/maps does): a memfd where the worker placed it in the result segment.
inline isorun::blob locate_pattern(std::uint64_t size, std::uint64_t seed) {
  isorun::blob b = make_pattern(size, seed);
  const std::string where = isorun::test::mapping_of(b.data()).substr(0, 255);
  std::memcpy(b.mutable_data(), where.c_str(), where.size() + 1);
  return b;
}

// Keeps a large blob alive past the task, as a cache would, and returns a view into it of another
// size: the kept blob lay where the result goes, and must keep its bytes while the view (which
// reads from it) is encoded there.
inline isorun::blob view_of_kept(std::uint64_t size, std::uint64_t seed) {
  static isorun::blob kept;
  kept = make_pattern(size, seed);
  return isorun::blob(nullptr, kept.data() + 4096, size - 4096);
}

// Makes a large blob, then forks a child that overwrites it and exits; returns the blob with the
// name of the mapping that held it in its first 256 bytes (as locate_pattern). A child's writes are
// its own after fork(), even to a blob that lay in the shared result segment.
inline isorun::blob forked_writer(std::uint64_t size, std::uint64_t seed) {
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
inline isorun::blob one_of_two(std::uint64_t size, std::uint64_t seed, bool first) {
  isorun::blob a = make_pattern(size, first ? seed : seed + 1);
  isorun::blob b = make_pattern(size, first ? seed + 1 : seed);
  return first ? std::move(a) : std::move(b);
}

// Writes its result where the result will be: nothing is copied on either side.
inline isorun::blob fill_in_place(std::uint64_t size, std::uint64_t seed) {
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
inline wrapped wrap_in_place(std::uint64_t size) {
  wrapped w{7, isorun::this_worker().output_blob(size)};
  std::memset(w.bytes.mutable_data(), 0x5a, size);
  return w;
}

// Byte `i` of the pattern make_pattern writes (also past the last whole word).
inline std::byte pattern_byte(std::uint64_t i, std::uint64_t seed) {
  const std::uint64_t w = pattern_word(i / 8, seed);
  std::byte b[8];
  std::memcpy(b, &w, 8);
  return b[i % 8];
}

// Makes `size` bytes of the pattern in the worker's device memory (on a simulated GPU the host
// cannot touch it; in a CPU worker it is host memory), filled piece by piece as a kernel would,
// and returns them through the result stream.
inline isorun::blob from_device(std::uint64_t size, std::uint64_t seed) {
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
inline isorun::blob streams_wrongly(int how) {
  if (how == 0) return isorun::blob::streamed(10);
  isorun::alloc::device_buffer d(isorun::this_worker().allocator(), 64);
  d.copy_from_host(std::vector<char>(64, 'x').data(), 64);
  auto first = isorun::this_worker().device_result(d);
  return isorun::this_worker().device_result(d);
}

inline std::uint64_t sum_blob(const isorun::blob& b) {
  std::uint64_t s = 0;
  for (std::byte c : b.bytes()) s += static_cast<std::uint8_t>(c);
  return s;
}

struct custom_failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline int throws(int which) {
  if (which == 1) throw custom_failure("custom failure 42");
  throw std::runtime_error("bad value " + std::to_string(which));
}

inline int segfaults(int) {
  std::fprintf(stderr, "about to crash\n");
  std::fflush(stderr);
  ::raise(SIGSEGV);
  return 0;
}

inline int aborts(int) { std::abort(); }

inline int exits_early(int code) { std::_Exit(code); }

// "pid calls": which process ran it, and how many calls that process has served.
inline std::string pid_and_calls(int) {
  static int calls = 0;
  return std::to_string(::getpid()) + " " + std::to_string(++calls);
}

inline int sleeps_long(int) {
  for (;;) ::pause();
}

// Says its pid through the FIFO `dir`/pids, then returns once something is written to the FIFO
// `dir`/go: a call that runs exactly as long as the test wants.
inline int runs_until_told(const std::string& dir) {
  std::ofstream(dir + "/pids") << ::getpid() << std::endl;
  int go = 0;
  std::ifstream(dir + "/go") >> go;
  return go;
}

// Writes to its stderr without pause until something is written to the FIFO `dir`/go, then
// returns the bytes written: a worker that floods the stream its supervisor reads. It writes
// before it first looks (a word that came before its first write would otherwise make it a
// worker that wrote nothing).
inline std::uint64_t floods_until_told(const std::string& dir) {
  const int go = ::open((dir + "/go").c_str(), O_RDONLY | O_NONBLOCK);
  static char chunk[1 << 16];
  std::memset(chunk, 'x', sizeof chunk);
  std::uint64_t written = 0;
  char c = 0;
  do {
    const ssize_t n = ::write(2, chunk, sizeof chunk);
    if (n > 0) written += static_cast<std::uint64_t>(n);
  } while (go >= 0 && ::read(go, &c, 1) != 1);
  return written;
}

inline std::string visible_devices(int) {
  const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
  const char* o = std::getenv("CUDA_DEVICE_ORDER");
  const auto& w = isorun::this_worker();
  return std::string(v ? v : "<unset>") + "|" + (o ? o : "<unset>") + "|" + std::to_string(w.device()) + "|" +
         std::to_string(w.mem_limit());
}

// A worker on several GPUs: what it sees, each device's allocator and cap, and `each` bytes held on
// every device at once (more than one cap in all: the cap is per device). An allocation past a
// cap fails with that device's OOM message.
inline std::string on_devices(std::uint64_t each) {
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
inline int hang_with_grandchild(const std::string& path) {
  pid_t g = ::fork();
  if (g == 0) {
    for (;;) ::pause();
  }
  ::signal(SIGTERM, SIG_IGN);
  std::ofstream(path) << ::getpid() << " " << g << std::endl;
  for (;;) ::pause();
}

inline void no_result(int) {}

// What a task finds when it starts: whether its allocator exists already (a warm worker made it
// while waiting), the device it sees, and its allocator's cap.
inline std::string warm_state(int) {
  auto& w = isorun::this_worker();
  const bool ready = w.has_allocator();
  const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
  return std::string(ready ? "ready" : "cold") + "|" + (v ? v : "<unset>") + "|" + std::to_string(w.allocator().cap());
}

// Leaves its process group (setsid) with the result segment's descriptor, then waits for the
// worker's exit and for `dir`/go, and rewrites every result segment it holds. Returns its pid
// and the text it should have left alone.
inline std::string escapes_to_rewrite(const std::string& dir) {
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
          [[maybe_unused]]
        auto n = ::pwrite(fd, "XXXXXXXX", 8, 200);
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
inline isorun::blob escapee(const std::string& dir) {
  int left[2];  // the child says it has left the worker's group before the worker goes on
  if (::pipe(left) != 0) throw std::runtime_error("pipe");
  if (::fork() == 0) {
    ::setsid();
    ::close(left[0]);
    ::close(left[1]);                   // the worker's read returns
    { std::ifstream go(dir + "/go"); }  // blocks until the test opens it
    int refused = 0, changed = 0;
    for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
      const int fd = std::stoi(entry.path().filename().string());
      std::uint64_t magic = 0;
      if (::pread(fd, &magic, sizeof magic, 0) != sizeof magic || magic != isorun::serialization::result_magic)
        continue;
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
// How many of isorun's shared memory segments the worker holds a descriptor of while its task
// runs (`args` only makes the request as large as the test wants).
inline int segments_held(const isorun::blob& args) {
  (void)args;
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    n += std::filesystem::read_symlink(e.path(), ec).string().starts_with("/memfd:isorun-segment");
  }
  return n;
}

inline isorun::blob clings(int) {
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

inline slow_to_free frees_slowly(const std::string& dir) { return slow_to_free(dir); }

// The same with a large argument, so that its request segment is large.
inline slow_to_free frees_slowly_after_large_request(const std::string& dir, const isorun::blob& /*ballast*/) {
  return slow_to_free(dir);
}

inline int prints(const std::string& text) {
  std::printf("%s\n", text.c_str());
  return 0;
}

// Takes `mib` MiB of host memory and touches every page; returns how many it got.
inline int eats_host(int mib) {
  std::vector<char> block(static_cast<std::size_t>(mib) << 20);
  for (std::size_t i = 0; i < block.size(); i += 4096) block[i] = 1;
  return static_cast<int>(block.size() >> 20) + block[0] - 1;
}

inline std::string twice(const std::string& s) { return s + s; }

// The thread-count variables the worker got: "OMP OPENBLAS MKL VECLIB NUMEXPR" ("-" if unset).
inline std::string thread_vars(int) {
  std::string out;
  for (const char* name : {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
                           "NUMEXPR_NUM_THREADS"}) {
    const char* v = std::getenv(name);
    out += (out.empty() ? "" : " ") + std::string(v ? v : "-");
  }
  return out;
}

// What the worker's task sees of LD_BIND_NOW and isorun's marker for it, then the LD_BIND_NOW its
// process was exec'd with (/proc/self/environ keeps the strings of the exec, whatever unsetenv did
// since): "LD ISORUN AT_EXEC" ("-" if unset).
inline std::string bind_vars(int) {
  const char* ld = std::getenv("LD_BIND_NOW");
  const char* marker = std::getenv("ISORUN_BIND_NOW");
  std::ifstream in("/proc/self/environ");
  const std::string at_exec = '\0' +
                              std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const bool bound = at_exec.find(std::string("\0LD_BIND_NOW=1\0", 15)) != std::string::npos;
  return std::string(ld ? ld : "-") + " " + (marker ? marker : "-") + " " + (bound ? "1" : "-");
}

// The CPUs thread `tid` (0: the calling one) may run on, as "0,1,...".
inline std::string cpu_list(pid_t tid) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(tid, sizeof set, &set) != 0) return "unreadable";
  std::string out;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &set)) out += (out.empty() ? "" : ",") + std::to_string(cpu);
  return out;
}

// The CPUs each thread of the task's process may run on: the lists, each once, joined by " | "
// ("0,1" where every thread has the same).
inline std::string threads_cpus(int) {
  std::set<std::string> lists;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task"))
    lists.insert(cpu_list(static_cast<pid_t>(std::stol(e.path().filename().string()))));
  std::string out;
  for (const auto& l : lists) out += (out.empty() ? "" : " | ") + l;
  return out;
}

// Holds `mib` MiB from the worker's capped allocator.
inline std::uint64_t hold(int mib) {
  auto& a = isorun::this_worker().allocator();
  std::vector<isorun::alloc::device_buffer> held;
  for (int i = 0; i < mib; ++i) held.emplace_back(a, 1u << 20);
  return a.cap();
}

// Reads "WORKER GRANDCHILD" from a FIFO written by hang_with_grandchild.
inline std::pair<pid_t, pid_t> read_pids(const std::string& fifo) {
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

// The launch of a standby worker for a CPU call of isolated() without options: its own thread
// limits (one core, its share of the process's admission) are part of how it is launched.
inline isorun::runner::launch_spec plain_standby() {
  return {.label = "standby", .extra_env = isorun::runner::thread_limits(1, {})};
}

// Standby pools are process-wide; other tests check that no child is left, so each standby test
// stops them when it ends.
struct stop_standby_at_end {
  ~stop_standby_at_end() { isorun::runner::stop_standby(); }
};

// The default containment, for a test about cgroups: nullptr, with the reason said, where
// children are contained by their process group alone (the test is then skipped).
inline const isorun::runner::containment_info* cgroup_containment() {
  ::unsetenv("ISORUN_CONTAINMENT");  // the default
  const auto& contained = isorun::runner::containment();
  if (contained.cgroup) return &contained;
  WARN("skipped: children are contained by their process group alone here (" << contained.why_not << ")");
  return nullptr;
}

// The helper supervisor (tests/helpers/supervisor_victim.cpp) started with `args` in this
// process's environment; what it prints on its stdout is read from `out`.
struct supervisor_victim {
  isorun::runner::child process;
  std::unique_ptr<FILE, int (*)(FILE*)> out{nullptr, &std::fclose};
};

inline supervisor_victim start_victim(std::vector<std::string> args) {
  int out[2];
  REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
  isorun::runner::spawn_options o;
  o.executable = ISORUN_VICTIM;
  o.args = std::move(args);
  for (char** e = environ; *e; ++e) o.env.emplace_back(*e);
  o.fds = {{1, out[1]}};
  supervisor_victim v;
  v.process = isorun::runner::spawn(o);
  ::close(out[1]);
  v.out.reset(::fdopen(out[0], "r"));
  return v;
}

// Chooses process-group containment for the workers started while it lives (cgroup
// containment would kill an escaped process before it could try anything).
struct process_group_containment {
  process_group_containment() { ::setenv("ISORUN_CONTAINMENT", "process-group", 1); }
  ~process_group_containment() { ::unsetenv("ISORUN_CONTAINMENT"); }
};

}  // namespace runner_tests
