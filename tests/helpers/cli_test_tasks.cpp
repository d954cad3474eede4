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

// Fails with bytes that are not UTF-8 (a Latin-1 byte, a cut sequence) in its stderr and its
// message, as a C library's output may: arguments cannot carry them (they must be UTF-8).
int fail_latin1(int) {
  std::fputs("r\xe9sum\xe9 \xff\n", stderr);
  std::fflush(stderr);
  throw std::domain_error("caf\xe9 \xc3");
}

int crash(int) {
  ::raise(SIGSEGV);
  return 0;
}

int oom(int) { throw isorun::out_of_memory("requested 3.00 GiB with 2.00 GiB cap (test)"); }

// Prints its pid (to the supervisor's stderr, as task stdout goes there) and waits.
int wait_forever(int) {
  std::printf("worker-pid %d\n", static_cast<int>(::getpid()));
  std::fflush(stdout);
  for (;;) ::pause();
}

// Like wait_forever, but ignores SIGTERM: only SIGKILL stops it.
int stubborn(int) {
  ::signal(SIGTERM, SIG_IGN);
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
ISORUN_TASK(fail_latin1);
ISORUN_TASK(crash);
ISORUN_TASK(oom);
ISORUN_TASK(wait_forever);
ISORUN_TASK(stubborn);
ISORUN_TASK(where);

namespace {
// A result of `mib` MiB: it passes through a shared memory segment of that size.
std::string filled(int mib) { return std::string(static_cast<std::size_t>(mib) << 20, 'x'); }
}  // namespace
ISORUN_TASK(filled);

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

namespace {
// The worker's device as the allocator sees it: its cap and what the CUDA context took.
struct device_report {
  std::string kind;
  std::uint64_t cap = 0;
  std::uint64_t context_counted = 0, context_process = 0, context_device_delta = 0;
  template <class A>
  void serialize(A& ar) {
    ar(CEREAL_NVP(kind), CEREAL_NVP(cap), CEREAL_NVP(context_counted), CEREAL_NVP(context_process),
       CEREAL_NVP(context_device_delta));
  }
};

device_report device_info(int) {
  auto& w = isorun::this_worker();
  device_report r;
  r.cap = w.allocator().cap();
  r.kind = to_string(w.kind());
  r.context_counted = w.context_info().counted_bytes;
  r.context_process = w.context_info().process_bytes;
  r.context_device_delta = w.context_info().device_delta_bytes;
  return r;
}

// Takes everything the cap allows (8 MiB steps, then 2 MiB ones), says so on the FIFO `ready`
// and holds it until the FIFO `release` is opened and closed by the test.
std::uint64_t hold_cap(const std::string& ready, const std::string& release) {
  auto& a = isorun::this_worker().allocator();
  std::vector<isorun::alloc::device_buffer> held;
  for (std::size_t step : {8u << 20, 2u << 20}) {
    try {
      for (;;) held.emplace_back(a, step);
    } catch (const isorun::out_of_memory&) {
    }
  }
  const auto reserved = static_cast<std::uint64_t>(a.stats().reserved_bytes.current);
  std::ofstream(ready) << reserved << std::endl;
  std::ifstream wait(release);
  std::string ignored;
  std::getline(wait, ignored);
  return reserved;
}

// Host code that writes into memory from the device allocator: fine on a CPU worker, where the
// allocator hands out host memory; a crash on a GPU, real or simulated.
int touch_device(int) {
  isorun::alloc::device_buffer b(isorun::this_worker().allocator(), 4096);
  static_cast<volatile char*>(b.data())[0] = 1;
  return 0;
}
}  // namespace
ISORUN_TASK(device_info);
ISORUN_TASK(hold_cap);
ISORUN_TASK(touch_device);
