#pragma once
/// @file admission.hpp
/// Admission: a call waits until what it asks for fits, then holds it until its worker is gone.
/// One admission per process (admission::process()) sees every call that process makes, whatever
/// API made it: C++ `isolated` calls (sync, async, from any thread), `map`, executors, Python
/// calls. An executor has an admission of its own in front of the process's, for its own limits.
///
/// What fits: on each GPU, the caps of the calls running there add up to at most its free memory
/// (a call with no cap has the GPU to itself), and at most `per_gpu` calls; on the CPU, at most
/// `cpu_slots` CPU slots are taken (a CPU call takes `cpus` of them, default one). Calls are
/// admitted first come, first served for each resource: a call never overtakes an earlier one
/// that waits for the same GPU or for CPU slots, while one that asks for other resources goes
/// ahead. A call that could never fit is refused at once (usage_error), before it waits.

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "isorun/export.hpp"
#include "isorun/runner/gpu_inventory.hpp"
#include "isorun/runner/options.hpp"

namespace isorun::runner {

/// What one call asks for: these GPUs, or any `gpu_count` of them, each with room for
/// `mem_limit` (0: the whole GPU); with neither, `cpus` CPU slots.
struct admission_request {
  std::vector<int> gpus;        ///< physical (NVML) indices
  int gpu_count = 0;            ///< or any this many, chosen at admission (the freest first)
  std::uint64_t mem_limit = 0;  ///< per GPU; 0 = the whole GPU
  unsigned cpus = 1;            ///< CPU slots a CPU call takes

  [[nodiscard]] bool on_gpu() const noexcept { return !gpus.empty() || gpu_count > 0; }
};

/// @brief The request of a call made with `opts` (gpu, gpus or gpu_count, mem_limit, cpus).
/// @throws usage_error for conflicting GPU options (gpu_request_for).
ISORUN_API admission_request admission_request_for(const isolated_options& opts);

class admission;

/// @brief The request of a call made with `opts` at `at`: an executor's admission
///        (`behind_executor`: a call without GPUs of its own then runs on one of the executor's,
///        if it has any) or the process's. `opts.cpus_per_call`, where 0, becomes the cores the
///        call gets (its thread limits). Every API's calls are placed through this.
/// @throws usage_error for conflicting GPU options.
ISORUN_API admission_request admission_request_at(const admission& at, bool behind_executor, isolated_options& opts);

class ISORUN_API admission : public std::enable_shared_from_this<admission> {
 public:
  /// What an admission shares out.
  struct limits {
    std::vector<gpu_info> gpus;  ///< each with `free_memory` to share (at detection)
    std::size_t per_gpu = 0;     ///< calls per GPU at most; 0 = as many as their caps allow
    std::size_t cpu_slots = 1;   ///< CPU slots
    /// GPU calls that may run at once, for their share of the cores; 0: one per GPU.
    std::size_t gpu_slots = 0;
    std::string name = "this process";  ///< in messages: "exceeds <name>'s 2 CPU slots"
  };

  /// What an admitted call holds until its worker is gone; dropping it lets the next calls in.
  class ticket;
  /// A call's place in the queue.
  class waiter;

  /// (Made with std::make_shared: each ticket keeps its admission alive.)
  explicit admission(limits l);
  ~admission();
  admission(const admission&) = delete;
  admission& operator=(const admission&) = delete;

  /// @brief The process-wide admission: the GPU inventory (isorun::gpus()) with each GPU's free
  ///        memory, and one CPU slot per usable core. Created on first use.
  static admission& process();

  /// @brief Queues `request` and returns its place. `then`: once admitted here, the call
  ///        queues there too for the same GPUs (an executor in front of the process).
  /// @throws usage_error when it can never fit here (a cap larger than a GPU's free memory, a
  ///         GPU this admission does not have, more CPU slots than there are), nothing queued.
  std::shared_ptr<waiter> enqueue(admission_request request, admission* then = nullptr);

  /// @brief enqueue() and waiting for the ticket, in one.
  std::shared_ptr<ticket> admit(admission_request request, admission* then = nullptr);

  /// @brief The cores a call of `request` gets (its thread limits): for a CPU call `cpus` shares
  ///        of the cores divided among the CPU slots, for a GPU call the cores divided among
  ///        the GPU calls that may run at once; at least 1.
  [[nodiscard]] unsigned share(const admission_request& request) const noexcept;

  /// @brief While the returned lease lives, at least `cpu_slots` CPU slots here. An executor or a
  ///        sweep given more CPU slots than the cores on purpose (calls that wait on I/O) holds
  ///        one on the process's admission, so that the slots it was given are there behind it
  ///        too; calls of the process still queue with its calls, first come, first served.
  [[nodiscard]] std::shared_ptr<void> widen_cpu_slots(std::size_t cpu_slots);
  /// @brief Keeps `lease` (one of widen_cpu_slots(), on the admission behind this one) while
  ///        this admission lives.
  void keep(std::shared_ptr<void> lease) noexcept { kept_ = std::move(lease); }

  /// @brief Cancels every call that waits here now, or was admitted here and waits behind (each
  ///        waiter's get() throws `cancelled`); admitted calls run on.
  void cancel_waiting();
  /// @brief Waits until no call waits here and none holds a ticket of it.
  void wait_idle();

  /// @brief Calls waiting here now.
  [[nodiscard]] std::size_t waiting() const;
  /// @brief Calls holding a ticket of this admission now.
  [[nodiscard]] std::size_t running() const;
  [[nodiscard]] const limits& shares() const noexcept { return limits_; }

  struct entry;  // a queued request (admission.cpp)

 private:
  friend class ticket;
  friend class waiter;
  /// What a granted request took: positions in limits_.gpus, bytes on each, CPU slots.
  struct grant {
    std::vector<std::size_t> positions;
    std::vector<std::uint64_t> bytes;  // on each of `positions`
    std::size_t cpus = 0;
  };
  // What a request takes on limits_.gpus[i]: its cap; without one, the GPU's share per call
  // (per_gpu), else the whole GPU.
  [[nodiscard]] std::uint64_t need_on(const admission_request& r, std::size_t i) const noexcept;
  void release(const grant& g) noexcept;
  void pump();                                           // grants what fits, in order; under mutex_
  [[nodiscard]] std::size_t cpu_slots() const noexcept;  // limits_.cpu_slots, or wider; under mutex_
  bool try_grant(entry& e, const std::vector<bool>& gpu_blocked);

  void remove(entry& e) noexcept;  // from the queue, in O(1); under mutex_

  limits limits_;
  mutable std::mutex mutex_;
  std::condition_variable idle_;              // a ticket was released, or the queue emptied
  std::list<std::shared_ptr<entry>> queue_;   // arrival order
  std::list<std::weak_ptr<waiter>> waiters_;  // every waiter made here, until it goes
  std::size_t queued_on_gpu_ = 0;             // entries of queue_ that ask for GPUs
  std::vector<std::uint64_t> used_bytes_;     // per limits_.gpus[i]
  std::vector<std::size_t> used_calls_;
  std::size_t used_cpus_ = 0;
  std::size_t running_ = 0;
  std::multiset<std::size_t> widened_;  // the leases' CPU slots
  std::shared_ptr<void> kept_;
};

class ISORUN_API admission::ticket {
 public:
  ~ticket();
  ticket(const ticket&) = delete;
  ticket& operator=(const ticket&) = delete;
  /// @brief The GPUs this call runs on, in PCI bus order; empty: the CPU.
  [[nodiscard]] const std::vector<gpu_info>& gpus() const noexcept { return gpus_; }

 private:
  friend class admission;
  friend class waiter;
  ticket(std::shared_ptr<admission> from, grant taken, std::vector<gpu_info> gpus);
  std::shared_ptr<admission> from_;
  grant taken_;
  std::vector<gpu_info> gpus_;
  std::shared_ptr<ticket> inner_;  // the process's, behind an executor's
};

class ISORUN_API admission::waiter {
 public:
  ~waiter();  // a waiter dropped before its grant leaves the queue; after it, its ticket lives on
  waiter(const waiter&) = delete;
  waiter& operator=(const waiter&) = delete;

  /// @brief Waits up to `timeout`; true once admitted or cancelled (get() then returns at once).
  bool wait_for(std::chrono::milliseconds timeout);
  /// @brief Blocks until admitted and returns the ticket (once; later calls return nullptr).
  /// @throws cancelled if cancel() came first.
  std::shared_ptr<ticket> get();
  /// @brief Leaves the queue: get() throws `cancelled`. Does nothing once admitted.
  void cancel() noexcept;
  /// @brief `notify` runs (at once, if it is so already) each time the waiter may have become
  ///        ready: admitted here, admitted or refused behind, cancelled. It runs under the
  ///        admission's lock: it must only hand the news on (post it to a thread), never call
  ///        back into an admission. Whoever it tells then asks wait_for(0ms).
  void set_notify(std::function<void()> notify);

 private:
  friend class admission;
  waiter(std::shared_ptr<admission> at, std::shared_ptr<entry> e, std::shared_ptr<admission> then);
  bool advance(std::unique_lock<std::mutex>& lock, std::chrono::steady_clock::time_point deadline);
  // (Owned: a waiter, like a ticket, may outlive the executor that made it.)
  std::shared_ptr<admission> at_;
  std::shared_ptr<entry> entry_;
  std::shared_ptr<admission> then_;
  std::exception_ptr failed_;      // queuing in then_ failed: get() rethrows it
  std::shared_ptr<ticket> outer_;  // granted by at_, waiting in then_
  std::shared_ptr<waiter> inner_;  // the place in then_
  std::shared_ptr<ticket> ready_;
  bool taken_ = false;
  bool cancel_asked_ = false;                          // under at_'s mutex: reaches `inner_` once it exists
  std::function<void()> notify_;                       // set_notify's, for `inner_` once it exists (under at_'s mutex)
  std::list<std::weak_ptr<waiter>>::iterator listed_;  // in at_->waiters_
};

}  // namespace isorun::runner
