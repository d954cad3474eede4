// Example task library, loaded by `isorun` from <libdir>/isorun/tasks.
//   isorun --cpu hello name=world
//   isorun --cpu sum_squares arg0=1000000
// and three that misbehave, to show containment (tools/demo.sh):
//   isorun --cpu segfault                           -> crashed (exit 4)
//   isorun --cpu --timeout 1s nap arg0=60           -> timeout (exit 124)
//   isorun --cpu --mem-limit 256M fill_memory arg0=1024   -> out_of_memory (exit 3)
#include <time.h>
#include <unistd.h>

#include <cmath>
#include <string>
#include <vector>

#include "isorun/alloc/device_buffer.hpp"
#include "isorun/isorun.hpp"

namespace {

struct greeting_args {
  std::string name = "world";
  int repeat = 1;

  template <class Archive>
  void serialize(Archive& ar) {
    ar(CEREAL_NVP(name), CEREAL_NVP(repeat));
  }
};

struct greeting {
  std::string message;
  long pid = 0;
  std::string device;  // "cpu" or the assigned GPU's UUID

  template <class Archive>
  void serialize(Archive& ar) {
    ar(CEREAL_NVP(message), CEREAL_NVP(pid), CEREAL_NVP(device));
  }
};

greeting hello(const greeting_args& a) {
  greeting g;
  for (int i = 0; i < a.repeat; ++i) g.message += (i ? " " : "") + std::string("hello, ") + a.name;
  g.pid = static_cast<long>(::getpid());
  const auto& w = isorun::this_worker();
  g.device = w.has_gpu() ? w.device_uuid() : "cpu";
  return g;
}

double sum_squares(std::int64_t n) {
  double s = 0;
  for (std::int64_t i = 1; i <= n; ++i) s += static_cast<double>(i) * static_cast<double>(i);
  return s;
}

// Dereferences a null pointer: the worker dies by SIGSEGV, the supervisor reports it.
int segfault(int) {
  volatile int* nowhere = nullptr;
  return *nowhere;
}

// Sleeps `seconds`: stopped by --timeout (SIGTERM, then SIGKILL after --grace).
double nap(double seconds) {
  timespec left{static_cast<time_t>(seconds), static_cast<long>((seconds - std::floor(seconds)) * 1e9)};
  while (::nanosleep(&left, &left) != 0) {
  }
  return seconds;
}

// Takes `mib` MiB of device memory in 64 MiB buffers from the worker's capped allocator:
// past --mem-limit it fails with isorun::out_of_memory and the allocator's report.
int fill_memory(int mib) {
  auto& a = isorun::this_worker().allocator();
  std::vector<isorun::alloc::device_buffer> held;
  for (int taken = 0; taken < mib; taken += 64) held.emplace_back(a, 64u << 20);
  return mib;
}

}  // namespace

ISORUN_TASK(hello);
ISORUN_TASK(sum_squares);
ISORUN_TASK(segfault);
ISORUN_TASK(nap);
ISORUN_TASK(fill_memory);
