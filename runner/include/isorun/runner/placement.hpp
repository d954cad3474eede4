#pragma once
/// @file placement.hpp
/// Where work runs: the GPU (or none) one job gets, and the slots a batch of jobs (a sweep,
/// `map`) is spread over. The one place that checks a cap against a GPU and packs caps per GPU.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "isorun/export.hpp"
#include "isorun/runner/gpu_inventory.hpp"
#include "isorun/runner/options.hpp"

namespace isorun::runner {

/// @brief Checks that a cap of `mem_limit` bytes fits `gpu` at all.
/// @throws usage_error "mem-limit X exceeds GPU N's Y".
ISORUN_API void check_fits(const gpu_info& gpu, std::uint64_t mem_limit);

/// Which GPUs one job asks for: these (`indices`), or any `count` with room, or (neither) the
/// caller's default.
struct gpu_request {
  std::vector<int> indices;  ///< physical (NVML) indices, in any order
  int count = 0;             ///< this many GPUs, chosen by the supervisor
};

/// @brief The one place a job's GPU options become a request: `gpu` (one GPU), `gpus` (these)
///        or `gpu_count` (any that many).
/// @throws usage_error when more than one of them is given, or a count below 1.
ISORUN_API gpu_request gpu_request_for(const isolated_options& opts);

/// @brief The GPUs for one job, in PCI bus order (the order of NVML indices, and of CUDA device
///        ordinals inside the worker): the ones listed; or `count` of those whose free memory has
///        room for the cap (the freest first); with neither, the first GPU if `default_to_gpu`
///        and there is one; otherwise none (the CPU). The cap is per GPU and checked on each.
/// @throws usage_error, nothing started: a GPU that does not exist (naming those that do), a GPU
///         listed twice, more GPUs than there are (or have room), a cap larger than a GPU.
ISORUN_API std::vector<gpu_info> place_job(const gpu_inventory& inventory, const gpu_request& request,
                                           bool default_to_gpu, std::uint64_t mem_limit);

/// What a batch of jobs asks for.
struct slot_request {
  std::vector<int> gpus;  ///< GPU indices; empty and !all_gpus = CPU slots
  bool all_gpus = false;
  std::uint64_t mem_limit = 0;  ///< cap per job: packs jobs per GPU
  int per_gpu = 0;              ///< jobs per GPU; 0 = as many caps as fit, at most cores per GPU
  int cpu_slots = 0;            ///< 0 = one per core
};

/// One place a job of the batch can run.
struct slot {
  std::vector<gpu_info> gpus;  ///< empty: a CPU slot
  int index = 0;               ///< slot number
};

/// The slots of a batch, and how they were decided (a sweep prints it in its first line).
struct slot_plan {
  std::vector<slot> slots;
  std::string how;  ///< e.g. "16 GPU slots (GPU 0: 16 = min(79 caps of 1.00 GiB in 79.2 GiB free, 16 cores))"
};

/// @brief Per listed GPU, `per_gpu` slots, or as many as fit, so that the caps on a GPU never
///        add up to more than its free memory (a job's cap includes its CUDA context) but at
///        most `cores` / number of GPUs, so jobs do not starve each other of CPU; CPU slots
///        (`cpu_slots`, default one per core) when no GPU is listed.
/// @param cores the cores to share out; 0 (the default): those this process may run on, its CPU
///        affinity (in a Slurm job or a container, often fewer than the machine has)
/// @throws usage_error when a cap exceeds a GPU, GPUs are asked for but absent, or no slot fits.
ISORUN_API slot_plan plan_slots(const slot_request& request, const gpu_inventory& inventory, unsigned cores = 0);

/// Room kept on a GPU for each warm standby worker's CUDA context, which lives outside any
/// job's cap while the worker waits (a context measured 523 MiB on an H100, driver 580).
inline constexpr std::uint64_t warm_context_room = 1ULL << 30;

/// @brief Whether `waiting` warm standby workers fit on `gpu` beside `jobs` running jobs capped
///        at `mem_limit` each (no cap: never, the jobs may take the whole GPU).
[[nodiscard]] inline bool warm_standby_fits(const gpu_info& gpu, std::size_t jobs, std::uint64_t mem_limit,
                                            std::size_t waiting) {
  return mem_limit && jobs * mem_limit + waiting * warm_context_room <= gpu.free_memory;
}

}  // namespace isorun::runner
