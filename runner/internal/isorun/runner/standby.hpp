#pragma once
/// @file standby.hpp
/// Standby workers: launched ahead of need, each used exactly once. A task still runs in a
/// process that ran nothing before; it only no longer waits for that process to start.

#include <sys/epoll.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "isorun/internal_api.hpp"
#include "isorun/runner/launcher.hpp"
#include "isorun/runner/unique_fd.hpp"

namespace isorun::runner {

/// Keeps workers launched and waiting for their assignment: at least `size`, more while calls
/// come faster than they end. take() hands one over and a background thread launches its
/// replacement:
///  - for spaced calls (the last worker taken has exited by the next take), once the worker taken
///    has exited, so that a launch (an exec and a program's start) does not compete with the call
///    it replaces for the cores; if none is left waiting, at once (an exec takes longer than the
///    gap to the next call), except in a zygote pool (a fork does not);
///  - for calls back to back or overlapping (a worker taken earlier is still running), at once:
///    waiting for exits would leave the next call without a worker, slower than a cold one;
///  - and such a take grows the pool by one (up to `max_size`) for the calls that follow; after
///    `idle` without a take it shrinks back to `size`, stopping the surplus.
/// With a `linger` (an adaptive pool: Python's default start) the pool begins dormant, holding
/// nothing: the first take() gets a worker launched for it, and once that worker has exited (the
/// first call is over: the pool's start does not compete with it for the cores), or at a second
/// take() while it runs (calls come in a burst), the pool starts its zygote and fills. After `linger` without a take it
/// stops its waiting workers and its zygote and is dormant again: what it keeps warm costs nothing while no calls come.
/// With spec.zygote the workers are forked from one zygote (zygote.hpp) the pool starts, not each
/// exec'd. Waiting workers are stopped with the pool; they also die with the supervisor (their control
/// socket hangs up), like any worker.
class ISORUN_INTERNAL_API standby_pool final : public launcher {
 public:
  /// @brief Starts filling the pool in the background with workers launched as `spec` says.
  /// @param max_size the most workers it grows to under load; 0: the cores (one CPU slot each)
  /// @param linger 0: the pool is kept; else it is adaptive (above)
  standby_pool(launch_spec spec, std::size_t size, std::size_t max_size = 0,
               std::chrono::milliseconds idle = std::chrono::seconds(2), std::chrono::milliseconds linger = {});
  /// @brief Stops the background thread and every waiting worker.
  ~standby_pool() override;
  standby_pool(const standby_pool&) = delete;
  standby_pool& operator=(const standby_pool&) = delete;

  /// @brief A worker waiting for its assignment: a standby one that is still alive if there is
  ///        one (one that died while waiting is reaped and skipped), else one launched now.
  /// @throws internal_error if a worker has to be launched now and cannot be.
  launched_worker take();

  /// @brief take() for a `spec` the pool's workers were launched for (its label aside);
  ///        any other spec gets a worker launched now.
  launched_worker launch(const launch_spec& spec) override;

  /// @brief Raises the number of workers kept waiting to at least `size`.
  void reserve(std::size_t size);

  /// @brief Blocks until the pool holds all its workers (or launching them fails), and a zygote
  ///        is ready (its preloads imported) or failed: a warm-up before timing, and a fixed
  ///        point for tests. Workers taken by calls are replaced once they have exited, so
  ///        this also waits for those calls' workers to end, except for the last one (launched now).
  void fill();

  /// @brief Stops waiting for a zygote still importing its preloads (a sweep's Ctrl-C while it
  ///        waits in fill()): fill() returns, and workers are exec'd from then on.
  void interrupt() noexcept;

  /// @brief How many workers it keeps now (`size`, or more under load).
  [[nodiscard]] std::size_t target() const;

  /// @brief Shrinks back to `size`, stopping the newest surplus waiting workers: what an idle
  ///        period does (the filler calls it); callable at any time.
  void trim();

  /// What a pool holds and has served (isorun.pool_stats() in Python).
  struct stats {
    bool zygote = false;           ///< its workers are forked from a zygote
    bool adaptive = false;         ///< it has a linger
    bool dormant = false;          ///< adaptive and holding nothing now
    std::vector<pid_t> waiting;    ///< its waiting workers, oldest first (the next take() gets the first)
    pid_t zygote_pid = -1;         ///< its zygote, while there is one
    std::uint64_t hits = 0;        ///< calls that found a worker waiting
    std::uint64_t misses = 0;      ///< calls that had one launched on their path
    std::vector<std::string> env;  ///< what its workers are launched with, beside the process's
  };
  [[nodiscard]] stats snapshot() const;

 private:
  void refill();
  // refill()'s steps, under mutex_ (released while launching or waiting).
  bool launched_one(std::unique_lock<std::mutex>& lock, const launch_spec& bound);
  std::optional<int> next_look(std::unique_lock<std::mutex>& lock);
  void wait_for_events(std::unique_lock<std::mutex>& lock, int timeout_ms);
  void start_zygote();
  void go_dormant(std::unique_lock<std::mutex>& lock);
  void wake_filler() const noexcept;
  [[nodiscard]] bool defers_last() const;            // under mutex_
  bool watch(const unique_fd& fd) const noexcept;    // adds `fd` to what the filler sleeps on
  void unwatch(const unique_fd& fd) const noexcept;  // and takes it out

  std::shared_ptr<launcher> source(std::unique_lock<std::mutex>& lock);

  launch_spec spec_;
  // Where workers come from: a local_launcher, or with spec.zygote a zygote_launcher, which the
  // filler thread starts (its children's parent-death signal follows the thread that started
  // it): null until then. Shared with a take() that launches through it outside the lock, for
  // a dormant pool stops its zygote meanwhile.
  std::shared_ptr<launcher> launcher_;
  mutable std::mutex mutex_;
  unique_fd wanted_;                                   // an eventfd: wakes the filler (a take, a resize, the stop)
  unique_fd watched_{::epoll_create1(EPOLL_CLOEXEC)};  // what the filler sleeps on: wanted_, owed_
  std::condition_variable changed_;                    // fill(): the pool changed
  std::deque<launched_worker> ready_;
  std::deque<unique_fd> owed_;     // pidfds of the workers taken and not yet replaced, oldest first
  std::deque<unique_fd> running_;  // pidfds of the workers taken that may still run
  std::size_t size_;
  std::size_t target_;  // size_, or more while calls come back to back
  std::size_t max_size_;
  std::chrono::milliseconds idle_;
  std::chrono::milliseconds linger_;
  std::chrono::steady_clock::time_point last_take_{};
  std::chrono::steady_clock::time_point last_end_{};  // when a call taken from an adaptive pool was seen to end
  bool dormant_ = false;                              // adaptive, and holding nothing until a take
  bool waking_pending_ = false;                       // a take woke it and is launching its own worker
  bool hurry_ = false;                                // a second take came meanwhile: it starts without that exit
  bool need_zygote_ = false;                          // the filler is to start the zygote (once woken)
  unique_fd waking_;  // a dormant pool's waking call's worker: the pool starts once it exits
  std::uint64_t hits_ = 0, misses_ = 0;
  bool stopping_ = false;
  bool interrupted_ = false;    // interrupt(): the zygote is not waited for
  bool zygote_settled_ = true;  // with a zygote: it is ready (its imports done), or failed
  std::size_t filling_ = 0;     // fill() calls waiting
  bool failing_ = false;        // launching failed: stop trying in the background, take() reports it
  std::thread filler_;
};

/// @brief The process-wide pool for workers launched as `spec` says, keeping at least `size`
///        waiting; created on first use and kept until the program exits (adaptive with a
///        `linger`: such pools are apart from those without).
ISORUN_INTERNAL_API standby_pool& standby_for(const launch_spec& spec, std::size_t size,
                                              std::chrono::milliseconds linger = {});

/// @brief What every process-wide pool holds and has served.
ISORUN_INTERNAL_API std::vector<standby_pool::stats> standby_stats();

/// @brief Stops every process-wide pool and its waiting workers; the next call that asks for
///        standby workers starts its pool afresh. No call may be taking from a pool meanwhile.
ISORUN_INTERNAL_API void stop_standby();

}  // namespace isorun::runner
