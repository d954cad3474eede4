#include "isorun/sweep/log_follower.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>

#include <cerrno>
#include <set>
#include <string>
#include <utility>

#include "isorun/sweep/report_lines.hpp"

namespace isorun::sweep {

struct log_follower::log_state {
  unique_fd log;
  int watch = -1;  // its inotify watch; -1 without one (its reports come at its end)
  off_t at = 0;
  report_lines lines;

  // Hands on what was written since the last read.
  void read_new() {
    char buf[1 << 16];
    for (;;) {
      const ssize_t n = ::pread(log.get(), buf, sizeof buf, at);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;
      at += n;
      lines.feed(buf, static_cast<std::size_t>(n));
    }
  }
};

log_follower::log_follower()
    : inotify_{::inotify_init1(IN_CLOEXEC | IN_NONBLOCK)}, wake_{::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)} {
  if (inotify_ && wake_) thread_ = std::thread([this] { watch(); });
}

log_follower::~log_follower() {
  if (!thread_.joinable()) return;
  const std::uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(wake_.get(), &one, sizeof one);
  thread_.join();
}

log_follower::following log_follower::follow(unique_fd log, on_report_fn on_report, on_checkpoint_fn on_checkpoint) {
  std::lock_guard lock(mutex_);
  const std::uint64_t id = next_id_++;
  log_state& s = logs_[id];
  s.log = std::move(log);
  s.lines.on_report = std::move(on_report);
  s.lines.on_checkpoint = std::move(on_checkpoint);
  if (thread_.joinable()) {
    // The file this process opened, not whatever its name means now (/proc/self/fd is its inode).
    const std::string self = "/proc/self/fd/" + std::to_string(s.log.get());
    s.watch = ::inotify_add_watch(inotify_.get(), self.c_str(), IN_MODIFY);
  }
  // What was written before the watch was set is read at the first event, or at the end.
  return following(this, id);
}

void log_follower::end(std::uint64_t id) noexcept {
  log_state s;
  {
    std::lock_guard lock(mutex_);
    const auto it = logs_.find(id);
    if (it == logs_.end()) return;
    s = std::move(it->second);
    logs_.erase(it);
    // Freeing the watch's mark is left to the kernel's worker: this does not wait for it.
    if (s.watch >= 0) ::inotify_rm_watch(inotify_.get(), s.watch);
  }
  try {
    s.read_new();  // out of the map, so the thread cannot be reading it
  } catch (...) {
  }  // a report the sink could not take is lost, as one thrown on the thread would be
}

void log_follower::watch() {
  alignas(inotify_event) char events[16 * 1024];
  for (;;) {
    pollfd fds[2] = {{inotify_.get(), POLLIN, 0}, {wake_.get(), POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents & POLLIN) return;
    std::set<int> modified;
    bool overflow = false;
    for (;;) {
      const ssize_t n = ::read(inotify_.get(), events, sizeof events);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      for (ssize_t at = 0; at < n;) {
        const auto* e = reinterpret_cast<const inotify_event*>(events + at);
        if (e->mask & IN_Q_OVERFLOW) overflow = true;
        else modified.insert(e->wd);
        at += static_cast<ssize_t>(sizeof(inotify_event) + e->len);
      }
    }
    std::lock_guard lock(mutex_);
    for (auto& [id, s] : logs_) {
      if (!overflow && !modified.count(s.watch)) continue;  // an event lost to overflow: read them all
      try {
        s.read_new();
      } catch (...) {
      }
    }
  }
}

}  // namespace isorun::sweep
