#pragma once
/// @file isolated.hpp
/// The decorator-style API: wrap a registered task; calling the wrapper runs the task in a
/// fresh worker process and returns its result.
///
///     ISORUN_TASK(train);
///     int main(int argc, char** argv) {
///       isorun::init(argc, argv);
///       auto f = isorun::isolated(train, {.gpu = 0, .mem_limit = 2_GiB, .timeout = 10min});
///       metrics m = f(params);          // throws task_error, worker_crashed, task_timeout, ...
///       auto h = f.async(params);       // h.get(), h.wait_for(1s), h.cancel()
///       auto r = f.try_call(params);    // r.ok(), r.value(), r.status() — no exceptions
///     }

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "isorun/export.hpp"
#include "isorun/runner/errors.hpp"
#include "isorun/runner/job.hpp"
#include "isorun/runner/options.hpp"
#include "isorun/runner/outcome.hpp"
#include "isorun/runner/queued_job.hpp"
#include "isorun/serialization/blob.hpp"
#include "isorun/serialization/codec.hpp"
#include "isorun/worker/task.hpp"

namespace isorun {

namespace detail {
/// @brief Queues a call of the task registered at `fn` for admission (at `executor`, then the
///        process's; or the process's alone); whoever waits for it first starts its worker.
/// @throws usage_error (not registered, bad GPU, cap too large, can never be admitted), before
///         anything waits or starts.
ISORUN_API std::shared_ptr<runner::queued_job> submit_isolated(const void* fn, blob args, const isolated_options& opts,
                                                               runner::admission* executor = nullptr);

template <class... A>
blob encode_args(const A&... args) {
  if constexpr (sizeof...(A) == 0) {
    return blob();
  } else {
    blob b(static_cast<std::size_t>(serialization::encoded_size(args...)));
    serialization::encode_into(b.mutable_data(), b.size(), args...);
    return b;
  }
}

template <class R>
R decode_result(const runner::job_result& r) {
  if constexpr (std::is_void_v<R>) {
    return;
  } else {
    R value{};
    try {
      serialization::decode(r.payload, r.owner, value);
    } catch (const std::exception& e) {
      throw invalid_result(std::string("result could not be decoded: ") + e.what());
    }
    return value;
  }
}
}  // namespace detail

/// A finished call as a value: the outcome, and the result on success.
template <class R>
class result {
 public:
  explicit result(outcome status, std::optional<std::conditional_t<std::is_void_v<R>, char, R>> value = {})
      : status_{std::move(status)}, value_{std::move(value)} {}
  [[nodiscard]] bool ok() const noexcept { return status_.ok(); }
  [[nodiscard]] const outcome& status() const noexcept { return status_; }
  /// @brief The result. @throws the outcome's exception if the call failed.
  decltype(auto) value() & {
    status_.rethrow();
    if constexpr (!std::is_void_v<R>) return (*value_);
  }
  /// @brief Moves the result out (a blob stays a view into shared memory).
  R value() && {
    status_.rethrow();
    if constexpr (!std::is_void_v<R>) return std::move(*value_);
  }

 private:
  outcome status_;
  std::optional<std::conditional_t<std::is_void_v<R>, char, R>> value_;
};

namespace detail {
template <class R>
result<R> to_result(const runner::job_result& r) {
  if (!r.status.ok()) return result<R>(r.status);
  try {
    if constexpr (std::is_void_v<R>) {
      return result<R>(r.status, char{});
    } else {
      return result<R>(r.status, decode_result<R>(r));
    }
  } catch (const invalid_result& e) {
    outcome o = r.status;
    o.kind = outcome_kind::invalid_result;
    o.message = e.what();
    return result<R>(o);
  }
}
}  // namespace detail

/// A call in flight: waiting for admission, then running. The process's watcher starts it once
/// admitted (at once, here, when there is room: its pid is then known) and watches it to its end:
/// a call in flight costs no thread. Dropping it before it finished cancels it: nothing is left
/// waiting or running.
template <class R>
class call_handle {
 public:
  explicit call_handle(std::shared_ptr<runner::queued_job> call) : call_{std::move(call)} {
    call_->watch_elsewhere({}, true);
  }
  call_handle(call_handle&&) noexcept = default;
  call_handle& operator=(call_handle&&) noexcept = default;
  ~call_handle() = default;  // (the call, dropped, leaves the queue or is stopped: queued_job)

  /// @brief Waits for the result. @throws the outcome's exception on failure.
  R get() { return try_get().value(); }  // rvalue: moves the result out
  /// @brief Waits for the result or outcome, without throwing for task failures (a failure to
  ///        start the worker, internal_error, still throws).
  result<R> try_get() { return detail::to_result<R>(call_->wait()); }
  /// @return true once finished.
  bool wait_for(std::chrono::milliseconds timeout) const { return call_->wait_for(timeout); }
  /// Leaves the admission queue, or stops the worker (SIGTERM, then SIGKILL after the grace
  /// period); get() then throws `cancelled`.
  void cancel() noexcept { call_->cancel(); }
  /// The worker's pid, also after it exited (see runner::job::pid()); 0 while the call waits
  /// for admission.
  [[nodiscard]] pid_t pid() const noexcept { return call_->pid(); }
  /// Whether the call has been admitted and its worker started.
  [[nodiscard]] bool started() const noexcept { return call_->started(); }

 private:
  std::shared_ptr<runner::queued_job> call_;
};

/// A task wrapped to run isolated, with the task's own signature.
template <class R, class... A>
class isolated_function {
 public:
  isolated_function(R (*fn)(A...), isolated_options opts) : fn_{fn}, options_{std::move(opts)} {}

  /// @brief Runs the task in a fresh worker and waits.
  /// @throws task_error, worker_crashed, task_timeout, out_of_memory, invalid_result, cancelled,
  ///         usage_error, internal_error.
  R operator()(const std::decay_t<A>&... args) const { return try_call(args...).value(); }

  /// @brief Like operator() but returns the outcome as a value instead of throwing for failures
  ///        of the task or worker (usage and internal errors still throw).
  result<R> try_call(const std::decay_t<A>&... args) const {
    auto call = start(args...);
    return detail::to_result<R>(call->wait());
  }

  /// @brief Starts the task and returns at once.
  call_handle<R> async(const std::decay_t<A>&... args) const { return call_handle<R>(start(args...)); }

  [[nodiscard]] const isolated_options& opts() const noexcept { return options_; }

 private:
  std::shared_ptr<runner::queued_job> start(const std::decay_t<A>&... args) const {
    return detail::submit_isolated(reinterpret_cast<const void*>(fn_), detail::encode_args(args...), options_);
  }
  R (*fn_)(A...);
  isolated_options options_;
};

/// @brief Wraps registered task `fn` (see ISORUN_TASK) to run isolated with `opts`.
template <class R, class... A>
isolated_function<R, A...> isolated(R (*fn)(A...), isolated_options opts = {}) {
  return isolated_function<R, A...>(fn, std::move(opts));
}

/// @brief The GPU inventory the API assigns from (NVML, or ISORUN_SIMULATE_GPUS), read once.
ISORUN_API const runner::gpu_inventory& gpus();

/// @brief Stops the workers kept on standby for calls made with isolated_options::standby (and
///        map_options::standby), warm ones included, and waits until they are gone; the next
///        such call starts its standby workers afresh. No call may be starting meanwhile.
///        (They also stop when the program exits, and die with it if it is killed.)
ISORUN_API void stop_standby();

}  // namespace isorun
