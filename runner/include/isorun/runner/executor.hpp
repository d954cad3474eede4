#pragma once
/// @file executor.hpp
/// An executor: calls handed to it in any number run as its slots allow, each in a fresh worker.
/// Its limits (GPUs, caps per GPU, CPU slots) are an admission of its own in front of the
/// process's (admission.hpp), so executors, plain `isolated` calls and `map` in one process
/// never put more caps on a GPU than it holds, nor more CPU workers than its cores.
///
///     isorun::executor pool({.all_gpus = true, .mem_limit = 6_GiB, .call = {.timeout = 10min}});
///     std::vector<isorun::call_handle<metrics>> calls;
///     for (const auto& p : grid) calls.push_back(pool.submit(train, p));   // returns at once
///     for (auto& c : calls) use(c.get());                                  // in order, or poll wait_for
///     auto results = pool.map(train, grid);   // all of them, each a result<R>, in input order

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "isorun/runner/admission.hpp"
#include "isorun/runner/isolated.hpp"
#include "isorun/export.hpp"

namespace isorun {

struct executor_options {
  std::vector<int> gpus;        ///< GPU indices; empty and !all_gpus = CPU slots
  bool all_gpus = false;
  std::uint64_t mem_limit = 0;  ///< cap per call on its GPU; packs calls per GPU
  int per_gpu = 0;              ///< calls per GPU at most; 0 = as many caps as fit, at most cores per GPU
  int cpu_slots = 0;            ///< CPU calls at once; 0 = one per core
  /// Every call's other options (timeout, grace, env, standby, host_mem_limit, cpus_per_call,
  /// ...). Where calls run is the executor's: gpu, gpus, gpu_count and mem_limit must be unset.
  isolated_options call;
};

namespace detail {
/// @brief An executor's admission for `options`' slots (its call options are not looked at), and
///        in `plan` how the slots were decided: what executor and the Python Executor build on.
/// @throws usage_error as executor's constructor.
ISORUN_API std::shared_ptr<runner::admission> executor_admission(const executor_options& options, std::string& plan);
}  // namespace detail

class ISORUN_API executor {
 public:
  /// @brief Plans the slots (runner::plan_slots) and checks the options.
  /// @throws usage_error for an impossible plan (no GPUs, a cap above every GPU), a `call` that
  ///         places itself, or slots of 0.
  explicit executor(executor_options options);
  /// @brief Cancels the calls still waiting for a slot, then waits for the running ones.
  ~executor();
  executor(const executor&) = delete;
  executor& operator=(const executor&) = delete;

  /// @brief Queues a call of the registered task `fn` and returns at once; it starts when a slot
  ///        is free (first come, first served).
  /// @throws usage_error (unregistered task, or after shutdown()).
  template <class R, class... A>
  call_handle<R> submit(R (*fn)(A...), const std::decay_t<A>&... args) {
    return call_handle<R>(queue(reinterpret_cast<const void*>(fn), detail::encode_args(args...)));
  }

  /// @brief Runs `fn` on every input and returns each call's result, in input order.
  template <class R, class A>
  std::vector<result<R>> map(R (*fn)(A), const std::vector<std::decay_t<A>>& inputs) {
    std::vector<call_handle<R>> calls;
    calls.reserve(inputs.size());
    for (const auto& input : inputs) calls.push_back(submit(fn, input));
    std::vector<result<R>> results;
    results.reserve(inputs.size());
    for (auto& c : calls) results.push_back(c.try_get());
    return results;
  }

  /// @brief No more calls are accepted; with `cancel_waiting`, calls still waiting for a slot
  ///        end `cancelled`. Running calls go on (cancel their handles to stop them).
  void shutdown(bool cancel_waiting = false);

  /// @brief Calls waiting for a slot now.
  [[nodiscard]] std::size_t waiting() const;
  /// @brief Calls running now (admitted, until their worker is gone).
  [[nodiscard]] std::size_t running() const;
  /// @brief How the slots were decided, e.g. "2 CPU slots (one per core)".
  [[nodiscard]] const std::string& plan() const noexcept;

 private:
  std::shared_ptr<runner::queued_job> queue(const void* fn, blob args);
  struct state;
  std::shared_ptr<state> state_;
};

}  // namespace isorun
