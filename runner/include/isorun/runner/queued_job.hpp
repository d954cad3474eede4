#pragma once
/// @file queued_job.hpp
/// A call from the moment it is made: a place in an admission queue, then the job it starts once
/// admitted. What every API's call is (C++ `isolated` and executors, Python), so that waiting,
/// cancelling while waiting and the hand-over to the job are written once.

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>

#include "isorun/runner/admission.hpp"
#include "isorun/runner/job.hpp"
#include "isorun/export.hpp"

namespace isorun::runner {

class queued_job;

/// @brief A call of `spec` queued for `request` at `first` (then at `then`: the process's
///        admission behind an executor's). Once admitted it starts on the ticket's GPUs, in a
///        worker of the standby pool of calls launched like it where `standby` or `zygote` (its
///        workers forked from a zygote) asks for one, else in a worker launched for it. What
///        every API's call is queued through.
ISORUN_API std::shared_ptr<queued_job> queue_call(admission& first, admission* then, admission_request request,
                                                  std::shared_ptr<job_spec> spec, std::size_t standby,
                                                  bool zygote = false);

class ISORUN_API queued_job {
 public:
  /// Starts the job on what the ticket holds (its GPUs); the job keeps the ticket
  /// (job_spec::admitted) until its worker is gone. The flag: the starting thread waits for the
  /// job next (job_spec::caller_waits).
  using starter = std::function<std::shared_ptr<job>(std::shared_ptr<admission::ticket>, bool)>;

  /// @brief A call waiting at `place`, started by `start` once admitted (by whoever waits first).
  queued_job(std::shared_ptr<admission::waiter> place, starter start);
  ~queued_job();  // a call dropped while it waits leaves the queue; one that runs is cancelled
  queued_job(const queued_job&) = delete;
  queued_job& operator=(const queued_job&) = delete;

  /// @brief Waits for admission, starts the job and waits for its end (job::wait). A call
  ///        cancelled before it started ends `cancelled` without a worker.
  /// @throws usage_error or internal_error from the start (nothing is left running).
  const job_result& wait();

  /// @brief Like wait(), asking `interrupted` (job::interruption) while it waits, for admission
  ///        too: true cancels the call.
  const job_result& wait(const job::interruption& interrupted);

  /// @brief Starts the job on this thread if the call is admitted already (there was room when
  ///        it was queued), without waiting: its pid is then known at once. True if started.
  ///        `then_waits`: this thread waits for the job next (job_spec::caller_waits).
  /// @throws usage_error or internal_error from the start.
  bool start_if_admitted(bool then_waits = false);

  /// @brief Waits up to `timeout` for the end; true once wait() returns at once.
  bool wait_for(std::chrono::milliseconds timeout);

  /// @brief Cancels: leaves the queue, or stops the job (job::cancel). Thread-safe.
  void cancel() noexcept;

  /// @brief The worker's pid once started, else 0.
  [[nodiscard]] pid_t pid() const noexcept;

  /// @brief Whether the call has been admitted and its job started.
  [[nodiscard]] bool started() const noexcept;

 private:
  // Admission, then the start, on the waiting thread (which waits for the job next where
  // `then_waits`); true once there is a job or an end.
  bool admit_and_start(std::chrono::steady_clock::time_point deadline, bool then_waits);

  std::shared_ptr<admission::waiter> place_;
  starter start_;
  mutable std::mutex mutex_;
  std::shared_ptr<job> job_;
  std::exception_ptr failed_;  // the start threw
  bool cancelled_ = false;
  bool ended_ = false;         // cancelled before the start, or the start failed
  job_result unstarted_;       // the result of a call that never started
};

}  // namespace isorun::runner
