#pragma once
/// @file queued_job.hpp
/// A call from the moment it is made: a place in an admission queue, then the job it starts once
/// admitted. What every API's call is (C++ `isolated` and executors, Python), so that waiting,
/// cancelling while waiting and the hand-over to the job are written once.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>

#include "isorun/export.hpp"
#include "isorun/runner/admission.hpp"
#include "isorun/runner/job.hpp"

namespace isorun::runner {

class queued_job;

/// Where a call's worker comes from, beside a worker launched for it.
struct warm_start {
  std::size_t standby = 0;  ///< workers launched like its own kept waiting (a standby pool); 0: none
  bool zygote = false;      ///< its workers forked from a zygote, not exec'd
  /// Not 0: an adaptive pool, which starts once the first call that took from it has ended and,
  /// after this long without a call, stops its waiting workers and its zygote until the next.
  std::chrono::milliseconds linger{0};
};

/// @brief A call of `args` queued for `request` at `first` (then at `then`: the process's
///        admission behind an executor's). Once admitted it starts on the ticket's GPUs, in a
///        worker of the standby pool of calls launched like it where `warm` asks for one (a
///        zygote or standby workers), else in a worker launched for it. What every API's call
///        is queued through.
/// @param launch How its worker is launched and watched (job_spec, its `args` unused): shared by
///        the calls made alike, for a queued call to be small; each call's own copy, with its
///        args, GPUs and ticket, is made as it starts.
ISORUN_API std::shared_ptr<queued_job> queue_call(admission& first, admission* then, admission_request request,
                                                  std::shared_ptr<const job_spec> launch, blob args,
                                                  warm_start warm = {});

class ISORUN_API queued_job : public std::enable_shared_from_this<queued_job> {
 public:
  /// Starts the job on what the ticket holds (its GPUs); the job keeps the ticket
  /// (job_spec::admitted) until its worker is gone. The flag: the starting thread waits for the
  /// job next (job_spec::caller_waits).
  using starter = std::function<std::shared_ptr<job>(std::shared_ptr<admission::ticket>, bool)>;

  /// @brief A call waiting at `place`, started by `start` once admitted. (Made with
  ///        std::make_shared: the watcher holds on to it while it starts it.)
  queued_job(std::shared_ptr<admission::waiter> place, starter start);
  ~queued_job();  // a call dropped while it waits leaves the queue; one that runs is cancelled
  queued_job(const queued_job&) = delete;
  queued_job& operator=(const queued_job&) = delete;

  /// @brief Waits for the end (job::wait). A call admitted already, and not handed to the
  ///        watcher, is started and watched on this thread; any other is handed to the watcher
  ///        (watch_elsewhere) and waited for. A call cancelled before it started ends
  ///        `cancelled` without a worker.
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

  /// @brief Hands the call to the process's watcher (watcher.hpp): the watcher starts it once it
  ///        is admitted, on its own thread (a worker dies with the thread that started it), and
  ///        watches it to its end; `on_done` then runs on the watcher's thread (it must not
  ///        block). With `until_started`, a call admitted now has started (its pid is known) when
  ///        this returns. What a call that no thread waits for next (a future) is.
  void watch_elsewhere(std::function<void()> on_done = {}, bool until_started = false);

  /// @brief Waits up to `timeout` for the end (handing the call to the watcher first); true once
  ///        wait() returns at once.
  bool wait_for(std::chrono::milliseconds timeout);

  /// @brief Cancels: leaves the queue, or stops the job (job::cancel). Thread-safe.
  void cancel() noexcept;

  /// @brief The worker's pid once started, else 0.
  [[nodiscard]] pid_t pid() const noexcept;

  /// @brief Whether the call has been admitted and its job started.
  [[nodiscard]] bool started() const noexcept;

  /// @brief Whether the call has ended: wait() returns at once.
  [[nodiscard]] bool done() const noexcept;

  /// @brief A descriptor that turns readable once the call has ended, for a caller that waits
  ///        for several things at once. Made on first use; it lives as long as the call.
  int done_fd();

 private:
  bool admitted_now();                 // ready (admitted, cancelled or refused) without waiting
  void start_locked(bool then_waits);  // the job started, or the call ended; under mutex_
  void start_from_watcher();
  void mark_done();
  void wait_done(const job::interruption& interrupted);

  std::shared_ptr<admission::waiter> place_;
  starter start_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;  // started, ended or done
  std::shared_ptr<job> job_;
  std::exception_ptr failed_;  // the start threw
  bool cancelled_ = false;
  bool ended_ = false;             // cancelled before the start, or the start failed
  bool handed_ = false;            // to the watcher
  std::atomic<bool> done_{false};  // its job's watch is over, or it ended without one
  // The result of a call cancelled before its start; made only then: a queued call is small.
  std::unique_ptr<job_result> unstarted_;
  int done_event_ = -1;  // done_fd()'s eventfd
  std::function<void()> on_done_;
};

}  // namespace isorun::runner
