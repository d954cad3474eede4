#include "engine/progress.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "isorun/runner/printable.hpp"
#include "isorun/runner/units.hpp"
#include "isorun/sweep/report.hpp"

namespace isorun::sweep {

namespace {
std::string duration(double seconds) {
  char buf[32];
  if (seconds < 60) std::snprintf(buf, sizeof buf, "%.0fs", seconds);
  else std::snprintf(buf, sizeof buf, "%dm%02ds", static_cast<int>(seconds) / 60, static_cast<int>(seconds) % 60);
  return buf;
}
}  // namespace

progress::progress(const sweep_spec& s, bool enabled, std::size_t todo, std::size_t lanes)
    : s_{s},
      enabled_{enabled},
      tty_{enabled && ::isatty(STDERR_FILENO)},
      todo_{todo},
      lanes_{std::max<std::size_t>(1, lanes)} {}

void progress::running(std::size_t n) {
  std::lock_guard lock(mutex_);
  running_ = n;
  draw(nullptr);
}

void progress::durable(const trial_record& r) {
  std::lock_guard lock(mutex_);
  ++finished_;
  busy_seconds_ += r.wall_s;
  if (r.kind == outcome_kind::success) {
    if (auto m = metric_of(s_, r); m && (!best_ || (s_.metric.maximize ? *m > *best_ : *m < *best_))) best_ = m;
  } else if (r.pruned) {
    ++pruned_;
  } else {
    ++failed_;
  }
  draw(&r);
}

void progress::draw(const trial_record* r) {
  if (!enabled_) return;
  const double avg = finished_ ? busy_seconds_ / double(finished_) : 0;
  const double eta = avg * double(todo_ - std::min(todo_, finished_)) / double(lanes_);
  char best_text[64] = "";
  if (best_) std::snprintf(best_text, sizeof best_text, " | best %s %.4g", printable(s_.metric.name).c_str(), *best_);
  // Pruned trials are done (not failed); the count shows where early stopping is on.
  const std::string pruned = !s_.early_stopping && !pruned_ ? "" : " | " + std::to_string(pruned_) + " pruned";
  if (tty_) {
    std::fprintf(stderr, "\r\033[K[%zu/%zu done | %zu running%s | %zu failed | ETA %s%s]", finished_, todo_, running_,
                 pruned.c_str(), failed_, finished_ ? duration(eta).c_str() : "?", best_text);
  } else if (r) {
    auto m = metric_of(s_, *r);
    std::fprintf(stderr, "[%zu/%zu] %s %s%s (%.2f s on %s, attempt %d)\n", finished_, todo_, r->id.c_str(),
                 std::string(outcome_name(*r)).c_str(),
                 m ? printable(" " + s_.metric.name + "=" + std::to_string(*m)).c_str() : "", r->wall_s,
                 printable(r->device).c_str(), r->attempts);
  }
  std::fflush(stderr);
}

void progress::stopping(int requests, std::size_t running, std::chrono::milliseconds grace) {
  std::lock_guard lock(mutex_);
  if (tty_) std::fprintf(stderr, "\n");
  if (requests == 1)
    std::fprintf(stderr,
                 "isorun: stopping: no new trials; %zu running trial%s SIGTERM, then SIGKILL after %s; "
                 "Ctrl-C again to kill %s now\n",
                 running, running == 1 ? " gets" : "s get", format_duration(grace).c_str(),
                 running == 1 ? "it" : "them");
  else std::fprintf(stderr, "isorun: killing %zu running trial%s now\n", running, running == 1 ? "" : "s");
}

void progress::end() {
  std::lock_guard lock(mutex_);
  if (tty_) std::fprintf(stderr, "\n");
}

}  // namespace isorun::sweep
