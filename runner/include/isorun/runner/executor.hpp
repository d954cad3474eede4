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

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "isorun/export.hpp"
#include "isorun/runner/admission.hpp"
#include "isorun/runner/isolated.hpp"

namespace isorun {

struct executor_options {
  std::vector<int> gpus;  ///< GPU indices; empty and !all_gpus = CPU slots
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

  /// @brief Runs `fn` on every input and returns each call's result, in input order (each
  ///        failure a result too); a window of a few calls per slot is submitted at a time.
  template <class R, class A>
  std::vector<result<R>> map(R (*fn)(A), const std::vector<std::decay_t<A>>& inputs) {
    std::vector<result<R>> results;
    results.reserve(inputs.size());
    std::size_t next = 0;
    map_each(
        fn, [&]() -> const std::decay_t<A>* { return next < inputs.size() ? &inputs[next++] : nullptr; },
        [&](std::size_t, result<R> r) { results.push_back(std::move(r)); });
    return results;
  }

  /// @brief The streaming form: `fn` on each input `next()` gives (a pointer to it, valid until
  ///        the next call; nullptr: no more), taken only as calls end, so that at most a window
  ///        of calls (a few per slot) is submitted; `take(index, result)` gets each result in
  ///        input order. Whatever throws (a failed submission, `next` or `take`) cancels the calls
  ///        in flight, waits for them, and goes on.
  template <class R, class A, class Next, class Take>
  void map_each(R (*fn)(A), Next&& next, Take&& take) {
    std::deque<call_handle<R>> in_flight;
    std::size_t taken = 0;
    try {
      for (;;) {
        while (in_flight.size() < window()) {
          const auto* input = next();
          if (!input) break;
          in_flight.push_back(submit(fn, *input));
        }
        if (in_flight.empty()) return;
        result<R> r = in_flight.front().try_get();
        in_flight.pop_front();
        take(taken++, std::move(r));
      }
    } catch (...) {
      for (auto& c : in_flight) c.cancel();
      for (auto& c : in_flight) c.wait_for(std::chrono::milliseconds::max());
      throw;
    }
  }

  /// @brief The calls a streaming map keeps submitted: a few per slot, so that every slot has
  ///        its next call as one ends, and no more.
  [[nodiscard]] std::size_t window() const noexcept;

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
