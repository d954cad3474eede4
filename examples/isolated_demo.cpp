// The decorator-style API in one file: build, then run ./build/bin/isolated_demo
#include <cstdio>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "isorun/isorun.hpp"

using namespace std::chrono_literals;
using namespace isorun::literals;

struct stats {
  double mean = 0;
  double max = 0;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(CEREAL_NVP(mean), CEREAL_NVP(max));
  }
};

stats summarize(const std::vector<double>& xs) {
  if (xs.empty()) throw std::invalid_argument("summarize: empty input");
  stats s;
  for (double x : xs) {
    s.mean += x / static_cast<double>(xs.size());
    s.max = std::max(s.max, x);
  }
  return s;
}
ISORUN_TASK(summarize);

// A blob made in the worker's device memory (a GPU's with .gpu; host memory in a CPU worker),
// streamed back with device_result.
isorun::blob ramp(std::uint64_t n) {
  auto& w = isorun::this_worker();
  isorun::alloc::device_buffer out(w.allocator(), n * sizeof(float));
  std::vector<float> host(n);
  std::iota(host.begin(), host.end(), 0.0f);
  out.copy_from_host(host.data(), n * sizeof(float));  // on a GPU, kernels would write it
  return w.device_result(out);                         // streamed to the caller: return it as the whole result
}
ISORUN_TASK(ramp);

int main(int argc, char** argv) {
  isorun::init(argc, argv);  // a worker runs its task here and exits; the parent continues

  auto f = isorun::isolated(summarize, {.mem_limit = 1_GiB, .timeout = 30s});
  stats s = f(std::vector<double>{1, 2, 3, 4});
  std::printf("mean %.2f max %.2f (computed in a fresh process)\n", s.mean, s.max);

  try {
    f(std::vector<double>{});
  } catch (const isorun::task_error& e) {
    std::printf("task_error rethrown in the caller: %s: %s\n", e.type_name().c_str(), e.message().c_str());
  }

  auto handle = f.async(std::vector<double>{10, 20});
  std::printf("async result: max %.1f\n", handle.get().max);

  isorun::blob b = isorun::isolated(ramp, {.early_result = true})(1 << 20);  // 4 MiB, streamed
  float last = 0;
  std::memcpy(&last, b.data() + b.size() - sizeof last, sizeof last);
  std::printf("streamed blob: %zu bytes, last value %.0f\n", b.size(), last);
  return 0;
}
