// Tasks for the sweep tests.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "isorun/alloc/device_buffer.hpp"
#include "isorun/isorun.hpp"

namespace {

struct step_args {
  int i = 0;
  std::string log;  // each completed step appends "i" here
  template <class A>
  void serialize(A& ar) {
    ar(CEREAL_NVP(i), CEREAL_NVP(log));
  }
};

struct step_result {
  int i = 0;
  double score = 0;
  std::string device;
  template <class A>
  void serialize(A& ar) {
    ar(CEREAL_NVP(i), CEREAL_NVP(score), CEREAL_NVP(device));
  }
};

// Step ISORUN_TEST_HANG_AT announces "WORKER_PID" on the FIFO ISORUN_TEST_FIFO and waits forever.
step_result step(const step_args& a) {
  if (const char* h = std::getenv("ISORUN_TEST_HANG_AT"); h && std::atoi(h) == a.i) {
    std::ofstream(std::getenv("ISORUN_TEST_FIFO")) << ::getpid() << std::endl;
    for (;;) ::pause();
  }
  if (!a.log.empty()) {
    int fd = ::open(a.log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    const std::string line = std::to_string(a.i) + "\n";
    [[maybe_unused]] auto n = ::write(fd, line.data(), line.size());
    ::close(fd);
  }
  const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
  return {a.i, static_cast<double>((a.i * 7) % 10), v && *v ? v : "cpu"};
}

// Crashes on the first attempt for each i (marker file absent), succeeds on the next.
int flaky(int i, const std::string& dir) {
  const std::string marker = dir + "/flaky-" + std::to_string(i);
  if (::access(marker.c_str(), F_OK) != 0) {
    std::ofstream(marker) << "1";
    ::raise(SIGSEGV);
  }
  return i;
}

int always_fails(int i) { throw std::runtime_error("deterministic failure " + std::to_string(i)); }

}  // namespace

ISORUN_TASK(step);
ISORUN_TASK(flaky);
ISORUN_TASK(always_fails);

// Trial i of the chaos sweep: every 20th crashes, the one after it outlives any timeout, the
// rest succeed at once.
int chaos(int i) {
  if (i % 20 == 0) std::abort();
  if (i % 20 == 1)
    for (;;) ::pause();
  return i;
}
ISORUN_TASK(chaos);

// With an odd `grow`, first grows every isorun segment its worker holds past this machine's memory
// (sparse: it costs nothing), so past the default largest result; returns 32 KiB of text either
// way (more than a worker's report carries: it goes through the result segment).
std::string grows_result(int grow) {
  if (grow % 2) {
    const auto past = static_cast<off_t>(::sysconf(_SC_PHYS_PAGES) * ::sysconf(_SC_PAGESIZE)) + (off_t{64} << 30);
    for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
      std::error_code ec;
      if (std::filesystem::read_symlink(e.path(), ec).string().starts_with("/memfd:isorun-segment"))
        if (::ftruncate(std::stoi(e.path().filename().string()), past) != 0) throw std::runtime_error("ftruncate");
    }
  }
  return std::string(32 << 10, 'r');
}
ISORUN_TASK(grows_result);

namespace {
// A result type that is not default-constructible: its fields are only known from a result.
struct scored {
  explicit scored(double v) : value{v} {}
  double value;
  template <class A>
  void serialize(A& ar) {
    ar(CEREAL_NVP(value));
  }
};

scored opaque(int i) { return scored(i * 0.5); }

struct whoami_result {
  int pid = 0;
  bool warm = false;  // the allocator existed before the task asked for it
  template <class A>
  void serialize(A& ar) {
    ar(CEREAL_NVP(pid), CEREAL_NVP(warm));
  }
};

// Says on stdout which trial it is; reports its process and whether its worker came prepared.
whoami_result whoami(int i) {
  const bool warm = isorun::this_worker().has_allocator();
  std::printf("trial %d in pid %d\n", i, static_cast<int>(::getpid()));
  return {static_cast<int>(::getpid()), warm};
}

double plain_number(int i) { return i; }
}  // namespace

ISORUN_TASK(opaque);
ISORUN_TASK(plain_number);
ISORUN_TASK(whoami);

namespace {
struct span_args {
  int g = 1;
  int i = 0;
  std::string dir;  // shared by the trials: a marker per (GPU, trial) while it runs
  template <class A>
  void serialize(A& ar) {
    ar(CEREAL_NVP(g), CEREAL_NVP(i), CEREAL_NVP(dir));
  }
};
struct span_result {
  int devices = 0;
  int crowded = 0;  // the most trials this one saw on one of its GPUs, itself included
  std::string visible;
  template <class A>
  void serialize(A& ar) {
    ar(CEREAL_NVP(devices), CEREAL_NVP(crowded), CEREAL_NVP(visible));
  }
};

// A trial on several GPUs: holds 64 MiB on each of them while it looks how many trials are
// on each (markers in `dir`), which must never exceed the GPU's places.
span_result gpu_span(const span_args& a) {
  auto& w = isorun::this_worker();
  span_result r;
  r.devices = static_cast<int>(w.devices().size());
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) r.visible = v;
  std::vector<isorun::alloc::device_buffer> held;
  std::vector<std::string> mine;
  for (std::size_t d = 0; d < w.devices().size(); ++d) {
    held.emplace_back(w.allocator(d), 64u << 20);
    mine.push_back(a.dir + "/" + w.devices()[d].uuid + "." + std::to_string(::getpid()));
    ::close(::open(mine.back().c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644));
  }
  for (const auto& d : w.devices()) {
    int n = 0;
    for (const auto& e : std::filesystem::directory_iterator(a.dir))
      n += e.path().filename().string().rfind(d.uuid + ".", 0) == 0;
    r.crowded = std::max(r.crowded, n);
  }
  for (const auto& m : mine) ::unlink(m.c_str());
  return r;
}
}  // namespace
ISORUN_TASK(gpu_span);

namespace {
// Holds `mib` MiB of device memory through the worker's allocator, in 8 MiB steps: past the cap
// it runs out of memory with its earlier steps still live.
int fill_mib(int mib) {
  std::vector<isorun::alloc::device_buffer> held;
  for (int i = 0; i < mib; i += 8) held.emplace_back(isorun::this_worker().allocator(), 8u << 20);
  return mib;
}
}  // namespace
ISORUN_TASK(fill_mib);

namespace {
// Writes `mib` MiB of lines to its stderr (a trial's log past its bound).
int spew(int mib) {
  const std::string line(1023, 'e');
  for (int i = 0; i < mib * 1024; ++i) std::fprintf(stderr, "%s\n", line.c_str());
  return mib;
}
}  // namespace
ISORUN_TASK(spew);

namespace {
// The first time (no marker `dir`/`i`.died yet), kills the isorun that runs it (on a Slurm node:
// the array task's, so the task ends without the trial's record); afterwards, succeeds.
int die_once(int i, const std::string& dir) {
  const std::string marker = dir + "/" + std::to_string(i) + ".died";
  if (::access(marker.c_str(), F_OK) != 0) {
    ::close(::open(marker.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644));
    ::kill(::getppid(), SIGKILL);
    for (;;) ::pause();
  }
  return i;
}

// Says it runs (a file `dir`/`i`.running), then waits to be stopped.
int wait_marked(int i, const std::string& dir) {
  const std::string marker = dir + "/" + std::to_string(i) + ".running";
  ::close(::open(marker.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644));
  for (;;) ::pause();
}
// The first time (no marker `dir`/`i`.running yet), says it runs and waits to be stopped;
// afterwards, succeeds at once.
int wait_once(int i, const std::string& dir) {
  const std::string marker = dir + "/" + std::to_string(i) + ".running";
  if (::access(marker.c_str(), F_OK) == 0) return i;
  ::close(::open(marker.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644));
  for (;;) ::pause();
}
}  // namespace
ISORUN_TASK(die_once);
ISORUN_TASK(wait_once);
ISORUN_TASK(wait_marked);

// The learning curve of tests/helpers/curve.py as a task that reports: loss at step t of
// configuration (x, y), reported each step with this_worker().report(); with `clean`, it asks
// should_stop() each step and returns early when told. Each start appends "x y" to `runs`, each
// clean stop "stopped x y".
namespace {
struct curve_metrics {
  double loss = 0;
  template <class A>
  void serialize(A& ar) {
    ar(CEREAL_NVP(loss));
  }
};
struct curve_args {
  double x = 0, y = 0;
  int max_t = 27;
  bool clean = false;
  std::string runs;
  template <class A>
  void serialize(A& ar) {
    ar(CEREAL_NVP(x), CEREAL_NVP(y), CEREAL_NVP(max_t), CEREAL_NVP(clean), CEREAL_NVP(runs));
  }
};
struct curve_result {
  double loss = 0;
  int steps = 0;
  bool stopped = false;
  template <class A>
  void serialize(A& ar) {
    ar(CEREAL_NVP(loss), CEREAL_NVP(steps), CEREAL_NVP(stopped));
  }
};
double curve_loss(double x, double y, int t) {
  return (x - 0.3) * (x - 0.3) + (y - 0.6) * (y - 0.6) + (1 + std::abs(x - 0.3) + std::abs(y - 0.6)) * 2.0 / (t + 1);
}
}  // namespace

curve_result curve(const curve_args& a) {
  const double x = a.x, y = a.y;
  const int max_t = a.max_t;
  const bool clean = a.clean;
  const std::string& runs = a.runs;
  auto note = [&](const std::string& what) {
    if (runs.empty()) return;
    const int fd = ::open(runs.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    const std::string line = what + std::to_string(x) + " " + std::to_string(y) + "\n";
    [[maybe_unused]] auto n = ::write(fd, line.data(), line.size());
    ::close(fd);
  };
  note("");
  // Asking once before the first report: a stop that comes at once is a clean one too.
  if (clean) (void)isorun::this_worker().should_stop();
  curve_result r;
  for (int t = 1; t <= max_t; ++t) {
    r.loss = curve_loss(x, y, t);
    r.steps = t;
    isorun::this_worker().report(t, curve_metrics{r.loss});
    ::usleep(1000);  // the step's work
    if (clean && isorun::this_worker().should_stop()) {
      r.stopped = true;  // told to stop: clean up (here: say so) and return
      note("stopped ");
      return r;
    }
  }
  return r;
}
ISORUN_TASK(curve);

// A trial that keeps its progress through this_worker().checkpoint(): `steps` steps, a checkpoint
// every `every` (a file "state" holding the step), resumed from latest_checkpoint(). Each step
// it does appends "I STEP" to `log` (I: its parameter `i`); at
// step `grow_at` it holds `mib` MiB of device memory through its allocator, which runs out of
// memory under a smaller cap (an out-of-memory retry at a larger cap then resumes).
namespace {
struct checkpointed_args {
  int i = 0, steps = 0, every = 10, grow_at = -1, mib = 0;
  std::string log;
  template <class A>
  void serialize(A& ar) {
    ar(CEREAL_NVP(i), CEREAL_NVP(steps), CEREAL_NVP(every), CEREAL_NVP(grow_at), CEREAL_NVP(mib), CEREAL_NVP(log));
  }
};
}  // namespace

int checkpointed(const checkpointed_args& a) {
  auto& w = isorun::this_worker();
  int step = 0;
  if (const auto from = w.latest_checkpoint()) std::ifstream(from->path / "state") >> step;
  std::vector<isorun::alloc::device_buffer> held;
  while (step < a.steps) {
    ++step;
    { std::ofstream(a.log, std::ios::app) << a.i << " " << step << "\n"; }
    w.report_object(step, "{}");
    if (step == a.grow_at)
      for (int m = 0; m < a.mib; m += 8) held.emplace_back(w.allocator(), 8u << 20);
    if (step % a.every == 0)
      w.checkpoint(step, [&](const std::filesystem::path& dir) { std::ofstream(dir / "state") << step; });
  }
  return step;
}
ISORUN_TASK(checkpointed);
