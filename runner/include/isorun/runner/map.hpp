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

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

#include "isorun/runner/isolated.hpp"
#include "isorun/runner/placement.hpp"

namespace isorun {

struct map_options {
  std::vector<int> gpus;                 ///< GPU indices; empty and !all_gpus = CPU slots
  bool all_gpus = false;
  std::uint64_t mem_limit = 0;           ///< cap per call; also packs calls per GPU
  int per_gpu = 0;                       ///< calls per GPU (0 = floor(free memory / mem_limit))
  int cpu_slots = 0;                     ///< 0 = number of cores
  std::chrono::milliseconds timeout{0};
  std::string alloc_conf;
  bool echo_stderr = true;
  std::size_t standby = 0;               ///< workers launched ahead of need (isolated_options::standby)
  bool warm_context = false;             ///< standby workers prepare their GPU (isolated_options::warm_context)
};

/// @brief Runs `fn` on every input, in parallel on planned slots; returns results in input order.
/// @throws usage_error for an impossible plan (no GPUs, cap above every GPU, unregistered task).
template <class R, class A>
std::vector<result<R>> map(R (*fn)(A), const std::vector<std::decay_t<A>>& inputs, const map_options& o = {}) {
  const auto slots = runner::plan_slots(
                         {.gpus = o.gpus, .all_gpus = o.all_gpus, .mem_limit = o.mem_limit, .per_gpu = o.per_gpu, .cpu_slots = o.cpu_slots},
                         gpus())
                         .slots;
  std::vector<std::optional<result<R>>> out(inputs.size());
  std::mutex error_mutex;
  std::exception_ptr error;
  std::atomic<bool> failed{false};
  runner::run_on_slots(
      slots, inputs.size(),
      [&](const runner::slot& sl, std::size_t i) {
        isolated_options opts;
        for (const auto& g : sl.gpus) opts.gpus.push_back(g.index);
        opts.mem_limit = o.mem_limit;
        opts.timeout = o.timeout;
        opts.alloc_conf = o.alloc_conf;
        opts.echo_stderr = o.echo_stderr;
        opts.standby = o.standby;
        opts.warm_context = o.warm_context;
        try {
          out[i].emplace(isolated(fn, opts).try_call(inputs[i]));
        } catch (...) {  // not the task's failure (that is a result): the call could not be made
          std::lock_guard lock(error_mutex);
          if (!error) error = std::current_exception();
          failed = true;
        }
      },
      [&] { return failed.load(); });
  if (error) std::rethrow_exception(error);
  std::vector<result<R>> results;
  results.reserve(inputs.size());
  for (auto& r : out) results.push_back(std::move(*r));
  return results;
}

}  // namespace isorun
