// Tasks for the CLI tests, loaded with --tasks.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "isorun/alloc/device_buffer.hpp"
#include "isorun/isorun.hpp"

namespace {

struct typed_args {
  int n = 1;
  double x = 0.5;
  bool flag = false;
  std::string s = "text";
  std::vector<int> v = {1, 2};
  template <class A>
  void serialize(A& ar) {
    ar(CEREAL_NVP(n), CEREAL_NVP(x), CEREAL_NVP(flag), CEREAL_NVP(s), CEREAL_NVP(v));
  }
};

typed_args typed(const typed_args& a) { return a; }

bool touch(const std::string& path) {
  std::ofstream(path) << "ran\n";
  return true;
}

int fail(const std::string& message) { throw std::domain_error(message); }

int crash(int) {
  ::raise(SIGSEGV);
  return 0;
}

int oom(int) {
  throw isorun::out_of_memory("requested 3.00 GiB with 2.00 GiB cap (test)");
}

// Prints its pid (to the supervisor's stderr, as task stdout goes there) and waits.
int wait_forever(int) {
  std::printf("worker-pid %d\n", static_cast<int>(::getpid()));
  std::fflush(stdout);
  for (;;) ::pause();
}

std::string where(int) {
  const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
  return std::string(v ? v : "<unset>") + " cap=" + std::to_string(isorun::this_worker().mem_limit());
}

}  // namespace

ISORUN_TASK(typed);
ISORUN_TASK(touch);
ISORUN_TASK(fail);
ISORUN_TASK(crash);
ISORUN_TASK(oom);
ISORUN_TASK(wait_forever);
ISORUN_TASK(where);

namespace {
// Allocates `mib` MiB through the worker's capped allocator, in 8 MiB steps.
std::string hog(int mib) {
  auto& a = isorun::this_worker().allocator();
  std::vector<isorun::alloc::device_buffer> held;
  for (int i = 0; i < mib; i += 8) held.emplace_back(a, 8u << 20);
  return "held " + std::to_string(mib) + " MiB under a cap of " + std::to_string(a.cap() >> 20) + " MiB";
}
}  // namespace
ISORUN_TASK(hog);
