// Sweep scheduling: 100 trials of known durations on simulated GPU slots, with standby workers
// (the default: one per slot) and without, alternating in one run. Reports makespan over the
// ideal (sum of durations / slots) and the per-trial overhead of isolation + scheduling.
//   bench_sweep [--trials N] [--slots-per-gpu K] [--reps R]
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
}  // namespace
ISORUN_TASK(wait_ms);

int main(int argc, char** argv) {
  isorun::init(argc, argv);
  int trials = 100, per_gpu = 4, reps = 3;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--trials") trials = std::atoi(argv[++i]);
    else if (std::string(argv[i]) == "--slots-per-gpu") per_gpu = std::atoi(argv[++i]);
    else if (std::string(argv[i]) == "--reps") reps = std::atoi(argv[++i]);
  }
  using namespace isorun;
  // [0]: no standby, [1]: standby 1 per slot
  std::vector<double> ratios[2], list_ratios[2], overheads[2], gaps[2], starts[2];
  for (int run = 0; run < 2 * reps; ++run) {
    const int rep = run / 2, standby = run % 2 == 0 ? 1 : 0;
    sweep::sweep_spec s;
    s.task = "wait_ms";
    std::mt19937 rng(42 + rep);
    double total_ms = 0;
    std::vector<int> durations;
    for (int i = 0; i < trials; ++i) {
      const int ms = std::getenv("BENCH_ZERO") ? 0 : 50 + static_cast<int>(rng() % 151);  // 50..200 ms
      total_ms += ms;
      durations.push_back(ms);
      s.trials.push_back({{"arg0", ms}, {"arg1", i}});
    }
    s.all_gpus = true;
    s.mem_limit = 2ULL << 30;
    s.per_gpu = per_gpu;
    s.standby = standby;
    const auto dir = std::filesystem::temp_directory_path() /
                     ("isorun-bench-sweep-" + std::to_string(::getpid()) + "-" + std::to_string(run));
    s.out = dir.string();
    const auto slots = sweep::plan_slots(s, runner::gpu_inventory::simulated("2x16G")).slots;
    sweep::sweep_options ro;
    ro.progress = false;
    const std::int64_t t0 = monotonic_ns();
    auto summary = sweep::sweep_run(s, slots, ro).run();
    const double makespan_ms = static_cast<double>(monotonic_ns() - t0) / 1e6;
    std::filesystem::remove_all(dir);
    if (summary.succeeded != summary.total - summary.skipped) {
      std::fprintf(stderr, "bench_sweep: %zu trials failed\n", summary.failed);
      return 1;
    }
    const double ideal_ms = total_ms / static_cast<double>(slots.size());
    const double list_ms = list_schedule_ms(durations, slots.size());
    // Overhead: each slot's busy span (sweep start to its last trial's end) not spent in a task,
    // per trial; the idle tail after a slot's last trial is the schedule's, not overhead. Split
    // into the start (sweep start to each slot's first task) and the gaps between trials.
    std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>> spans(slots.size());  // [start, end] per slot
    for (const auto& r : summary.records) {
      const std::int64_t end = r.result.get<std::int64_t>();
      spans[static_cast<std::size_t>(r.slot)].emplace_back(end - r.params["arg0"].get<std::int64_t>() * 1'000'000, end);
    }
    double busy_ms = 0, start_ms = 0, gap_ms = 0;
    for (auto& sp : spans) {
      if (sp.empty()) continue;
      std::sort(sp.begin(), sp.end());
      busy_ms += static_cast<double>(sp.back().second - t0) / 1e6;
      start_ms += static_cast<double>(sp.front().first - t0) / 1e6 / static_cast<double>(slots.size());
      for (std::size_t k = 1; k < sp.size(); ++k) gap_ms += static_cast<double>(sp[k].first - sp[k - 1].second) / 1e6;
    }
    ratios[standby].push_back(makespan_ms / ideal_ms);
    list_ratios[standby].push_back(makespan_ms / list_ms);
    overheads[standby].push_back((busy_ms - total_ms) / trials);
    gaps[standby].push_back(gap_ms / static_cast<double>(trials - static_cast<int>(slots.size())));
    starts[standby].push_back(start_ms);
    std::printf(
        "run %d (%s): %d trials, %zu slots, makespan %.0f ms, ideal %.0f ms (%.3f), list schedule %.0f ms (%.3f)\n",
        rep, standby ? "standby" : "no standby", trials, slots.size(), makespan_ms, ideal_ms, makespan_ms / ideal_ms,
        list_ms, makespan_ms / list_ms);
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
