#pragma once
/// @file options.hpp
/// The options of one isolated call, in the words users give them.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace isorun {

/// How to run an isolated call: what isolated() and map() take, and what the CLI's flags and a
/// sweep's spec turn into (runner::job_spec_for).
struct isolated_options {
  std::optional<int> gpu;  ///< physical GPU index; unset (and no gpus, gpu_count) = CPU only
  /// Several GPUs by physical index: the worker sees exactly these, in PCI bus order, as CUDA
  /// devices 0, 1, ... (this_worker().devices()). Excludes `gpu` and `gpu_count`.
  std::vector<int> gpus;
  /// Any this many GPUs, chosen by the supervisor among those with room for the cap (the freest
  /// first). Excludes `gpu` and `gpus`.
  int gpu_count = 0;
  std::uint64_t mem_limit = 0;  ///< hard cap on each of the worker's devices; 0 = none
  /// Hard cap on the host memory of the worker and everything it starts (its cgroup's
  /// memory.max, with no swap past it); 0 = none. Past it the call ends out_of_memory. Needs
  /// cgroup containment with the memory controller: refused (usage_error) where there is none.
  std::uint64_t host_mem_limit = 0;
  /// The cores one call may use: its OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, MKL_NUM_THREADS,
  /// VECLIB_MAXIMUM_THREADS and NUMEXPR_NUM_THREADS (where neither `env` nor this process sets
  /// them), and the CPU slots a CPU call takes at admission. 0: its share, the cores divided
  /// by the calls that may run beside it (one, for a call of the process's admission).
  unsigned cpus_per_call = 0;
  std::chrono::milliseconds timeout{0};  ///< 0 = none
  /// Between SIGTERM and SIGKILL when stopping; with early_result, also how long the worker may
  /// take to exit after its result was handed over.
  std::chrono::milliseconds grace{5000};
  std::string alloc_conf;        ///< allocator configuration (ISORUN_ALLOC_CONF syntax)
  std::vector<std::string> env;  ///< extra "KEY=VALUE" for the worker
  bool echo_stderr = true;       ///< copy the worker's stderr to ours, live
  /// Larger results are rejected (invalid_result); 0: this machine's physical memory, the most
  /// a result could take in the caller's memory.
  std::uint64_t max_result = 0;
  /// Workers to keep launched ahead of need for calls like this one (same `env`); each is used
  /// for exactly one call, and its replacement is launched in the background. 0: launch a
  /// worker when the call is made.
  std::size_t standby = 0;
  /// With one GPU: each worker creates its CUDA context and capped allocator as soon as it is
  /// launched, before its task is known (a worker on several GPUs prepares them once assigned),
  /// so a standby worker's task starts at once (creating a context is the largest part of a GPU
  /// worker's start). Each waiting worker then holds a context (about half a GiB) on
  /// the GPU, outside any task's cap; it is stopped with the pool if never used.
  bool warm_context = false;
  /// Hand the result over as soon as the worker has reported it and let go of it, instead of
  /// after the worker has exited: the worker releases the task's device memory and unmaps the
  /// result (a CPU task's result value itself is freed after the hand-over), the supervisor
  /// *seals* the result (the kernel then refuses any change to it, by
  /// any process), validates it and returns, while the worker's exit (a CUDA context's
  /// teardown, tens of milliseconds) finishes in the background. The outcome says
  /// `exit_pending`. If the result cannot be sealed (a process the task started still maps it
  /// writable), the call waits for the exit as usual.
  bool early_result = false;
};

}  // namespace isorun
