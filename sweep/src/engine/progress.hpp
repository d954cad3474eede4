#pragma once
// What a running sweep says on stderr: a live line on a terminal ([3/10 done | 2 running | ...]),
// one plain line per durable record otherwise, and what a stop request does.

#include <chrono>
#include <cstddef>
#include <mutex>
#include <optional>

#include "isorun/sweep/journal.hpp"
#include "isorun/sweep/spec.hpp"

namespace isorun::sweep {

class progress {
 public:
  /// @param enabled  false: says nothing but what a stop request does
  /// @param todo     trials this run will finish
  /// @param lanes    trials running at once (for the ETA)
  progress(const sweep_spec& s, bool enabled, std::size_t todo, std::size_t lanes);

  /// @brief `n` trials run now (redraws the live line).
  void running(std::size_t n);
  /// @brief `r` is durable: it counts (and is printed as a plain line off a terminal).
  void durable(const trial_record& r);
  /// @brief Says what stop request number `requests` does to the `running` trials.
  void stopping(int requests, std::size_t running, std::chrono::milliseconds grace);
  /// @brief Ends the live line.
  void end();

 private:
  void draw(const trial_record* r);  // under mutex_

  const sweep_spec& s_;
  const bool enabled_, tty_;
  const std::size_t todo_, lanes_;
  std::mutex mutex_;
  std::size_t finished_ = 0, running_ = 0, failed_ = 0, pruned_ = 0;
  double busy_seconds_ = 0;
  std::optional<double> best_;
};

}  // namespace isorun::sweep
