// Cached allocate+free pair latency: isorun's caching allocator (host backend) side by side with
// glibc malloc, mimalloc and jemalloc (both loaded with dlopen, so glibc stays the process's
// malloc). Run: bench_alloc (defaults to 10 repetitions, median/stddev reported).
#include <benchmark/benchmark.h>
#include <dlfcn.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "isorun/alloc/caching_allocator.hpp"
#include "isorun/alloc/host_backend.hpp"

namespace {

using malloc_fn = void* (*)(std::size_t);
using free_fn = void (*)(void*);

struct foreign {
  malloc_fn alloc = nullptr;
  free_fn release = nullptr;
};

foreign load(const char* lib, const char* alloc_name, const char* free_name) {
  foreign f;
  if (void* h = ::dlopen(lib, RTLD_NOW | RTLD_LOCAL)) {
    f.alloc = reinterpret_cast<malloc_fn>(::dlsym(h, alloc_name));
    f.release = reinterpret_cast<free_fn>(::dlsym(h, free_name));
  }
  return f;
}

void pair_isorun(benchmark::State& state) {
  isorun::alloc::caching_allocator a(std::make_unique<isorun::alloc::host_backend>(1ULL << 32), 1ULL << 32);
  const auto n = static_cast<std::size_t>(state.range(0));
  a.deallocate(a.allocate(n));  // warm: the block is cached
  for (auto _ : state) {
    void* p = a.allocate(n);
    benchmark::DoNotOptimize(p);
    a.deallocate(p);
  }
}

void pair_glibc(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    void* p = std::malloc(n);
    benchmark::DoNotOptimize(p);
    std::free(p);
  }
}

void pair_foreign(benchmark::State& state, foreign f) {
  if (!f.alloc || !f.release) {
    state.SkipWithError("library not available");
    return;
  }
  const auto n = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    void* p = f.alloc(n);
    benchmark::DoNotOptimize(p);
    f.release(p);
  }
}

}  // namespace

BENCHMARK(pair_isorun)->Arg(256)->Arg(64 << 10)->Arg(4 << 20);
BENCHMARK(pair_glibc)->Arg(256)->Arg(64 << 10)->Arg(4 << 20);
BENCHMARK_CAPTURE(pair_foreign, mimalloc, load("libmimalloc.so.2", "mi_malloc", "mi_free"))
    ->Arg(256)
    ->Arg(64 << 10)
    ->Arg(4 << 20);
BENCHMARK_CAPTURE(pair_foreign, jemalloc, load("libjemalloc.so.2", "malloc", "free"))
    ->Arg(256)
    ->Arg(64 << 10)
    ->Arg(4 << 20);

int main(int argc, char** argv) {
  std::vector<char*> args(argv, argv + argc);
  std::string reps = "--benchmark_repetitions=10", agg = "--benchmark_report_aggregates_only=true";
  if (argc == 1) {
    args.push_back(reps.data());
    args.push_back(agg.data());
  }
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
