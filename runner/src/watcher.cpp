#include "watcher.hpp"

#include "isorun/runner/watcher_idle.hpp"

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <queue>
#include <thread>
#include <type_traits>
#include <vector>

#include "isorun/runner/errors.hpp"
#include "isorun/serialization/protocol.hpp"

namespace isorun::runner {
namespace ser = isorun::serialization;

namespace {

constexpr std::size_t slots = worker_watch::slot_count;
constexpr auto never = clock::time_point::max();

// How soon a job whose descriptors could not all be watched (no memory for them) is looked at
// again: nothing else would wake the watcher for it.
constexpr auto retry = std::chrono::milliseconds(10);

// An epoll registration's data: which item, in which generation of its slot, and which of its
// descriptors. Two values no item has tag the watcher's own descriptors.
constexpr std::uint64_t wake_tag = ~std::uint64_t{0}, alarm_tag = ~std::uint64_t{0} - 1;
std::uint64_t tag(std::uint32_t item, std::uint32_t generation, std::size_t slot) {
  return (std::uint64_t{generation} << 32) | (std::uint64_t{item} << 8) | slot;
}

// A grace too long for the clock is no end.
clock::time_point after(std::chrono::milliseconds grace) {
  const auto now = clock::now();
  return grace < std::chrono::duration_cast<std::chrono::milliseconds>(never - now) ? now + grace : never;
}

}  // namespace

struct watcher::impl {
  // One job the watcher holds: watched to the end of its watch (`running`), then, after an early
  // hand-over, until its worker is gone.
  struct item {
    std::shared_ptr<job::state> state;      // null: a free slot
    std::unique_ptr<worker_watch> running;  // null once the worker only exits
    clock::time_point due = never;          // running: the watch's; exiting: the end of its grace
    clock::time_point scheduled = never;    // its live entry in `deadlines` (never: none)
    bool killed = false;                    // exiting: killed (at a cancel or its grace's end), not gone yet
    bool unwatched = false;                 // a descriptor could not be registered: looked at on a clock
    std::array<int, slots> watched;         // the descriptor registered per slot, -1 for none
    std::uint32_t generation = 0;
    worker_watch::events ready{};  // gathered from one epoll_wait (the watcher's thread alone)
    bool touched = false;
    bool counted = false;  // in `watching` (under the lock): from take_in to free
    item() { watched.fill(-1); }
  };
  struct deadline {
    clock::time_point when;
    std::uint32_t item, generation;
    bool operator>(const deadline& o) const noexcept { return when > o.when; }
  };

  impl()
      : epoll{::epoll_create1(EPOLL_CLOEXEC)},
        wake{::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)},
        alarm_fd{::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK)} {
    static_assert(std::is_same_v<clock, std::chrono::steady_clock>, "the alarm is set on CLOCK_MONOTONIC");
    if (!epoll || !wake || !alarm_fd || !add(wake.get(), wake_tag) || !add(alarm_fd.get(), alarm_tag))
      throw internal_error(std::string("the call watcher's epoll, eventfd or timerfd: ") + std::strerror(errno));
    // The process's signals go to the program's threads, not to this one.
    sigset_t all, before;
    ::sigfillset(&all);
    ::pthread_sigmask(SIG_SETMASK, &all, &before);
    std::thread([this] { run(); }).detach();
    ::pthread_sigmask(SIG_SETMASK, &before, nullptr);
  }

  bool add(int fd, std::uint64_t data) noexcept {
    epoll_event e{.events = EPOLLIN, .data = {.u64 = data}};
    return ::epoll_ctl(epoll.get(), EPOLL_CTL_ADD, fd, &e) == 0;
  }

  // (Under the lock.) A slot for `s`, its descriptors registered, its deadline set.
  void take_in(std::shared_ptr<job::state> s, std::unique_ptr<worker_watch> running, clock::time_point due) {
    std::uint32_t id;
    if (free_slots.empty()) {
      items.push_back(std::make_unique<item>());
      id = static_cast<std::uint32_t>(items.size() - 1);
    } else {
      id = free_slots.back();
      free_slots.pop_back();
    }
    item& it = *items[id];
    it.state = std::move(s);
    it.running = std::move(running);
    it.killed = false;
    it.due = due;
    it.scheduled = never;
    it.counted = true;
    ++watching;
    sync(id, it);
    schedule(id, it);
  }

  // (Under the lock.) `it` no longer counts as watched to the end of its watch.
  void uncount(item& it) {
    if (!std::exchange(it.counted, false)) return;
    --watching;
    idle.notify_all();
  }

  // The descriptor `it` wants watched in each slot now.
  static int wanted(const item& it, std::size_t k) {
    if (it.running) return it.running->fd(static_cast<worker_watch::slot>(k));
    if (k == worker_watch::exit_slot) return it.state->worker.process.pidfd();
    if (k == worker_watch::cancel_slot && !it.killed) return it.state->cancel_event.get();
    return -1;
  }

  // Registers and unregisters `it`'s descriptors as they are wanted now. (A registration lives as
  // long as the open file, which a copy of the descriptor, a pool's pidfd, can keep open: each is
  // removed before its descriptor closes.)
  void sync(std::uint32_t id, item& it) noexcept {
    it.unwatched = false;
    for (std::size_t k = 0; k < slots; ++k) {
      const int want = it.state ? wanted(it, k) : -1;
      if (it.watched[k] == want) continue;
      if (it.watched[k] >= 0) ::epoll_ctl(epoll.get(), EPOLL_CTL_DEL, it.watched[k], nullptr);
      it.watched[k] = -1;
      if (want >= 0 && add(want, tag(id, it.generation, k))) it.watched[k] = want;
      else if (want >= 0) it.unwatched = true;
    }
  }

  // (Under the lock.) `it`'s next look on the clock: its deadline, or soon while a descriptor of
  // it is not watched.
  void schedule(std::uint32_t id, item& it) {
    const auto when = it.unwatched ? std::min(it.due, clock::now() + retry) : it.due;
    if (when == it.scheduled) return;
    it.scheduled = when;  // (an earlier entry of it is stale from now on)
    if (when == never) return;
    deadlines.push({when, id, it.generation});
    if (when < alarm) alarm_at(when);
  }

  // (Under the lock.) A deadline seconds away lies beyond the next tick: arming it touches no
  // hardware timer, unlike an alarm due within a tick.
  void alarm_at(clock::time_point when) noexcept {
    alarm = when;
    const auto ns = std::max<std::int64_t>(
        1, std::chrono::duration_cast<std::chrono::nanoseconds>(when.time_since_epoch()).count());
    itimerspec at{};
    at.it_value.tv_sec = static_cast<time_t>(ns / 1'000'000'000);
    at.it_value.tv_nsec = static_cast<long>(ns % 1'000'000'000);
    ::timerfd_settime(alarm_fd.get(), TFD_TIMER_ABSTIME, &at, nullptr);
  }

  // One look at `it` (on the watcher's thread, not under the lock): its steps, then what it
  // wants watched. True once it is done with.
  bool look(std::uint32_t id, item& it) {
    worker_watch::events ready = it.ready;
    it.ready = {};
    it.touched = false;
    if (it.unwatched) {  // asked by poll, as its descriptors could not all be watched
      pollfd p[slots];
      for (std::size_t k = 0; k < slots; ++k) p[k] = {wanted(it, k), POLLIN, 0};
      if (::poll(p, slots, 0) > 0)
        for (std::size_t k = 0; k < slots; ++k) ready[k] = static_cast<short>(ready[k] | p[k].revents);
    }
    if (it.running) {
      if (it.running->step(ready)) return end_watch(id, it);
      it.due = it.running->due();
    } else if (ready[worker_watch::exit_slot] & POLLIN) {
      unwatch_all(it);
      it.state->worker.process.reap();  // gone: this does not wait
      release_worker(*it.state);
      return true;
    } else if (!it.killed && ((ready[worker_watch::cancel_slot] & POLLIN) || clock::now() >= it.due)) {
      it.state->worker.process.signal(SIGKILL);  // its call is over: no grace beyond its grace
      it.killed = true;
      it.due = never;
    }
    sync(id, it);
    return false;
  }

  // look(), and where it throws (no memory, say), the job ends internal_error saying so instead
  // of the watcher ending: its worker is killed and reaped, its waiters woken.
  bool look_or_fail(std::uint32_t id, item& it) noexcept {
    try {
      return look(id, it);
    } catch (const std::exception& e) {
      return fail(id, it, e.what());
    } catch (...) {
      return fail(id, it, "an unknown error");
    }
  }

  bool fail(std::uint32_t id, item& it, const char* why) noexcept {
    try {
      if (!it.running) {  // only exiting: killed, and looked at again on a clock until reaped
        it.state->worker.process.signal(SIGKILL);
        it.killed = it.unwatched = true;
        return false;
      }
      it.running->fail(why);
      return end_watch(id, it);
    } catch (...) {
      return false;  // (looked at again on its next event)
    }
  }

  // The watch of a running job is over: its end is published, and after an early hand-over the
  // worker's exit is watched from here on. True if the item is done with.
  bool end_watch(std::uint32_t id, item& it) {
    unwatch_all(it);
    watch_record r = it.running->finish();  // (reaps the worker, unless early)
    it.running.reset();
    job::state& s = *it.state;
    const bool early = r.early;
    // A CPU call's core is free once its result is handed over (the exit takes little of it). A
    // GPU call's memory is not, until its worker is gone.
    if (early && s.spec.gpus.empty()) s.spec.admitted.reset();
    if (!early) release_worker(s);
    publish_end(s, std::move(r));
    if (!early) return true;
    it.due = after(s.spec.grace);
    sync(id, it);
    if (s.worker.control) [[maybe_unused]]
      auto sent = ::send(s.worker.control.get(), &ser::let_go, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    return false;
  }

  static bool live(const item& it, const deadline& d) noexcept {
    return it.state && it.generation == d.generation && it.scheduled == d.when;
  }

  // Every descriptor of `it` out of the epoll set, before any of them closes.
  void unwatch_all(item& it) noexcept {
    for (int& fd : it.watched) {
      if (fd >= 0) ::epoll_ctl(epoll.get(), EPOLL_CTL_DEL, fd, nullptr);
      fd = -1;
    }
  }

  // (Under the lock.) The slot is free again; a later item in it has another generation.
  void free(std::uint32_t id) {
    item& it = *items[id];
    unwatch_all(it);
    it.state.reset();
    it.running.reset();
    ++it.generation;
    free_slots.push_back(id);
    uncount(it);
  }

  void run() {
    epoll_event events[64];
    std::vector<std::pair<std::uint32_t, item*>> touched;
    std::vector<std::function<void()>> tasks;
    for (;;) {
      const int n = ::epoll_wait(epoll.get(), events, 64, -1);
      {
        std::lock_guard lock(mutex);
        for (int i = 0; i < n; ++i) {
          const std::uint64_t data = events[i].data.u64;
          if (data == wake_tag) {
            std::uint64_t count;
            [[maybe_unused]] auto r = ::read(wake.get(), &count, sizeof count);
            tasks.swap(posted);
          } else if (data == alarm_tag) {
            std::uint64_t rang;
            [[maybe_unused]] auto r = ::read(alarm_fd.get(), &rang, sizeof rang);
            alarm = never;
          } else {
            const auto id = static_cast<std::uint32_t>((data >> 8) & 0xffffff);
            item& it = *items[id];
            if (!it.state || it.generation != static_cast<std::uint32_t>(data >> 32)) continue;  // gone since
            short& r = it.ready[data & 0xff];
            r = static_cast<short>(r | static_cast<short>(events[i].events));  // (EPOLLIN is POLLIN, ...)
            if (!it.touched) touched.emplace_back(id, &it);
            it.touched = true;
          }
        }
        const auto now = clock::now();
        while (!deadlines.empty() && deadlines.top().when <= now) {
          const deadline d = deadlines.top();
          deadlines.pop();
          item& it = *items[d.item];
          if (!live(it, d)) continue;
          it.scheduled = never;
          if (!it.touched) touched.emplace_back(d.item, &it);
          it.touched = true;
        }
      }
      std::vector<std::uint32_t> done;
      for (auto [id, it] : touched)
        if (look_or_fail(id, *it)) done.push_back(id);
      {
        std::lock_guard lock(mutex);
        for (auto [id, it] : touched)
          if (std::find(done.begin(), done.end(), id) == done.end()) schedule(id, *it);
        for (std::uint32_t id : done) free(id);
        // Stale deadlines (a look moved them) are dropped here, so the alarm is set for a live one.
        while (!deadlines.empty() && !live(*items[deadlines.top().item], deadlines.top())) deadlines.pop();
        if (!deadlines.empty() && deadlines.top().when < alarm) alarm_at(deadlines.top().when);
      }
      touched.clear();
      for (auto& task : tasks) {
        try {
          task();
        } catch (...) {  // (a task catches its own failures; this thread must go on whatever)
        }
      }
      tasks.clear();
      {
        std::lock_guard lock(mutex);
        if (posted.empty()) idle.notify_all();
      }
    }
  }

  unique_fd epoll, wake, alarm_fd;
  std::mutex mutex;
  std::vector<std::unique_ptr<item>> items;  // (unique_ptr: an item stays where it is as this grows)
  std::vector<std::uint32_t> free_slots;
  std::priority_queue<deadline, std::vector<deadline>, std::greater<>> deadlines;
  clock::time_point alarm = never;  // when the alarm rings (never: not armed)
  std::vector<std::function<void()>> posted;
  std::condition_variable idle;  // `watching` went down, or posted tasks ran
  std::size_t watching = 0;      // items held (watched, exiting, or ended and not yet freed)
};

watcher::watcher() : impl_{new impl} {}

watcher& watcher::instance() {
  static auto* w = new watcher;  // never destroyed: calls may end while the process exits
  return *w;
}

void watcher::watch(std::shared_ptr<job::state> s) {
  auto running = std::make_unique<worker_watch>(*s);
  const auto due = running->due();
  std::lock_guard lock(impl_->mutex);
  impl_->take_in(std::move(s), std::move(running), due);
}

void watcher::adopt(std::shared_ptr<job::state> s) {
  s->worker.stderr_read.reset();  // nothing more of it is reported
  job::state& state = *s;
  std::lock_guard lock(impl_->mutex);
  impl_->take_in(std::move(s), nullptr, after(state.spec.grace));
  // Last, under the lock: the watcher cannot let go of the worker before it is told.
  if (state.worker.control) [[maybe_unused]]
    auto sent = ::send(state.worker.control.get(), &ser::let_go, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
}

void watcher::wait_idle() {
  // A task posted now runs after the look that may free the jobs that ended meanwhile.
  bool ran = false;
  std::mutex m;
  std::condition_variable cv;
  post([&] {
    std::lock_guard lock(m);
    ran = true;
    cv.notify_all();
  });
  {
    std::unique_lock lock(m);
    cv.wait(lock, [&] { return ran; });
  }
  std::unique_lock lock(impl_->mutex);
  impl_->idle.wait(lock, [&] { return impl_->posted.empty() && impl_->watching == 0; });
}

void watcher::post(std::function<void()> task) {
  std::lock_guard lock(impl_->mutex);
  // Tasks already waiting have their wake-up pending (it is read, and they are taken, under this
  // lock): thousands of calls cancelled at once cost one write, not a system call each.
  const bool wake = impl_->posted.empty();
  impl_->posted.push_back(std::move(task));
  if (!wake) return;
  const std::uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(impl_->wake.get(), &one, sizeof one);
}

void wait_for_watcher_idle() { watcher::instance().wait_idle(); }

}  // namespace isorun::runner
