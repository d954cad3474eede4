// The cost of the `-- CMD` memory cap per allocation: pairs of cuMemAlloc_v2/cuMemFree_v2,
// cuMemAllocAsync/cuMemFreeAsync (a stream-ordered pool) and cuMemCreate/cuMemRelease (the
// virtual-memory API; cuMemMap is not interposed) in a command run under `--mem-limit` (the cap
// library preloaded) and under `--mem-limit-mode advisory` (nothing preloaded), alternating in
// one run. Against the stand-in driver of the
// tests by default (its own pair costs an mmap and a munmap); `--real` uses the machine's driver.
// For cuMemAlloc pairs also with `--memory-timeline` (each pair two events in the ledger's ring).
//   bench_cap [--real] [--pairs N] [--runs R]
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "isorun/runner/process.hpp"
#include "stats.hpp"
#include "test_support.hpp"

int main(int argc, char** argv) {
  bool real = false;
  std::string pairs = "200000";
  int runs = 7;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--real") real = true;
    else if (a == "--pairs" && i + 1 < argc) pairs = argv[++i];
    else if (a == "--runs" && i + 1 < argc) runs = std::atoi(argv[++i]);
  }
  std::vector<std::string> env = {real ? isorun::test::real_gpus : std::string("ISORUN_SIMULATE_GPUS=1x16G")};
  if (!real) env.push_back(std::string("LD_LIBRARY_PATH=") + FAKE_CUDA_DIR);
  const std::string page = "/tmp/bench_cap-timeline-" + std::to_string(::getpid()) + ".html";
  auto pair_ns = [&](bool capped, const std::string& kind, bool timeline = false) {
    std::vector<std::string> args = {"--gpu", "0", "--mem-limit", "8G", "-q"};
    if (!capped) args.insert(args.end(), {"--mem-limit-mode", "advisory"});
    if (timeline) args.insert(args.end(), {"--memory-timeline", page});
    args.insert(args.end(), {"--", CAP_PROBE, "time", pairs, kind});
    auto r = isorun::test::run_captured(ISORUN_CLI, args, env);
    double ns = 0;
    if (r.code != 0 || std::sscanf(r.out.c_str(), "time %lf", &ns) != 1) {
      std::fprintf(stderr, "bench_cap: the probe failed: %s%s\n", r.out.c_str(), r.err.c_str());
      std::exit(1);
    }
    return ns;
  };
  using isorun::bench::show;
  using isorun::bench::summarize;
  const std::pair<const char*, const char*> kinds[] = {{"plain", "cuMemAlloc_v2 + cuMemFree_v2 of 64 KiB"},
                                                       {"async", "cuMemAllocAsync + cuMemFreeAsync of 64 KiB"},
                                                       {"create", "cuMemCreate + cuMemRelease of 2 MiB"}};
  for (const auto& [kind, what] : kinds) {
    const bool with_timeline = std::string(kind) == "plain";
    std::vector<double> capped, plain, added, kept, added_by_timeline;
    for (int i = 0; i < runs; ++i) {
      capped.push_back(pair_ns(true, kind));
      plain.push_back(pair_ns(false, kind));
      added.push_back(capped.back() - plain.back());
      if (with_timeline) {
        kept.push_back(pair_ns(true, kind, true));
        added_by_timeline.push_back(kept.back() - capped.back());
      }
    }
    std::printf("%s, %s driver, %s pairs per run\n", what, real ? "the real" : "the stand-in", pairs.c_str());
    std::printf("  under --mem-limit (capped)   %s\n", show(summarize(capped), "ns").c_str());
    std::printf("  advisory (nothing preloaded) %s\n", show(summarize(plain), "ns").c_str());
    std::printf("  added by the cap, per pair   %s   goal <= 1000 ns\n", show(summarize(added), "ns").c_str());
    if (with_timeline) {
      std::printf("  capped, --memory-timeline    %s\n", show(summarize(kept), "ns").c_str());
      std::printf("  added by the timeline        %s\n", show(summarize(added_by_timeline), "ns").c_str());
    }
  }
  std::remove(page.c_str());
  return 0;
}
