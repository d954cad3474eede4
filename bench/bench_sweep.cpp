// Sweep scheduling: 100 trials of known durations on simulated GPU slots, with standby workers
// (the default: one per slot) and without, alternating in one run. Reports makespan over the
// ideal (sum of durations / slots) and the per-trial overhead of isolation + scheduling.
//   bench_sweep [--trials N] [--slots-per-gpu K] [--reps R]
// With --track mlflow: the same trials (200 by default) with the MLflow tracker and without,
// alternating: the gap between trials with it over without, and how long the sweep's end waits
// for the tracker to take the last records (its lag behind the journal), beside the same wait
// without one. Needs python3 with mlflow (the tracker runs in it, isorun from the build).
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>

#include "isorun/isorun.hpp"
#include "isorun/sweep/sweep.hpp"
#include "stats.hpp"

namespace {
std::int64_t monotonic_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1'000'000'000LL + ts.tv_nsec;
}

// A trial of known duration: it waits `ms` milliseconds (the work being timed is the scheduler's)
// and returns when it ended, on the clock every process shares.
std::int64_t wait_ms(int ms, int trial) {
  (void)trial;  // distinguishes trials of equal duration
  timespec ts{ms / 1000, (ms % 1000) * 1'000'000L};
  while (::nanosleep(&ts, &ts) != 0) {
  }
  return monotonic_ns();
}

// The makespan of the same trials with zero overhead under the scheduler's rule (a slot that
// comes free takes the next trial in spec order): what no scheduler that does not know the
// durations beforehand can beat.
double list_schedule_ms(const std::vector<int>& durations, std::size_t slots) {
  std::vector<double> free_at(slots, 0);
  for (int d : durations) *std::min_element(free_at.begin(), free_at.end()) += d;
  return *std::max_element(free_at.begin(), free_at.end());
}
struct run_figures {
  std::size_t slots = 0;
  double makespan_ms = 0, gap_ms = 0, start_ms = 0, overhead_ms = 0;
  double end_wait_ms = 0;  // the last trial's end to the sweep's return
};

// Runs `s` on `slots` and measures it: the slot time between trials, and the rest.
// Runs `s` (its trials `total_ms` long in all) on the simulated GPUs' slots, in an output folder
// of its own named by `tag` and `run` (removed after), and measures it.
run_figures measure(isorun::sweep::sweep_spec s, const char* tag, int run, double total_ms, int trials) {
  using namespace isorun;
  const auto dir = std::filesystem::temp_directory_path() /
                   ("isorun-bench-" + std::string(tag) + "-" + std::to_string(::getpid()) + "-" + std::to_string(run));
  s.out = dir.string();
  const auto slots = sweep::plan_slots(s, runner::gpu_inventory::simulated("2x16G")).slots;
  sweep::sweep_options ro;
  ro.progress = false;
  const std::int64_t t0 = monotonic_ns();
  auto summary = sweep::sweep_run(s, slots, ro).run();
  const std::int64_t t1 = monotonic_ns();
  std::filesystem::remove_all(dir);
  if (summary.succeeded != summary.total - summary.skipped) {
    std::fprintf(stderr, "bench_sweep: %zu trials failed\n", summary.failed);
    std::exit(1);
  }
  // Overhead: each slot's busy span (sweep start to its last trial's end) not spent in a task,
  // per trial; the idle tail after a slot's last trial is the schedule's, not overhead. Split
  // into the start (sweep start to each slot's first task) and the gaps between trials.
  std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>> spans(slots.size());  // [start, end] per slot
  std::int64_t last_end = t0;
  for (const auto& r : summary.records) {
    const std::int64_t end = r.result.get<std::int64_t>();
    last_end = std::max(last_end, end);
    spans[static_cast<std::size_t>(r.slot)].emplace_back(end - r.params["arg0"].get<std::int64_t>() * 1'000'000, end);
  }
  run_figures f;
  f.slots = slots.size();
  double busy_ms = 0;
  for (auto& sp : spans) {
    if (sp.empty()) continue;
    std::sort(sp.begin(), sp.end());
    busy_ms += static_cast<double>(sp.back().second - t0) / 1e6;
    f.start_ms += static_cast<double>(sp.front().first - t0) / 1e6 / static_cast<double>(slots.size());
    for (std::size_t k = 1; k < sp.size(); ++k) f.gap_ms += static_cast<double>(sp[k].first - sp[k - 1].second) / 1e6;
  }
  f.gap_ms /= static_cast<double>(trials - static_cast<int>(slots.size()));
  f.makespan_ms = static_cast<double>(t1 - t0) / 1e6;
  f.overhead_ms = (busy_ms - total_ms) / trials;
  f.end_wait_ms = static_cast<double>(t1 - last_end) / 1e6;
  return f;
}

// `trials` trials of 50..200 ms (seeded by `rep`) of wait_ms; their total duration in `total_ms`.
isorun::sweep::sweep_spec wait_spec(int trials, int per_gpu, int rep, double& total_ms, std::vector<int>& durations) {
  isorun::sweep::sweep_spec s;
  s.task = "wait_ms";
  std::mt19937 rng(42 + rep);
  total_ms = 0;
  for (int i = 0; i < trials; ++i) {
    const int ms = std::getenv("BENCH_ZERO") ? 0 : 50 + static_cast<int>(rng() % 151);  // 50..200 ms
    total_ms += ms;
    durations.push_back(ms);
    s.trials.push_back({{"arg0", ms}, {"arg1", i}});
  }
  s.all_gpus = true;
  s.mem_limit = 2ULL << 30;
  s.per_gpu = per_gpu;
  return s;
}

// --track mlflow: the trials with the MLflow tracker and without, alternating.
int track_figures(int trials, int per_gpu, int reps) {
  using namespace isorun;
  // The tracker's python3 finds isorun where the build put it (build/python beside build/bin).
  const auto python = std::filesystem::canonical("/proc/self/exe").parent_path().parent_path() / "python";
  ::setenv("MLFLOW_DISABLE_TELEMETRY", "true", 1);  // (the benchmark reaches nothing outside)
  const char* before = std::getenv("PYTHONPATH");
  ::setenv("PYTHONPATH", (python.string() + (before ? ":" + std::string(before) : "")).c_str(), 1);
  // The tracking store exists, as a team's does: made once (its tables), each run's sweep a parent
  // run of its own in it.
  const auto store = std::filesystem::temp_directory_path() / ("isorun-bench-mlflow-" + std::to_string(::getpid()));
  std::filesystem::create_directories(store);
  const std::string uri = "sqlite:///" + (store / "mlflow.db").string();
  if (std::system(("python3 -c \"from mlflow import MlflowClient; MlflowClient('" + uri +
                   "').search_experiments()\" 2>/dev/null")
                      .c_str()) != 0) {
    std::fprintf(stderr, "bench_sweep --track mlflow: python3 cannot use MLflow (pip install 'isorun[mlflow]')\n");
    return 1;
  }
  std::vector<double> gaps[2], waits[2];
  for (int run = 0; run < 2 * reps; ++run) {
    const int rep = run / 2, tracked = run % 2 == 0 ? 1 : 0;
    double total_ms = 0;
    std::vector<int> durations;
    sweep::sweep_spec s = wait_spec(trials, per_gpu, rep, total_ms, durations);
    if (tracked) s.track.push_back({.name = "mlflow", .settings = {{"uri", uri}}});
    const run_figures f = measure(s, "track", run, total_ms, trials);
    gaps[tracked].push_back(f.gap_ms);
    waits[tracked].push_back(f.end_wait_ms);
    std::printf("run %d (%s): %d trials, %zu slots, makespan %.0f ms, gap %.3f ms, end wait %.0f ms\n", rep,
                tracked ? "mlflow" : "no tracker", trials, f.slots, f.makespan_ms, f.gap_ms, f.end_wait_ms);
  }
  std::filesystem::remove_all(store);
  std::vector<double> ratio;
  for (int r = 0; r < reps; ++r)
    ratio.push_back(gaps[1][static_cast<std::size_t>(r)] / gaps[0][static_cast<std::size_t>(r)]);
  std::printf("gap between trials, mlflow tracker     %s\n", bench::show(bench::summarize(gaps[1]), "ms").c_str());
  std::printf("gap between trials, no tracker         %s\n", bench::show(bench::summarize(gaps[0]), "ms").c_str());
  std::printf("gap with tracker / without (same rep)  %s   goal <= 1.1\n",
              bench::show(bench::summarize(ratio), "").c_str());
  std::printf("end wait, mlflow tracker               %s   (the last trial's end to the sweep's return)\n",
              bench::show(bench::summarize(waits[1]), "ms").c_str());
  std::printf("end wait, no tracker                   %s   (its floor)\n",
              bench::show(bench::summarize(waits[0]), "ms").c_str());
  std::printf("tracker lag at the end (wait - floor)  %.0f ms   goal <= 2000 ms\n",
              bench::summarize(waits[1]).median - bench::summarize(waits[0]).median);
  return 0;
}
}  // namespace
ISORUN_TASK(wait_ms);

int main(int argc, char** argv) {
  isorun::init(argc, argv);
  int trials = 100, per_gpu = 4, reps = 3;
  bool track = false;
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--track" && i + 1 < argc && std::string(argv[i + 1]) == "mlflow") track = true;
  if (track) trials = 200;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--trials") trials = std::atoi(argv[++i]);
    else if (std::string(argv[i]) == "--slots-per-gpu") per_gpu = std::atoi(argv[++i]);
    else if (std::string(argv[i]) == "--reps") reps = std::atoi(argv[++i]);
  }
  if (track) return track_figures(trials, per_gpu, reps);
  using namespace isorun;
  // [0]: no standby, [1]: standby 1 per slot
  std::vector<double> ratios[2], list_ratios[2], overheads[2], gaps[2], starts[2];
  for (int run = 0; run < 2 * reps; ++run) {
    const int rep = run / 2, standby = run % 2 == 0 ? 1 : 0;
    double total_ms = 0;
    std::vector<int> durations;
    sweep::sweep_spec s = wait_spec(trials, per_gpu, rep, total_ms, durations);
    s.standby = standby;
    const run_figures f = measure(s, "sweep", run, total_ms, trials);
    const double ideal_ms = total_ms / static_cast<double>(f.slots);
    const double list_ms = list_schedule_ms(durations, f.slots);
    ratios[standby].push_back(f.makespan_ms / ideal_ms);
    list_ratios[standby].push_back(f.makespan_ms / list_ms);
    overheads[standby].push_back(f.overhead_ms);
    gaps[standby].push_back(f.gap_ms);
    starts[standby].push_back(f.start_ms);
    std::printf(
        "run %d (%s): %d trials, %zu slots, makespan %.0f ms, ideal %.0f ms (%.3f), list schedule %.0f ms (%.3f)\n",
        rep, standby ? "standby" : "no standby", trials, f.slots, f.makespan_ms, ideal_ms, f.makespan_ms / ideal_ms,
        list_ms, f.makespan_ms / list_ms);
  }
  for (int standby : {1, 0}) {
    const char* name = standby ? "standby" : "no standby";
    std::printf("%-10s makespan / ideal (sum / slots)        %s   goal <= 1.05\n", name,
                bench::show(bench::summarize(ratios[standby]), "").c_str());
    std::printf("%-10s makespan / zero-overhead list schedule %s\n", name,
                bench::show(bench::summarize(list_ratios[standby]), "").c_str());
    std::printf("%-10s overhead per trial                     %s   goal <= 2 ms (slot time not in a task)\n", name,
                bench::show(bench::summarize(overheads[standby]), "ms").c_str());
    std::printf("%-10s   of which: gap between trials         %s   (a trial's end to the slot's next start)\n", name,
                bench::show(bench::summarize(gaps[standby]), "ms").c_str());
    std::printf("%-10s   and: sweep start to a slot's first   %s   (once per slot)\n", name,
                bench::show(bench::summarize(starts[standby]), "ms").c_str());
  }
  // Slot time between a trial's end and the next one's start: what the engine adds per trial (its
  // floor is 0; the list schedule is the zero-overhead one).
  bench::guard("sweep.gap_between_trials_ms.standby", bench::summarize(gaps[1]).median, "<=", 2.5);
  return 0;
}
