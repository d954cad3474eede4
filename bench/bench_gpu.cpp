// GPU benchmarks, each against its physical reference measured in the same run (skipped, exit 77,
// without an NVIDIA GPU):
//   (a) a result made on the GPU: from the task's device buffer being ready to the supervisor
//       holding a validated view (checksum included), against a bare cudaMemcpy into
//       cudaHostAlloc'ed memory;
//   (b) a cold trivial CUDA task, isolated, against a bare process that initialises CUDA,
//       allocates 2 MiB and exits;
//   (c) what the CLI itself costs with --gpu (NVML) against --cpu;
//   (d) a trivial CUDA task on a warm standby worker, waiting for the worker's exit and with
//       early_result, against a bare CUDA process's exit (its context's teardown).
//   bench_gpu [--quick] [--only abcd] [--sizes MiB,MiB...] [--reps N] [--streamed-only]
//   BENCH_BREAKDOWN=1 prints each transfer's times; ISORUN_STREAM_TRACE=1 where a streamed
//   result's time goes (ISORUN_STREAM_THREADS=READERS,HASHERS to try other thread counts).
//   (a) runs the streamed result with its chunks checksummed on the device (the default) and,
//   interleaved, hashed by the worker's CPU (ISORUN_STREAM_DEVICE_HASH=0).
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_gpu_cuda.hpp"
#include "isorun/alloc/device_buffer.hpp"
#include "isorun/isorun.hpp"
#include "isorun/runner/job.hpp"
#include "isorun/runner/launcher.hpp"
#include "isorun/runner/process.hpp"
#include "isorun/runner/queued_job.hpp"
#include "isorun/runner/standby.hpp"
#include "isorun/serialization/control.hpp"
#include "spawn.hpp"
#include "stats.hpp"

extern char** environ;

namespace {
using namespace isorun;
using bench::show;
using bench::spawn_ms;
using bench::summarize;
constexpr std::uint64_t MiB = 1ULL << 20;

// The clock the worker and the supervisor stamp results with (job_result::received_ns).
using serialization::monotonic_ns;

// A result made on the GPU and handed back the way a task should: device_result, which
// streams it to the supervisor. Its first 8 bytes are overwritten (on the device) with the
// moment the device buffer was ready.
blob gpu_result(std::uint64_t size) {
  auto& w = this_worker();
  alloc::device_buffer d(w.allocator(), size);
  bench_gpu::fill_device(d.data(), size);
  const std::int64_t ready = monotonic_ns();
  d.copy_from_host(&ready, sizeof ready);
  blob out = w.device_result(d);
  if (std::getenv("BENCH_BREAKDOWN"))
    std::fprintf(stderr, "      worker: device_result (DMA into the ring, hashed, published) %.1f ms\n",
                 (monotonic_ns() - ready) / 1e6);
  return out;
}

// The path before device_result, for comparison: output_blob (the result segment mapped in the
// worker, page-locked), one cudaMemcpy into it, the segment validated by the supervisor.
blob gpu_result_in_place(std::uint64_t size) {
  auto& w = this_worker();
  alloc::device_buffer d(w.allocator(), size);
  bench_gpu::fill_device(d.data(), size);
  const std::int64_t ready = monotonic_ns();
  blob out = w.output_blob(size);
  d.copy_to_host(out.mutable_data(), size);
  std::memcpy(out.mutable_data(), &ready, sizeof ready);
  return out;
}

std::uint64_t pinned_reference(std::uint64_t size) { return bench_gpu::pinned_copy_ns(size, 5); }

int trivial_gpu(int) {
  auto& a = this_worker().allocator();  // creates the CUDA context, as any GPU task does
  a.deallocate(a.allocate(2 * MiB));
  return 0;
}

ISORUN_TASK(gpu_result);
ISORUN_TASK(gpu_result_in_place);
ISORUN_TASK(pinned_reference);
ISORUN_TASK(trivial_gpu);

// GB/s from the device buffer being ready to the supervisor holding the validated view: with
// `early`, the view is handed over as soon as it is validated; without, the call also waits for
// the worker's exit (its CUDA context's teardown), the default.
double result_gbps(const char* task, std::uint64_t size, bool early) {
  auto spec = runner::job_spec_for(task, serialization::encoding::binary, detail::encode_args(size), {gpus().at(0)},
                                   {.early_result = early});
  spec.result_stream = true;
  auto job = runner::job::start(std::move(spec));
  const auto& r = job->wait();
  if (!r.status.ok()) {
    std::fprintf(stderr, "%s failed: %s\n", task, r.status.describe().c_str());
    std::exit(1);
  }
  const std::int64_t handed = monotonic_ns();
  std::int64_t ready = 0;
  std::uint32_t word = 0;
  std::memcpy(&ready, r.payload.data() + 8, sizeof ready);        // after the blob's length
  std::memcpy(&word, r.payload.data() + 8 + 3 * 4, sizeof word);  // the pattern's fourth word
  if (word != static_cast<std::uint32_t>(3u * 2654435761u)) {
    std::fprintf(stderr, "%s: wrong bytes came back\n", task);
    std::exit(1);
  }
  if (std::getenv("BENCH_BREAKDOWN"))
    std::fprintf(stderr, "      %s%s %llu MiB: validated %.1f ms after ready, handed over at %.1f ms\n", task,
                 early ? " (early)" : "", static_cast<unsigned long long>(size >> 20), (r.received_ns - ready) / 1e6,
                 (handed - ready) / 1e6);
  return static_cast<double>(size) / static_cast<double>(handed - ready);
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  isorun::init(argc, argv);
  if (argc == 2 && std::string(argv[1]) == "--bare-cuda") return bench_gpu::trivial_cuda();
  if (argc == 3 && std::string(argv[1]) == "--bare-cuda-teardown") {  // says when it starts to exit
    if (bench_gpu::trivial_cuda() != 0) return 1;
    std::ofstream(argv[2]) << monotonic_ns() << std::endl;
    return 0;
  }
  bool quick = false, streamed_only = false;
  std::string only = "abcd";
  std::vector<std::uint64_t> chosen_sizes;
  int reps = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") quick = true;
    else if (a == "--only" && i + 1 < argc) only = argv[++i];
    else if (a == "--sizes" && i + 1 < argc) {
      for (std::string list = argv[++i]; !list.empty();) {
        const auto comma = list.find(',');
        chosen_sizes.push_back(std::stoull(list.substr(0, comma)) * MiB);
        list = comma == std::string::npos ? "" : list.substr(comma + 1);
      }
    } else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (a == "--streamed-only") streamed_only = true;
  }
  auto section = [&](char c) { return only.find(c) != std::string::npos; };
  if (gpus().source != runner::gpu_inventory::origin::nvml || gpus().gpus.empty()) {
    std::printf("bench_gpu: no NVIDIA GPU (%s); nothing to measure\n", gpus().describe_source().c_str());
    return 77;
  }
  const auto& gpu = gpus().gpus.front();
  const std::string self = runner::self_executable();
  std::printf("isorun GPU benchmarks: %s (%ld cores)\n\n", gpu.name.c_str(), ::sysconf(_SC_NPROCESSORS_ONLN));

  if (section('a')) {
    std::printf("(a) result made on the GPU: device buffer ready -> the caller holds the validated view\n");
    std::printf("    device_result (streamed), handed over at once (early_result) and after the worker's exit\n");
    std::printf("    (the default); output_blob + cudaMemcpy (the path before) alongside up to 1 GiB\n");
    std::vector<std::uint64_t> sizes = {1 * MiB, 64 * MiB, 1024 * MiB};
    if (!quick) sizes.push_back(4096 * MiB);
    if (!chosen_sizes.empty()) sizes = chosen_sizes;
    for (std::uint64_t size : sizes) {
      const int n = reps ? reps : quick ? 3 : (size >= 1024 * MiB ? 7 : 9);
      const bool old_path = size <= 1024 * MiB && !streamed_only;
      std::vector<double> early, cpu_hashed, waited, in_place, bare;
      result_gbps("gpu_result", size, true);  // warms the ring and the supervisor's memory for this size
      for (int i = 0; i < n; ++i) {
        early.push_back(result_gbps("gpu_result", size, true));
        ::setenv("ISORUN_STREAM_DEVICE_HASH", "0", 1);  // the worker inherits it: its CPU hashes the slots
        cpu_hashed.push_back(result_gbps("gpu_result", size, true));
        ::unsetenv("ISORUN_STREAM_DEVICE_HASH");
        waited.push_back(streamed_only ? 0.0 : result_gbps("gpu_result", size, false));
        if (old_path) in_place.push_back(result_gbps("gpu_result_in_place", size, false));
        bare.push_back(static_cast<double>(size) /
                       static_cast<double>(isolated(pinned_reference, {.gpu = 0, .echo_stderr = true})(size)));
      }
      const auto e = summarize(early), c = summarize(cpu_hashed), w = summarize(waited), b = summarize(bare);
      std::printf("  %6llu MiB  streamed, early     %s   ratio %.2f%s\n", static_cast<unsigned long long>(size / MiB),
                  show(e, "GB/s").c_str(), e.median / b.median, size >= 1024 * MiB ? "   goal >= 0.5" : "");
      std::printf("             the same, CPU hash  %s   ratio %.2f   (ISORUN_STREAM_DEVICE_HASH=0)\n",
                  show(c, "GB/s").c_str(), c.median / b.median);
      std::printf("             streamed, exit      %s   ratio %.2f\n", show(w, "GB/s").c_str(), w.median / b.median);
      if (old_path) {
        const auto o = summarize(in_place);
        std::printf("             in place (before)   %s   ratio %.2f\n", show(o, "GB/s").c_str(), o.median / b.median);
      }
      std::printf("             pinned              %s   (cudaMemcpy into cudaHostAlloc memory)\n",
                  show(b, "GB/s").c_str());
    }
  }

  if (section('b')) {
    std::printf("\n(b) cold trivial CUDA task\n");
    std::vector<double> ours, bare;
    for (int i = 0; i < (quick ? 5 : 20); ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      isolated(trivial_gpu, {.gpu = 0})(0);
      ours.push_back(ms_since(t0));
      bare.push_back(spawn_ms({self, "--bare-cuda"}, {"CUDA_VISIBLE_DEVICES=" + gpu.uuid}));
    }
    const auto o = summarize(ours), b = summarize(bare);
    std::printf("  isolated(task, {.gpu = 0})        %s\n", show(o, "ms").c_str());
    std::printf("  bare process: cuInit, 2 MiB, exit %s\n", show(b, "ms").c_str());
    std::printf("  ratio %.2f   goal <= 1.1\n", o.median / b.median);
  }

#ifdef ISORUN_CLI
  if (section('c')) {
    std::printf("\n(c) the CLI's own cost\n");
    const std::string tasks = ISORUN_EXAMPLE_TASKS;
    std::vector<double> with_gpu, with_cpu, list;
    for (int i = 0; i < (quick ? 5 : 20); ++i) {
      with_cpu.push_back(spawn_ms({ISORUN_CLI, "--tasks", tasks, "--cpu", "-q", "hello"}));
      with_gpu.push_back(spawn_ms({ISORUN_CLI, "--tasks", tasks, "--gpu", "0", "-q", "hello"}));
      list.push_back(spawn_ms({ISORUN_CLI, "gpus"}));
    }
    std::printf("  isorun --gpu 0 hello  %s\n", show(summarize(with_gpu), "ms").c_str());
    std::printf("  isorun --cpu hello    %s\n", show(summarize(with_cpu), "ms").c_str());
    std::printf("  isorun gpus           %s\n", show(summarize(list), "ms").c_str());
  }
#endif

  if (section('d')) {
    std::printf("\n(d) trivial CUDA task on a warm standby worker (its context made while it waited)\n");
    const isolated_options waited{.gpu = 0, .mem_limit = 2048 * MiB, .standby = 1, .warm_context = true};
    isolated_options early = waited;
    early.early_result = true;
    auto& pool = runner::standby_for(runner::launch_spec_for(runner::job_spec_for(
                                         "trivial_gpu", serialization::encoding::binary, {}, {gpu}, waited)),
                                     1);
    // Between calls: the pool refilled, and its worker given time to create its context.
    auto settle = [&] {
      pool.fill();
      std::this_thread::sleep_for(std::chrono::milliseconds(800));
    };
    const std::string stamp = "/tmp/isorun-bench-gpu-teardown-" + std::to_string(::getpid());
    std::vector<double> w, e, teardown, to_sent, sent_to_reaped, reaped_to_back;
    for (int i = 0; i < (quick ? 3 : 15); ++i) {
      settle();
      // What isolated(trivial_gpu, waited)(0) does (queued at the process's admission, taken
      // from the standby pool), with the job's timeline kept: where the time beyond the bare
      // teardown goes.
      const std::int64_t begin = monotonic_ns();
      isolated_options o = waited;
      auto& process = runner::admission::process();
      auto request = runner::admission_request_at(process, false, o);
      auto job = runner::queue_call(process, nullptr, std::move(request),
                                    std::make_shared<runner::job_spec>(runner::job_spec_for(
                                        "trivial_gpu", serialization::encoding::binary, blob(), {gpu}, o)),
                                    detail::encode_args(0), {.standby = o.standby});
      const auto& r = job->wait();
      const std::int64_t back = monotonic_ns();
      if (!r.status.ok()) {
        std::fprintf(stderr, "trivial_gpu failed: %s\n", r.status.describe().c_str());
        return 1;
      }
      w.push_back(static_cast<double>(back - begin) / 1e6);
      to_sent.push_back(static_cast<double>(r.trace.worker_sent_ns - begin) / 1e6);
      sent_to_reaped.push_back(static_cast<double>(r.reaped_ns - r.trace.worker_sent_ns) / 1e6);
      reaped_to_back.push_back(static_cast<double>(back - r.reaped_ns) / 1e6);
      settle();
      const auto t0 = std::chrono::steady_clock::now();
      isolated(trivial_gpu, early)(0);
      e.push_back(ms_since(t0));
      spawn_ms({self, "--bare-cuda-teardown", stamp}, {"CUDA_VISIBLE_DEVICES=" + gpu.uuid});
      const std::int64_t reaped = monotonic_ns();
      std::int64_t exiting = 0;
      std::ifstream(stamp) >> exiting;
      teardown.push_back(static_cast<double>(reaped - exiting) / 1e6);
    }
    std::remove(stamp.c_str());
    runner::stop_standby();
    const auto ws = summarize(w), es = summarize(e), ts = summarize(teardown);
    std::printf("  exit waited for (the default)     %s\n", show(ws, "ms").c_str());
    std::printf("  early_result                      %s   goal <= 10 ms\n", show(es, "ms").c_str());
    std::printf("  bare CUDA process: exit to reaped %s\n", show(ts, "ms").c_str());
    std::printf("  ratio waited / bare teardown %.2f   goal <= 1.1\n", ws.median / ts.median);
    std::printf("    of which: call to done sent     %s\n", show(summarize(to_sent), "ms").c_str());
    std::printf("              done sent to reaped %s   (the worker's exit: its context's teardown)\n",
                show(summarize(sent_to_reaped), "ms").c_str());
    std::printf("              reaped to returned  %s\n", show(summarize(reaped_to_back), "ms").c_str());
  }
  return 0;
}
