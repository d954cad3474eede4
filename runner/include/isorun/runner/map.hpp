#pragma once
/// @file map.hpp
/// Many isolated calls at once: `map` runs a registered task over inputs on slots packed per
/// GPU (or CPU slots), like a sweep without the journal. Results come back in input order, each
/// as a value with its outcome.
///
///     auto results = isorun::map(train, configs, {.all_gpus = true, .mem_limit = 6_GiB});
///     for (auto& r : results) if (r.ok()) use(r.value());
///
/// For hyperparameter searches, pass the parameter sets as `inputs`; `isorun sweep` (the CLI)
/// adds specs, the journal and resume on top.

#include <chrono>
#include <cstdint>
#include <vector>

#include "isorun/runner/executor.hpp"

namespace isorun {

struct map_options {
  std::vector<int> gpus;  ///< GPU indices; empty and !all_gpus = CPU slots
  bool all_gpus = false;
  std::uint64_t mem_limit = 0;  ///< cap per call; also packs calls per GPU
  int per_gpu = 0;              ///< calls per GPU (0 = floor(free memory / mem_limit))
  int cpu_slots = 0;            ///< 0 = number of cores
  std::chrono::milliseconds timeout{0};
  std::string alloc_conf;
  bool echo_stderr = true;
  std::size_t standby = 0;    ///< workers launched ahead of need (isolated_options::standby)
  bool warm_context = false;  ///< standby workers prepare their GPU (isolated_options::warm_context)
};

/// @brief Runs `fn` on every input, in parallel on planned slots (an executor's: executor.hpp);
///        returns results in input order. At most a window of calls is submitted at a time.
/// @throws usage_error for an impossible plan (no GPUs, cap above every GPU, unregistered task).
template <class R, class A>
std::vector<result<R>> map(R (*fn)(A), const std::vector<std::decay_t<A>>& inputs, const map_options& o = {}) {
  executor ex({.gpus = o.gpus,
               .all_gpus = o.all_gpus,
               .mem_limit = o.mem_limit,
               .per_gpu = o.per_gpu,
               .cpu_slots = o.cpu_slots,
               .call = {.timeout = o.timeout,
                        .alloc_conf = o.alloc_conf,
                        .echo_stderr = o.echo_stderr,
                        .standby = o.standby,
                        .warm_context = o.warm_context}});
  return ex.map(fn, inputs);
}

}  // namespace isorun
