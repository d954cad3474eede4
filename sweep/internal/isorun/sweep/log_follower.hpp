#pragma once
/// @file log_follower.hpp
/// Follows the stdout logs that trials write directly (workers and commands), handing each
/// report line, and a command's checkpoint lines, on as they are written (report_lines.hpp).
/// One inotify instance and one thread serve every trial of a backend: closing an inotify
/// instance that held a watch waits for an RCU grace period (up to milliseconds on a busy
/// machine), so an instance per trial put that wait between every two trials on a lane.
///
/// Threads: follow() and following::end() from any thread. Reports of a log reach its
/// `on_report` in order, one call at a time across all logs, on the follower's thread while the
/// log grows and on end()'s caller for what is left at the end; after end() returns, never again.

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "isorun/runner/unique_fd.hpp"

namespace isorun::sweep {

class log_follower {
 public:
  using on_report_fn = std::function<void(std::int64_t step, nlohmann::json metrics)>;
  using on_checkpoint_fn = std::function<void(std::int64_t step)>;

  /// A log being followed, until end() or its destructor.
  class following {
   public:
    following() = default;
    following(following&& o) noexcept : owner_{std::exchange(o.owner_, nullptr)}, id_{o.id_} {}
    following& operator=(following&& o) noexcept {
      if (this != &o) {
        end();
        owner_ = std::exchange(o.owner_, nullptr);
        id_ = o.id_;
      }
      return *this;
    }
    ~following() { end(); }
    /// Reads what the log holds now, hands its reports on, and stops following it.
    void end() noexcept {
      if (owner_) std::exchange(owner_, nullptr)->end(id_);
    }

   private:
    friend class log_follower;
    following(log_follower* owner, std::uint64_t id) : owner_{owner}, id_{id} {}
    log_follower* owner_ = nullptr;
    std::uint64_t id_ = 0;
  };

  /// Starts the thread; without inotify (no instance left to this user) reports come only at
  /// each log's end.
  log_follower();
  ~log_follower();  ///< every following must have ended
  log_follower(const log_follower&) = delete;
  log_follower& operator=(const log_follower&) = delete;

  /// @brief Follows `log` (open for reading) from its start; reports go to `on_report`, and
  ///        checkpoint lines to `on_checkpoint` where one is given. Both are called as reports
  ///        are: they must not block (a commit's fsync belongs on another thread), since every
  ///        other log waits meanwhile.
  [[nodiscard]] following follow(unique_fd log, on_report_fn on_report, on_checkpoint_fn on_checkpoint = {});

 private:
  struct log_state;
  void end(std::uint64_t id) noexcept;
  void watch();

  unique_fd inotify_, wake_;
  std::mutex mutex_;
  std::map<std::uint64_t, log_state> logs_;  // under mutex_, as is reading them
  std::uint64_t next_id_ = 0;                // under mutex_
  std::thread thread_;
};

}  // namespace isorun::sweep
