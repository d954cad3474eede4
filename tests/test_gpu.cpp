// Checks that need a real GPU and driver (ctest label `gpu`; tools/gpu-check.sh runs them with a
// summary). Without one the binary exits 77, which ctest reports as skipped.
//
// Lines starting with "gpu-check:" report figures (memory release times) that
// tools/gpu-check.sh checks against its goals; the tests themselves assert behaviour only.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checksum_cases.hpp"
#include "isorun/isorun.hpp"
#include "isorun/runner/gpu_inventory.hpp"
#include "isorun/runner/launcher.hpp"
#include "isorun/runner/process.hpp"
#include "isorun/runner/standby.hpp"
#include "isorun/runner/units.hpp"
#include "test_support.hpp"

using nlohmann::json;
namespace fs = std::filesystem;
using isorun::runner::gpu_inventory;

namespace {

constexpr std::uint64_t MiB = 1ULL << 20;

std::vector<std::string> with_tasks(std::vector<std::string> args) {
  args.insert(args.begin(), {"--tasks", CLI_TEST_TASKS});
  return args;
}

isorun::test::captured run(const std::vector<std::string>& args) {
  return isorun::test::run_captured(ISORUN_CLI, with_tasks(args), {isorun::test::real_gpus});
}

std::uint64_t free_memory() {
  auto g = gpu_inventory::probe(0);
  REQUIRE(g.has_value());
  return g->free_memory;
}

// Polls GPU 0 until its free memory is back within 4 MiB of `baseline` (a 30 s bound turns a
// leak into a failure instead of a hang); reports how long it took for gpu-check.sh.
void expect_released(std::uint64_t baseline, const char* after) {
  const auto t0 = std::chrono::steady_clock::now();
  bool back = false;
  while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30)) {
    if (free_memory() + 4 * MiB >= baseline) {
      back = true;
      break;
    }
    ::usleep(10'000);  // polling NVML, not synchronizing: nothing signals the driver's release
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf("gpu-check: release after %s: %.0f ms\n", after, ms);
  CHECK(back);
}

std::string temp_dir() {
  char dir[] = "/tmp/isorun-gpu-test-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  return dir;
}

// Reads `fd` until a line containing "ready" (true) or EOF (false).
bool wait_ready(int fd) {
  std::string seen;
  char buf[256];
  while (seen.find("ready") == std::string::npos) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) return false;
    seen.append(buf, static_cast<std::size_t>(n));
  }
  return true;
}

// Whether the worker came with its allocator (and so its CUDA context) made; then a 2 MiB
// allocation on the device.
int warm_trivial(int) {
  auto& w = isorun::this_worker();
  const bool warm = w.has_allocator();
  auto& a = w.allocator();
  a.deallocate(a.allocate(2 * MiB));
  return warm ? 1 : 0;
}

std::byte pattern_at(std::uint64_t i) { return static_cast<std::byte>((i * 2654435761u) >> 11); }

// `size` bytes of a pattern made in GPU memory (copied up piece by piece), returned with
// device_result: streamed through the worker's page-locked ring.
isorun::blob streamed_from_gpu(std::uint64_t size) {
  auto& w = isorun::this_worker();
  isorun::alloc::device_buffer d(w.allocator(), size);
  std::vector<std::byte> piece(16 * MiB);
  for (std::uint64_t off = 0; off < size; off += piece.size()) {
    const std::uint64_t n = std::min<std::uint64_t>(piece.size(), size - off);
    for (std::uint64_t i = 0; i < n; ++i) piece[i] = pattern_at(off + i);
    d.copy_from_host(piece.data(), n, off);
  }
  return w.device_result(d);
}

// The CUDA kernel behind checksum_chunks against libxxhash over every form of XXH3
// (checksum_cases.hpp, as test_alloc checks the simulated device), then 1 GiB after an 8-byte
// header, as device_result checksums it. Returns {compared, wrong, cases the backend declined,
// best of three 1 GiB runs in microseconds}.
std::vector<std::uint64_t> device_checksums(int) {
  auto& w = isorun::this_worker();
  auto& memory = w.allocator().memory();
  std::vector<unsigned char> bytes(3 * MiB + 77);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(pattern_at(i * 7 + 1));
  isorun::alloc::device_buffer buf(w.allocator(), bytes.size());
  buf.copy_from_host(bytes.data(), bytes.size());
  const auto cases = isorun::test::check_chunk_checksums(memory, buf.as<unsigned char>(), bytes);
  if (cases.wrong) std::fprintf(stderr, "first wrong checksum: %s\n", cases.first_wrong.c_str());
  std::uint64_t compared = cases.compared, wrong = cases.wrong, declined = cases.declined;
  // 1 GiB of one byte value: every whole chunk but the first has the same checksum.
  const std::uint64_t big = 1024 * MiB, length = big, chunk = 4 * MiB;
  isorun::alloc::device_buffer large(w.allocator(), big);
  memory.fill(large.data(), big, 0x5A, large.stream());
  std::vector<unsigned char> expect(chunk, 0x5A);
  std::memcpy(expect.data(), &length, sizeof length);
  const std::uint64_t first = XXH3_64bits(expect.data(), chunk);
  std::fill(expect.begin(), expect.end(), 0x5A);
  const std::uint64_t middle = XXH3_64bits(expect.data(), chunk), last = XXH3_64bits(expect.data(), sizeof length);
  std::vector<std::uint64_t> got((sizeof length + big + chunk - 1) / chunk);
  std::uint64_t best_us = ~0ULL;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!large.checksum_chunks(&length, sizeof length, big, chunk, got.data())) {
      ++declined;
      break;
    }
    best_us = std::min<std::uint64_t>(
        best_us,
        static_cast<std::uint64_t>(
            std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count()));
  }
  for (std::size_t c = 0; c < got.size(); ++c, ++compared)
    wrong += got[c] != (c == 0 ? first : c + 1 == got.size() ? last : middle);
  return {compared, wrong, declined, best_us};
}

}  // namespace

ISORUN_TASK(warm_trivial);
ISORUN_TASK(streamed_from_gpu);
ISORUN_TASK(device_checksums);

TEST_CASE("the worker sees exactly the assigned GPU, by UUID", "[gpu]") {
  const auto inv = gpu_inventory::detect();
  auto r = run({"-q", "--gpu", "0", "--mem-limit", "1G", "where"});
  REQUIRE(r.code == 0);
  CHECK(json::parse(r.out) == inv.gpus[0].uuid + " cap=" + std::to_string(1ULL << 30));
}

TEST_CASE("isorun --gpus 0 is --gpu 0 on a real GPU, and more GPUs than there are is refused", "[gpu]") {
  const auto inv = gpu_inventory::detect();
  auto one = run({"-q", "--gpus", "0", "--mem-limit", "2G", "device_info"});
  REQUIRE(one.code == 0);
  const json d = json::parse(one.out);
  CHECK(d["kind"] == "cuda");
  CHECK(d["cap"].get<std::uint64_t>() == (2ULL << 30) - d["context_counted"].get<std::uint64_t>());
  const std::string n = std::to_string(inv.gpus.size() + 1);
  auto too_many = run({"--gpus", "any:" + n, "--mem-limit", "1G", "where", "arg0=0"});
  CHECK(too_many.code == 2);
  CHECK_THAT(too_many.err, Catch::Contains(n + " GPUs asked for, but there"));
  if (inv.gpus.size() >= 2) {  // each device capped on its own, in PCI bus order
    auto two = run({"-q", "--gpus", "1,0", "--mem-limit", "1G", "where"});
    REQUIRE(two.code == 0);
    CHECK(json::parse(two.out) == inv.gpus[0].uuid + "," + inv.gpus[1].uuid + " cap=" + std::to_string(1ULL << 30));
  }
}

TEST_CASE("the cap is --mem-limit minus the measured CUDA context, and the allocator enforces it", "[gpu]") {
  auto info = run({"-q", "--gpu", "0", "--mem-limit", "2G", "device_info"});
  REQUIRE(info.code == 0);
  const json d = json::parse(info.out);
  CHECK(d["kind"] == "cuda");
  const auto counted = d["context_counted"].get<std::uint64_t>();
  const auto cap = d["cap"].get<std::uint64_t>();
  CHECK(counted >= d["context_process"].get<std::uint64_t>());
  CHECK(counted > 64 * MiB);  // a context is hundreds of MiB: it was measured, not left out
  CHECK(cap == (2ULL << 30) - counted);
  std::printf("gpu-check: context %llu MiB (NVML process %llu MiB, device delta %llu MiB)\n",
              static_cast<unsigned long long>(counted / MiB),
              static_cast<unsigned long long>(d["context_process"].get<std::uint64_t>() / MiB),
              static_cast<unsigned long long>(d["context_device_delta"].get<std::uint64_t>() / MiB));
  // Within the cap every strategy succeeds; one step past it is an OOM that names the context.
  const std::uint64_t fits = (cap / MiB - 8) / 8 * 8;
  for (const char* strategy : {"auto_growth", "expandable", "preallocate"}) {
    INFO(strategy);
    auto ok = run({"-q", "--gpu", "0", "--mem-limit", "2G", "--alloc-conf", std::string("strategy:") + strategy, "hog",
                   "arg0=" + std::to_string(fits)});
    CHECK(ok.code == 0);
    auto oom = run({"--gpu", "0", "--mem-limit", "2G", "--alloc-conf", std::string("strategy:") + strategy, "hog",
                    "arg0=" + std::to_string(cap / MiB + 8)});
    CHECK(oom.code == 3);
    CHECK_THAT(oom.err, Catch::Contains("CUDA context"));
  }
}

TEST_CASE("device memory as NVML sees it stays within --mem-limit while a task holds its whole cap", "[gpu]") {
  for (const char* strategy : {"auto_growth", "expandable", "preallocate"})
    for (const char* limit : {"1G", "2G", "8G"}) {
      INFO(strategy << " " << limit);
      const std::string dir = temp_dir(), ready = dir + "/ready", release = dir + "/release";
      REQUIRE(::mkfifo(ready.c_str(), 0600) == 0);
      REQUIRE(::mkfifo(release.c_str(), 0600) == 0);
      const std::uint64_t baseline = free_memory();
      auto task = isorun::test::start_captured(
          ISORUN_CLI,
          with_tasks({"-q", "--gpu", "0", "--mem-limit", limit, "--alloc-conf", std::string("strategy:") + strategy,
                      "hold_cap", "arg0=" + ready, "arg1=" + release}),
          {isorun::test::real_gpus});
      std::uint64_t reserved = 0;
      {
        std::ifstream in(ready);  // the task now holds everything its cap allows
        in >> reserved;
      }
      const std::uint64_t used = baseline - free_memory();
      std::printf("gpu-check: %s %s: device used %llu MiB, allocator reserved %llu MiB\n", strategy, limit,
                  static_cast<unsigned long long>(used / MiB), static_cast<unsigned long long>(reserved / MiB));
      CHECK(reserved > 0);
      CHECK(used <= isorun::parse_size(limit));
      std::ofstream(release) << "go" << std::endl;
      auto done = isorun::test::finish_captured(task);
      CHECK(done.code == 0);
      fs::remove_all(dir);
    }
}

TEST_CASE("GPU memory returns to its baseline after a worker exits, a kill -9 of isorun, and a timeout", "[gpu]") {
  const std::uint64_t baseline = free_memory();
  REQUIRE(run({"-q", "--gpu", "0", "--mem-limit", "2G", "hog", "arg0=512"}).code == 0);
  expect_released(baseline, "a worker's exit");

  if (std::string(CUDA_HOLD).empty()) {
    WARN("built without nvcc: no CUDA helper program for the -- CMD checks");
    return;
  }
  auto held = isorun::test::start_captured(ISORUN_CLI, {"--gpu", "0", "--", CUDA_HOLD, "1024"},
                                           {isorun::test::real_gpus});
  REQUIRE(wait_ready(held.out));
  CHECK(baseline - free_memory() >= 1024 * MiB);
  ::kill(held.process.pid(), SIGKILL);
  CHECK(isorun::test::finish_captured(held).code == 128 + SIGKILL);
  expect_released(baseline, "kill -9 of isorun while a CUDA child held 1 GiB");

  auto timed = isorun::test::start_captured(
      ISORUN_CLI, {"--gpu", "0", "--timeout", "20s", "--grace", "200ms", "--", CUDA_HOLD, "1024"},
      {isorun::test::real_gpus});
  REQUIRE(wait_ready(timed.out));
  CHECK(isorun::test::finish_captured(timed).code == 124);
  expect_released(baseline, "--timeout while a CUDA child held 1 GiB");
}

TEST_CASE("a warm standby worker has its CUDA context before the call; an early result; memory back after", "[gpu]") {
  namespace r = isorun::runner;
  const std::uint64_t baseline = free_memory();
  const isorun::isolated_options opts{
      .gpu = 0, .mem_limit = 2048 * MiB, .standby = 1, .warm_context = true, .early_result = true};
  auto& pool = r::standby_for(
      r::launch_spec_for(r::job_spec_for("warm_trivial", isorun::serialization::encoding::binary, {},
                                         {isorun::gpus().gpus.at(0)}, opts)),
      1);
  pool.fill();
  // The waiting worker's context shows on the device before any call (polling NVML: nothing
  // signals a context's creation; a 30 s bound turns a worker that never warms into a failure).
  const auto t0 = std::chrono::steady_clock::now();
  while (baseline - std::min(baseline, free_memory()) < 100 * MiB &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30))
    ::usleep(10'000);
  REQUIRE(baseline - std::min(baseline, free_memory()) >= 100 * MiB);
  const auto called = std::chrono::steady_clock::now();
  auto res = isorun::isolated(warm_trivial, opts).try_call(0);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - called).count();
  REQUIRE(res.ok());
  CHECK(res.value() == 1);           // it did not have to create its context
  CHECK(res.status().exit_pending);  // handed over before the context's teardown
  std::printf("gpu-check: trivial CUDA task on a warm standby worker, early result: %.1f ms\n", ms);
  isorun::stop_standby();  // the replacement worker, warm too, is stopped
  expect_released(baseline, "a warm standby call and stop_standby()");
}

TEST_CASE("a result made on the GPU streams back whole through the page-locked ring; memory back after", "[gpu]") {
  const std::uint64_t baseline = free_memory();
  for (const bool early : {false, true}) {
    const std::uint64_t size = 300 * MiB + 7;
    auto r =
        isorun::isolated(streamed_from_gpu, {.gpu = 0, .mem_limit = 2048 * MiB, .early_result = early}).try_call(size);
    REQUIRE(r.ok());
    CHECK(r.status().exit_pending == early);
    const isorun::blob& b = r.value();
    REQUIRE(b.size() == size);
    std::uint64_t wrong = 0;
    for (std::uint64_t i = 0; i < size; ++i) wrong += b.data()[i] != pattern_at(i);
    CHECK(wrong == 0);
  }
  expect_released(baseline, "a streamed GPU result");
}

TEST_CASE("chunk checksums computed on the GPU are libxxhash's XXH3, in every form", "[gpu]") {
  const auto r = isorun::isolated(device_checksums, {.gpu = 0, .mem_limit = 2048 * MiB})(0);
  REQUIRE(r.size() == 4);
  CHECK(r[2] == 0);  // the kernel ran every time (no fallback to the host)
  CHECK(r[0] > 300);
  CHECK(r[1] == 0);
  std::printf("gpu-check: device checksums of 1 GiB (4 MiB chunks): %.2f ms\n", static_cast<double>(r[3]) / 1000);
}

TEST_CASE("a CUDA program run with -- under --mem-limit is held to the cap by the real driver", "[gpu]") {
  if (std::string(CUDA_HOLD).empty()) {
    WARN("built without nvcc: no CUDA helper program for the -- CMD checks");
    return;
  }
  auto refused = run({"--gpu", "0", "--mem-limit", "512M", "--", CUDA_HOLD, "1024"});
  CHECK(refused.code == 1);  // cudaMalloc failed: the program's own error
  CHECK_THAT(refused.err, Catch::Contains("out of memory"));
  CHECK_THAT(refused.err, Catch::Contains("reached its --mem-limit of 512.00 MiB"));

  const std::uint64_t baseline = free_memory();
  auto held = isorun::test::start_captured(ISORUN_CLI, {"--gpu", "0", "--mem-limit", "2G", "--", CUDA_HOLD, "1024"},
                                           {isorun::test::real_gpus});
  REQUIRE(wait_ready(held.out));
  const std::uint64_t used = baseline - std::min(baseline, free_memory());
  std::printf("gpu-check: cuda_hold 1024 under --mem-limit 2G -- CMD: device memory used %llu MiB\n",
              static_cast<unsigned long long>(used / MiB));
  CHECK(used >= 1024 * MiB);
  CHECK(used <= 2048 * MiB);
  ::kill(held.process.pid(), SIGKILL);
  isorun::test::finish_captured(held);
}

TEST_CASE("expandable on the CUDA backend: one map call per run, and unmapping waits for a running kernel", "[gpu]") {
  if (std::string(EXPANDABLE_UNMAP).empty()) {
    WARN("built without nvcc: no CUDA helper program for the expandable check");
    return;
  }
  auto r = isorun::test::run_captured(EXPANDABLE_UNMAP, {}, {isorun::test::real_gpus});
  INFO(r.out << r.err);
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("1 map call(s) for 256 MiB") && Catch::Contains("kernel: no error"));
}

TEST_CASE("the digits classifier trains on the GPU and agrees with the CPU", "[gpu][digits]") {
  const std::vector<std::string> params = {"digits", "model=mlp", "lr=0.1", "hidden=64", "epochs=30", "seed=1"};
  auto with = [&](std::vector<std::string> head) {
    head.insert(head.end(), params.begin(), params.end());
    auto r = run(head);
    REQUIRE(r.code == 0);
    return json::parse(r.out);
  };
  json gpu = with({"-q", "--gpu", "0", "--mem-limit", "2G"});
  json cpu = with({"-q", "--cpu"});
  CHECK(gpu["device"] == "cuda:" + gpu_inventory::detect().gpus[0].uuid);
  CHECK(gpu["accuracy"].get<double>() >= 0.95);
  CHECK(std::abs(gpu["accuracy"].get<double>() - cpu["accuracy"].get<double>()) <= 0.02);
  CHECK(std::abs(gpu["test_loss"].get<double>() - cpu["test_loss"].get<double>()) <= 0.05);
  std::printf("gpu-check: digits mlp accuracy GPU %.4f, CPU %.4f\n", gpu["accuracy"].get<double>(),
              cpu["accuracy"].get<double>());
  auto softmax = run(
      {"-q", "--gpu", "0", "--mem-limit", "1G", "--alloc-conf", "strategy:expandable", "digits", "model=softmax"});
  CHECK(softmax.code == 0);
}

TEST_CASE("the digits sweep on GPU 0: every trial succeeds on the GPU", "[gpu][digits]") {
  const std::string dir = temp_dir();
  const std::string uuid = gpu_inventory::detect().gpus[0].uuid;
  auto r = isorun::test::run_captured(ISORUN_CLI,
                                      {"sweep", ISORUN_SOURCE_DIR "/examples/digits/digits_sweep.yaml", "--gpus", "0",
                                       "--mem-limit", "1G", "--out", dir + "/out", "--no-progress"},
                                      {isorun::test::real_gpus});
  CHECK(r.code == 0);
  std::ifstream journal(dir + "/out/results.jsonl");
  int trials = 0, succeeded = 0;
  double best = 0;
  for (std::string line; std::getline(journal, line);) {
    const json rec = json::parse(line);
    ++trials;
    succeeded += rec["outcome"] == "success";
    CHECK(rec["device"] == uuid);
    if (rec["outcome"] == "success") {
      CHECK(rec["result"]["device"] == "cuda:" + uuid);
      best = std::max(best, rec["result"]["accuracy"].get<double>());
    }
  }
  std::printf("gpu-check: digits sweep %d/%d succeeded, best accuracy %.4f\n", succeeded, trials, best);
  CHECK(trials == 48);
  CHECK(succeeded == 48);
  CHECK(best >= 0.95);
  fs::remove_all(dir);
}

int main(int argc, char** argv) {
  isorun::init(argc, argv);  // this program is its own worker for the isolated() checks
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]).rfind("--list", 0) == 0) return Catch::Session().run(argc, argv);
  // The real inventory (not a simulated one) and a driver that works: a stand-in NVML, or NVML
  // without a usable CUDA driver, is not a GPU to test on.
  ::unsetenv("ISORUN_SIMULATE_GPUS");
  const auto inv = gpu_inventory::detect();
  if (inv.gpus.empty()) {
    std::printf("no GPU (%s): skipping the GPU checks\n", inv.describe_source().c_str());
    return 77;
  }
  void* cuda = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  auto cu_init = cuda ? reinterpret_cast<int (*)(unsigned)>(::dlsym(cuda, "cuInit")) : nullptr;
  if (!cu_init || cu_init(0) != 0) {
    std::printf("NVML lists a GPU but the CUDA driver is not usable (%s): skipping the GPU checks\n",
                cuda ? "cuInit failed" : "libcuda.so.1 not found");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
