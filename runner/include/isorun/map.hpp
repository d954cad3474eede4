#pragma once
/// @file map.hpp
/// Many isolated calls at once: `map` runs a registered task over inputs on slots packed per
/// GPU (or CPU slots), like a sweep without the journal. Results come back in input order, each
/// as a value with its outcome.
///
///     auto results = isorun::map(train, configs, {.all_gpus = true, .mem_limit = 6_GiB});
///     for (auto& r : results) if (r.ok()) use(r.value());
///
/// `isorun::sweep` is the same call, named for hyperparameter searches; `isorun sweep` (the CLI)
/// adds specs, the journal and resume on top.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "isorun/isolated.hpp"
#include "isorun/sweep.hpp"

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
};

/// @brief Runs `fn` on every input, in parallel on planned slots; returns results in input order.
/// @throws usage_error for an impossible plan (no GPUs, cap above every GPU, unregistered task).
template <class R, class A>
std::vector<result<R>> map(R (*fn)(A), const std::vector<std::decay_t<A>>& inputs, const map_options& o = {}) {
  sweeps::spec plan;
  plan.gpus = o.gpus;
  plan.all_gpus = o.all_gpus;
  plan.mem_limit = o.mem_limit;
  plan.per_gpu = o.per_gpu;
  plan.cpu_slots = o.cpu_slots;
  std::vector<sweeps::slot> slots;
  try {
    slots = sweeps::plan_slots(plan, gpus()).slots;
  } catch (const sweeps::spec_error& e) {
    throw usage_error(e.what());
  }
  std::vector<std::optional<result<R>>> out(inputs.size());
  std::atomic<std::size_t> next{0};
  std::vector<std::thread> workers;
  std::mutex error_mutex;
  std::exception_ptr error;
  for (const auto& sl : slots)
    workers.emplace_back([&, sl] {
      options opts;
      if (sl.gpu) opts.gpu = sl.gpu->index;
      opts.mem_limit = o.mem_limit;
      opts.timeout = o.timeout;
      opts.alloc_conf = o.alloc_conf;
      opts.echo_stderr = o.echo_stderr;
      auto f = isolated(fn, opts);
      for (std::size_t i; (i = next++) < inputs.size();) {
        try {
          out[i].emplace(f.try_call(inputs[i]));
        } catch (...) {
          std::lock_guard lock(error_mutex);
          if (!error) error = std::current_exception();
          next = inputs.size();
        }
      }
    });
  for (auto& w : workers) w.join();
  if (error) std::rethrow_exception(error);
  std::vector<result<R>> results;
  results.reserve(inputs.size());
  for (auto& r : out) results.push_back(std::move(*r));
  return results;
}

/// @brief `map` for hyperparameter sets: one isolated, capped trial per element of `params`,
///        typed results plus per-trial outcomes, in order.
template <class R, class A>
std::vector<result<R>> sweep(R (*fn)(A), const std::vector<std::decay_t<A>>& params, const map_options& o = {}) {
  return map(fn, params, o);
}

}  // namespace isorun
