// Sweep scheduling: 100 trials of known durations on simulated GPU slots. Reports makespan over
// the ideal (sum of durations / slots) and the per-trial overhead of isolation + scheduling.
//   bench_sweep [--trials N] [--slots-per-gpu K]
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>

#include "isorun/isorun.hpp"
#include "isorun/sweep/sweep.hpp"
#include "stats.hpp"

namespace {
// A trial of known duration: it waits `ms` milliseconds (the work being timed is the scheduler's).
int wait_ms(int ms, int trial) {
  (void)trial;  // distinguishes trials of equal duration
  timespec ts{ms / 1000, (ms % 1000) * 1'000'000L};
  while (::nanosleep(&ts, &ts) != 0) {
  }
  return ms;
}
}  // namespace
ISORUN_TASK(wait_ms);

int main(int argc, char** argv) {
  isorun::init(argc, argv);
  int trials = 100, per_gpu = 4;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--trials") trials = std::atoi(argv[++i]);
    else if (std::string(argv[i]) == "--slots-per-gpu") per_gpu = std::atoi(argv[++i]);
  }
  using namespace isorun;
  std::vector<double> ratios, overheads;
  for (int rep = 0; rep < 3; ++rep) {
    sweep::sweep_spec s;
    s.task = "wait_ms";
    std::mt19937 rng(42 + rep);
    double total_ms = 0;
    for (int i = 0; i < trials; ++i) {
      const int ms = std::getenv("BENCH_ZERO") ? 0 : 50 + static_cast<int>(rng() % 151);  // 50..200 ms
      total_ms += ms;
      s.trials.push_back({{"arg0", ms}, {"arg1", i}});
    }
    s.all_gpus = true;
    s.mem_limit = 2ULL << 30;
    s.per_gpu = per_gpu;
    const auto dir = std::filesystem::temp_directory_path() / ("isorun-bench-sweep-" + std::to_string(::getpid()) + "-" + std::to_string(rep));
    s.out = dir.string();
    const auto slots = sweep::plan_slots(s, runner::gpu_inventory::simulated("2x16G")).slots;
    sweep::sweep_options ro;
    ro.progress = false;
    const auto t0 = std::chrono::steady_clock::now();
    auto summary = sweep::sweep_run(s, slots, ro).run();
    const double makespan_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::filesystem::remove_all(dir);
    if (summary.succeeded != summary.total - summary.skipped) {
      std::fprintf(stderr, "bench_sweep: %zu trials failed\n", summary.failed);
      return 1;
    }
    const double ideal_ms = total_ms / static_cast<double>(slots.size());
    ratios.push_back(makespan_ms / ideal_ms);
    overheads.push_back((makespan_ms * static_cast<double>(slots.size()) - total_ms) / trials);
    std::printf("run %d: %d trials, %zu slots, makespan %.0f ms, ideal %.0f ms, ratio %.3f\n", rep, trials, slots.size(),
                makespan_ms, ideal_ms, makespan_ms / ideal_ms);
  }
  std::printf("makespan / ideal        %s   goal <= 1.05\n", bench::show(bench::summarize(ratios), "").c_str());
  std::printf("overhead per trial      %s   (slot time not spent in the task: spawn, journal fsync, idle tail)\n",
              bench::show(bench::summarize(overheads), "ms").c_str());
  return 0;
}
