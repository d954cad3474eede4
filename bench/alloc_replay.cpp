// Replays allocation traces against each allocator strategy and reports ns/op (p50, p99, and
// p99 under a tight cap), peak reserved, fragmentation and the smallest cap at which the trace
// completes (bisection, 2 MiB steps). See bench/README.md.
//   alloc_replay [--quick] [--only PREFIX]  the built-in traces (or those whose name starts so)
//   alloc_replay --trace FILE               one trace file ("a ID SIZE STREAM" / "f ID" lines)
//   alloc_replay --write NAME FILE          write a built-in trace (random, churn, ramp, gpt2, resnet50)
//   alloc_replay --backend cuda ...         time on GPU 0 through the CUDA backend (the smallest
//                                           caps are found on the host backend: the policy is the same)
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "alloc_traces.hpp"
#include "isorun/alloc/caching_allocator.hpp"
#include "isorun/alloc/cuda_module.hpp"
#include "isorun/alloc/host_backend.hpp"

using namespace isorun;
using namespace isorun::bench;
constexpr std::uint64_t MiB = 1 << 20;

namespace {

std::int64_t now_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return std::int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

struct replay_result {
  bool completed = true;
  std::vector<double> ns;
  std::int64_t peak_reserved = 0, peak_allocated = 0;
};

bool on_cuda = false;  // --backend cuda: timed replays run on GPU 0

std::unique_ptr<alloc::backend> make_backend(bool cuda) {
  if (!cuda) return std::make_unique<alloc::host_backend>(1ULL << 40);
  char error[512] = {};
  alloc::cuda_context_info context;
  std::unique_ptr<alloc::backend> b(
      alloc::load_cuda_module().create_backend(nullptr, 0, &context, error, sizeof error));
  if (!b) throw std::runtime_error(error);
  return b;
}

replay_result replay(const trace& t, const char* conf, std::uint64_t cap, bool timed) {
  replay_result r;
  alloc::caching_allocator a(make_backend(timed && on_cuda), cap, alloc::alloc_config::parse(conf));
  std::vector<void*> ptr;
  if (timed) r.ns.reserve(t.size());
  try {
    for (const auto& e : t) {
      if (e.id >= ptr.size()) ptr.resize(e.id + 1, nullptr);
      const auto t0 = timed ? now_ns() : 0;
      if (e.alloc) ptr[e.id] = a.allocate(e.size, e.stream);
      else a.deallocate(ptr[e.id]);
      if (timed) r.ns.push_back(double(now_ns() - t0));
    }
  } catch (const out_of_memory&) {
    r.completed = false;
  }
  const auto s = a.stats();
  r.peak_reserved = s.reserved_bytes.peak;
  r.peak_allocated = s.allocated_bytes.peak;
  return r;
}

std::uint64_t smallest_cap(const trace& t, const char* conf, std::uint64_t peak) {
  std::uint64_t lo = std::max<std::uint64_t>(peak / (2 * MiB), 1) * 2 * MiB, hi = lo;
  while (!replay(t, conf, hi, false).completed) hi *= 2;
  if (replay(t, conf, lo, false).completed) return lo;
  while (hi - lo > 2 * MiB) {  // invariant: lo fails, hi completes
    std::uint64_t mid = (lo + hi) / 2 / (2 * MiB) * (2 * MiB);
    if (mid <= lo) mid = lo + 2 * MiB;
    (replay(t, conf, mid, false).completed ? hi : lo) = mid;
  }
  return hi;
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(q * double(v.size() - 1))];
}

void run(const std::string& name, const trace& t) {
  const std::uint64_t peak = peak_requested(t);
  std::printf("\n%s: %zu events, peak requested %.1f MiB\n", name.c_str(), t.size(), double(peak) / MiB);
  std::printf("  %-16s %8s %8s %12s %14s %10s %14s %9s %9s\n", "strategy", "p50 ns", "p99 ns", "p99@1.05x ns",
              "peak reserved", "frag@1.25x", "smallest cap", "cap/peak", "frag@min");
  const std::pair<const char*, const char*> strategies[] = {{"auto_growth", "strategy:auto_growth"},
                                                            {"expandable", "strategy:expandable"},
                                                            {"preallocate", "strategy:preallocate"},
                                                            {"pytorch_compat", "pytorch_compat:true"}};
  for (auto [label, conf] : strategies) {
    // Measured under a realistic cap, 1.25x the peak request: a caching allocator with unlimited
    // room never releases anything, which says nothing about how well it packs.
    const std::uint64_t working = (peak + peak / 4 + 2 * MiB - 1) / (2 * MiB) * (2 * MiB);
    const std::uint64_t min_cap = smallest_cap(t, conf, peak);
    // preallocate takes its whole cap up front: give it the smallest cap that works.
    const bool fixed = std::string(label) == "preallocate";
    auto r = replay(t, conf, fixed ? min_cap : std::max(working, min_cap), true);
    const double frag = r.peak_reserved ? 1.0 - double(r.peak_allocated) / double(r.peak_reserved) : 0;
    auto tight = replay(t, conf, min_cap, false);
    const double frag_min = tight.peak_reserved ? 1.0 - double(tight.peak_allocated) / double(tight.peak_reserved) : 0;
    // Under pressure: 1.05x the peak request (or the smallest cap, where that is more), where
    // a strategy must give memory back and take it again as it goes.
    const std::uint64_t pressed = std::max(min_cap, (peak + peak / 20 + 2 * MiB - 1) / (2 * MiB) * (2 * MiB));
    auto under = fixed ? r : replay(t, conf, pressed, true);
    std::printf("  %-16s %8.0f %8.0f %12.0f %10.1f MiB %9.1f%% %10.1f MiB %9.3f %8.1f%%\n", label,
                percentile(r.ns, 0.5), percentile(r.ns, 0.99), percentile(under.ns, 0.99),
                double(r.peak_reserved) / MiB, frag * 100, double(min_cap) / MiB, double(min_cap) / double(peak),
                frag_min * 100);
  }
}

std::map<std::string, trace> builtin(bool quick) {
  std::map<std::string, trace> m;
  m["random_1k_1MiB"] = random_trace(1000, 1 * MiB, 1);
  m["random_10k_64MiB"] = random_trace(10000, 64 * MiB, 2);
  m["random_100k_1GiB"] = random_trace(quick ? 20000 : 100000, 1024 * MiB, 3);
  m["churn_4MiB"] = churn_trace(20000, 4 * MiB);
  m["ramp_batch"] = ramp_trace(32, 3 * MiB + 12345);
  m["gpt2_small_step"] = gpt2_step();
  m["resnet50_step"] = resnet50_step();
  return m;
}

}  // namespace

void print_header() {
  std::printf(
      "allocation trace replay on the %s backend; timings and peaks under a cap of 1.25x the peak request\n"
      "(preallocate: its smallest cap), p99@1.05x under 1.05x; fragmentation = 1 - peak allocated / peak\n"
      "reserved, under that cap (frag@1.25x: includes what the cache keeps because it may) and under the\n"
      "smallest cap (frag@min)%s\n",
      on_cuda ? "CUDA (GPU 0)" : "host", on_cuda ? "; smallest caps found on the host backend" : "");
}

int usage(const char* why) {
  std::fprintf(stderr,
               "alloc_replay: %s\n"
               "usage: alloc_replay [--backend host|cuda] [--quick] [--only PREFIX]\n"
               "       alloc_replay [--backend host|cuda] --trace FILE\n"
               "       alloc_replay --write NAME FILE\n",
               why);
  return 2;
}

int main(int argc, char** argv) {
  bool quick = false;
  std::string only, trace_file, write_name, write_file;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--quick") quick = true;
    else if (a == "--only" && has_value) only = argv[++i];
    else if (a == "--trace" && has_value) trace_file = argv[++i];
    else if (a == "--write" && i + 2 < argc) write_name = argv[++i], write_file = argv[++i];
    else if (a == "--backend" && has_value) {
      const std::string b = argv[++i];
      if (b != "host" && b != "cuda") return usage(("--backend " + b + ": expected host or cuda").c_str());
      on_cuda = b == "cuda";
    } else return usage(("unknown or incomplete argument " + a).c_str());
  }
  if (!write_name.empty()) {
    for (auto& [name, t] : builtin(false))
      if (name.rfind(write_name, 0) == 0) {
        std::ofstream out(write_file);
        write_trace(out, t);
        if (!out.flush()) return std::fprintf(stderr, "alloc_replay: cannot write %s\n", write_file.c_str()), 1;
        return 0;
      }
    return usage(("no built-in trace named " + write_name).c_str());
  }
  if (on_cuda) {
    try {
      make_backend(true);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "alloc_replay: --backend cuda: %s\n", e.what());
      return 2;
    }
  }
  if (!trace_file.empty()) {
    std::ifstream in(trace_file);
    if (!in) return usage(("cannot open " + trace_file).c_str());
    trace t;
    try {
      t = read_trace(in);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "alloc_replay: %s: %s\n", trace_file.c_str(), e.what());
      return 2;
    }
    for (const auto& e : t)
      if (on_cuda && e.stream != 0) {
        // A stream id is a cudaStream_t on the CUDA backend, and this program creates none.
        std::fprintf(stderr, "alloc_replay: %s: uses stream %llu; --backend cuda replays stream 0 only\n",
                     trace_file.c_str(), static_cast<unsigned long long>(e.stream));
        return 2;
      }
    print_header();
    run(trace_file, t);
    return 0;
  }
  print_header();
  for (auto& [name, t] : builtin(quick))
    if (name.rfind(only, 0) == 0) run(name, t);
  return 0;
}
