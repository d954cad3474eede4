#pragma once
/// @file gpu_packer.hpp
/// Shares GPUs among jobs that need several at once. Each GPU has a number of places (the jobs
/// it may hold at a time: its slots in a slot_plan, i.e. its caps that fit); a job takes one
/// place on each of `k` distinct GPUs, all at once, and gives them back when it ends. Nothing is
/// ever over-committed, and no job holds some of its GPUs while it waits for the others, so jobs
/// cannot deadlock each other.
///
/// Fair: requests are served in the order they are made. One that cannot be served yet reserves
/// the GPUs it is waiting for (those with free places first), and later requests may only take
/// places on other GPUs until it is served. The GPUs it waits for then only drain, so a wide job
/// is never starved by a stream of narrow ones, while narrow ones still fill what it cannot use.
///
/// With memory given per GPU, a job also takes its cap's bytes on each of its GPUs, and a GPU's
/// jobs' caps never add up to more than its memory: jobs whose caps differ (a trial retried at a
/// larger cap after running out of memory) share GPUs without overcommitting them.

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "isorun/internal_api.hpp"
#include "isorun/runner/gpu_inventory.hpp"
#include "isorun/runner/placement.hpp"

namespace isorun::runner {

class ISORUN_INTERNAL_API gpu_packer {
 public:
  /// @brief One place per slot of `slots` on its GPU (CPU slots are ignored), and with `memory`
  ///        (bytes by GPU index) that much for the caps of the jobs on each GPU it names.
  explicit gpu_packer(const std::vector<slot>& slots, const std::map<int, std::uint64_t>& memory = {});

  gpu_packer(const gpu_packer&) = delete;
  gpu_packer& operator=(const gpu_packer&) = delete;

  /// @brief The number of distinct GPUs: the most one job can ask for.
  [[nodiscard]] std::size_t gpus() const noexcept { return gpus_.size(); }

  /// @brief Blocks until a place and `bytes` of memory on each of `k` distinct GPUs are this
  ///        caller's, and returns them in index order; nullopt once close() was called (then
  ///        nothing is taken). `bytes` counts only on GPUs the packer was given memory for.
  /// @throws std::invalid_argument if `k` is 0 or more than the GPUs that could ever hold `bytes`.
  std::optional<std::vector<gpu_info>> acquire(std::size_t k, std::uint64_t bytes = 0);

  /// @brief Gives back the places (and `bytes` on each) acquire() returned.
  void release(const std::vector<gpu_info>& taken, std::uint64_t bytes = 0);

  /// @brief Wakes every waiting acquire() (they return nullopt), and any later one returns at once.
  void close();

  /// @brief Requests waiting now (for progress reports, and tests).
  [[nodiscard]] std::size_t waiting();

 private:
  struct ticket {
    std::size_t k = 0;
    std::uint64_t bytes = 0;
    std::vector<std::size_t> granted;  // positions in gpus_; empty while waiting
  };
  void schedule();  // under mutex_: serves what can be served, in order, reserving for the rest
  bool could_hold(std::size_t g, std::uint64_t bytes) const;  // ever, once GPU g's jobs have ended

  std::vector<gpu_info> gpus_;
  std::vector<int> free_;                                           // free places per GPU
  std::vector<std::optional<std::uint64_t>> memory_, free_memory_;  // per GPU; nullopt: not counted
  std::deque<ticket*> waiting_;
  bool closed_ = false;
  std::mutex mutex_;
  std::condition_variable changed_;
};

}  // namespace isorun::runner

namespace isorun::runner {

/// @brief Runs items 0..count-1, at most `lanes` at a time, each on `need(item)` GPUs taken from
///        `packer` for as long as it runs: `run(slot{gpus, lane}, item)`, which must not throw.
///        Nothing new is handed out once `stop()` is true; close the packer to wake lanes that
///        wait for GPUs. This is who runs it.
template <class Need, class Run, class Stop>
void run_on_packed_gpus(gpu_packer& packer, std::size_t lanes, std::size_t count, Need&& need, Run&& run, Stop&& stop) {
  std::atomic<std::size_t> next{0};
  std::vector<std::thread> threads;
  threads.reserve(lanes);
  for (std::size_t lane = 0; lane < lanes; ++lane)
    threads.emplace_back([&, lane] {
      for (std::size_t item; !stop() && (item = next++) < count;) {
        auto taken = packer.acquire(need(item));
        if (!taken) return;  // closed: the run is stopping
        run(slot{*taken, static_cast<int>(lane)}, item);
        packer.release(*taken);
      }
    });
  for (auto& t : threads) t.join();
}

}  // namespace isorun::runner
