#include "isorun/runner/standby.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <algorithm>
#include <map>
#include <memory>
#include <tuple>
#include <utility>

#include "isorun/runner/errors.hpp"
#include "isorun/runner/zygote.hpp"
#include "isorun/serialization/machine.hpp"
#include "isorun/serialization/protocol.hpp"

namespace isorun::runner {

namespace {
// What makes two launches interchangeable: everything but the label, which only names the
// worker in ps.
// (Not whether they are forked from a zygote: a job asks its pool for a worker launched as its
// spec says, and a pool's own workers are all made one way. Pools are told apart by both.)
using launch_key = std::tuple<std::string, std::vector<std::string>, bool, std::string, std::vector<std::string>>;
launch_key key_of(const launch_spec& s) {
  return {s.executable, s.extra_env, s.stdout_to_stderr, s.warm ? serialization::to_env(*s.warm) : std::string(),
          s.argv};
}

// key_of(a) == key_of(b), without copying either: asked on every call.
bool same_launch(const launch_spec& a, const launch_spec& b) {
  return a.executable == b.executable && a.extra_env == b.extra_env && a.stdout_to_stderr == b.stdout_to_stderr &&
         a.argv == b.argv && a.warm.has_value() == b.warm.has_value() &&
         (!a.warm || serialization::to_env(*a.warm) == serialization::to_env(*b.warm));
}

// Whether the process of `pidfd` has exited (its pidfd is readable then), without waiting.
bool exited(const unique_fd& pidfd) {
  pollfd p{pidfd.get(), POLLIN, 0};
  return ::poll(&p, 1, 0) != 0;
}

// A worker launched ahead binds its symbols while it waits (LD_BIND_NOW for its start), not at
// the first call of each on the call's path: a standby call's worker-side steps take ~30% less.
// The worker removes the variable at once (serialization::env::bind_now), so that what its task
// starts binds as it would. Not for an interpreter (the modules a call imports would bind
// whole), nor a launch a call waits for (a miss; a pool with none waiting), nor where the user
// set LD_BIND_NOW.
launch_spec ahead_of_time(const launch_spec& s) {
  if (!s.argv.empty() || s.zygote || std::getenv("LD_BIND_NOW")) return s;
  launch_spec out = s;
  out.extra_env.emplace_back("LD_BIND_NOW=1");
  out.extra_env.push_back(std::string(serialization::env::bind_now) + "=1");
  return out;
}
}  // namespace

standby_pool::standby_pool(launch_spec spec, std::size_t size, std::size_t max_size, std::chrono::milliseconds idle,
                           std::chrono::milliseconds linger)
    : spec_{std::move(spec)},
      wanted_{::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)},
      size_{size},
      target_{size},
      max_size_{std::max(size, max_size ? max_size : serialization::usable_cores())},
      idle_{idle},
      linger_{linger} {
  if (!wanted_) throw internal_error(std::string("eventfd: ") + std::strerror(errno));
  if (!watched_ || !watch(wanted_)) throw internal_error(std::string("epoll: ") + std::strerror(errno));
  spec_.label = "standby";       // its task is not known yet
  spec_.before_start = nullptr;  // a call's, not the pool's
  if (linger_.count() > 0) {
    // Adaptive: nothing until the first call has come and gone. Calls meanwhile get exec'd workers.
    dormant_ = true;
    target_ = 0;
    need_zygote_ = spec_.zygote;
    launcher_ = std::make_shared<local_launcher>();
  } else if (!spec_.zygote) {
    launcher_ = std::make_shared<local_launcher>();
  } else {
    need_zygote_ = true;  // the filler starts it
    zygote_settled_ = false;
  }
  filler_ = std::thread([this] { refill(); });
}

standby_pool::~standby_pool() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  interrupt();  // a filler waiting for its zygote to be ready (a preload that takes long, or never ends)
  wake_filler();
  filler_.join();
  std::lock_guard lock(mutex_);
  ready_.clear();     // each waiting worker's handle stops its process group and reaps it
  launcher_.reset();  // a zygote goes last
}

// The launcher, once there is one: a zygote pool's take() may come before the filler started it.
std::shared_ptr<launcher> standby_pool::source(std::unique_lock<std::mutex>& lock) {
  changed_.wait(lock, [&] { return launcher_ != nullptr; });
  return launcher_;
}

bool standby_pool::watch(const unique_fd& fd) const noexcept {
  epoll_event e{.events = EPOLLIN, .data = {.fd = fd.get()}};
  return ::epoll_ctl(watched_.get(), EPOLL_CTL_ADD, fd.get(), &e) == 0;
}

// Before the descriptor closes: a pidfd duplicated from the worker's stays registered while the
// worker's own is open, and an exited worker's pidfd is always readable.
void standby_pool::unwatch(const unique_fd& fd) const noexcept {
  ::epoll_ctl(watched_.get(), EPOLL_CTL_DEL, fd.get(), nullptr);
}

void standby_pool::wake_filler() const noexcept {
  const std::uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(wanted_.get(), &one, sizeof one);
}

// Started on the filler's thread, which lives as long as the pool: the zygote's parent-death
// signal, and its children's (made this process's children), follow it. (A zygote that cannot
// start leaves exec'd workers: zygote_launcher says so.) Its imports are waited for here, not by
// calls (which get exec'd workers meanwhile): the pool is then filled with forked workers.
// Interrupted when the pool stops, or asked to.
void standby_pool::start_zygote() {
  auto zygote = std::make_shared<zygote_launcher>(spec_);
  {
    std::lock_guard lock(mutex_);
    zygote_settled_ = false;
    launcher_ = zygote;
    if (interrupted_) zygote->interrupt();  // (before there was a launcher to tell)
    changed_.notify_all();
  }
  zygote->wait_ready();
  std::lock_guard lock(mutex_);
  zygote_settled_ = true;
  changed_.notify_all();
}

// An adaptive pool's linger has passed without a take: its waiting workers and its zygote are
// stopped (outside the lock), and calls get exec'd workers until one wakes it.
void standby_pool::go_dormant(std::unique_lock<std::mutex>& lock) {
  std::deque<launched_worker> waiting = std::move(ready_);
  ready_.clear();
  std::shared_ptr<launcher> previous;
  if (spec_.zygote) {
    previous = std::exchange(launcher_, std::make_shared<local_launcher>());
    need_zygote_ = true;
  }
  dormant_ = true;
  target_ = 0;
  changed_.notify_all();
  lock.unlock();
  waiting.clear();   // each handle stops its worker's process group and reaps it
  previous.reset();  // the zygote, unless a take() is launching through it now (then after that)
  lock.lock();
}

// The filler launches a worker when the pool is short of one that no running call owes it: a
// worker taken is owed back once it has exited (its call is over, or nearly: with early_result
// the exit follows the hand-over), and at once if no worker is left waiting, since the next call
// would otherwise launch its own on its path (but see defers_last()). Between launches it sleeps
// on an epoll set of the wake-up eventfd and the pidfds of the workers owed, which take() adds to
// without waking it.
void standby_pool::refill() {
  std::unique_lock lock(mutex_);
  std::optional<launch_spec> bound;  // (made once, by this thread)
  for (;;) {
    if (stopping_) return;
    // A dormant pool waits for a take, and then for that call's worker to exit.
    if (waking_ && exited(waking_)) {
      unwatch(waking_);
      waking_.reset();
      last_end_ = std::chrono::steady_clock::now();  // the first call's end: the linger counts from here
    }
    const bool woken = !dormant_ && (hurry_ || (!waking_pending_ && !waking_));
    if (woken && need_zygote_) {
      need_zygote_ = false;
      zygote_settled_ = false;  // (fill() waits for it from now)
      lock.unlock();
      start_zygote();
      lock.lock();
      continue;
    }
    int timeout_ms = -1;
    if (woken) {
      if (!bound) bound = ahead_of_time(spec_);
      if (launched_one(lock, *bound)) continue;
      const std::optional<int> wait = next_look(lock);
      if (!wait) continue;
      timeout_ms = *wait;
    }
    wait_for_events(lock, timeout_ms);
  }
}

// Launches a worker if one is due (owed workers that exited are owed no longer, and with none
// waiting an owed one is launched now, unless defers_last()); true if it did. Under `lock`,
// released while launching.
bool standby_pool::launched_one(std::unique_lock<std::mutex>& lock, const launch_spec& bound) {
  std::erase_if(owed_, [&](const unique_fd& pidfd) {
    if (!exited(pidfd)) return false;
    unwatch(pidfd);
    return true;
  });
  if (ready_.empty() && !owed_.empty() && !defers_last()) {  // nothing waits: launch now
    unwatch(owed_.front());
    owed_.pop_front();
  }
  if (failing_ || ready_.size() + owed_.size() >= target_) return false;
  // With none waiting, or the pool grown for calls that come back to back, calls are taking
  // workers as fast as they come: this one is soon needed, and starts as quickly and as cheaply
  // as it can (binding every symbol takes CPU the calls want).
  const launch_spec& how = ready_.empty() || target_ > size_ ? spec_ : bound;
  std::shared_ptr<launcher> from = launcher_;
  lock.unlock();
  // Launched outside the lock: take() never waits for a launch that is not its own.
  std::optional<launched_worker> w;
  try {
    w.emplace(from->launch(how));
  } catch (const std::exception&) {
  }
  lock.lock();
  if (w && !dormant_) ready_.push_back(std::move(*w));
  else if (!w) failing_ = true;
  changed_.notify_all();
  return true;
}

// How long the pool may wait before it looks again (-1: until something happens), or nullopt
// where it acted now (went dormant, or trimmed): look again at once. Under `lock`.
std::optional<int> standby_pool::next_look(std::unique_lock<std::mutex>& lock) {
  const auto now = std::chrono::steady_clock::now();
  int timeout_ms = -1;
  if (linger_.count() > 0) {
    // Adaptive: dormant once no call has run for `linger`. A call that runs longer than that (a
    // training run) keeps the pool: idleness counts from the end of the last call (seen at a look
    // every `linger` while any runs), not from when it was taken.
    if (std::erase_if(running_, exited) > 0) last_end_ = now;
    const auto left = std::max(last_take_, last_end_) + linger_ - now;
    if (running_.empty() && left <= std::chrono::steady_clock::duration::zero()) {
      go_dormant(lock);
      return std::nullopt;
    }
    timeout_ms = static_cast<int>(
        std::chrono::ceil<std::chrono::milliseconds>(running_.empty() ? left : std::chrono::nanoseconds(linger_))
            .count());
  }
  // Grown under load: back to `size` once no call has come for `idle`.
  if (target_ > size_) {
    const auto left = last_take_ + idle_ - now;
    if (left <= std::chrono::steady_clock::duration::zero()) {
      lock.unlock();
      trim();
      lock.lock();
      return std::nullopt;
    }
    const int ms = static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(left).count());
    timeout_ms = timeout_ms < 0 ? ms : std::min(timeout_ms, ms);
  }
  return timeout_ms;
}

// Waits, unlocked, for a watched worker's exit, a wish (wanted_) or `timeout_ms`.
void standby_pool::wait_for_events(std::unique_lock<std::mutex>& lock, int timeout_ms) {
  lock.unlock();
  epoll_event ready[8];
  if (::epoll_wait(watched_.get(), ready, 8, timeout_ms) < 0 && errno != EINTR) {
    lock.lock();
    failing_ = true;  // cannot wait: launch no more in the background (take() still launches)
    changed_.notify_all();
    return;
  }
  std::uint64_t drained;
  [[maybe_unused]] auto n = ::read(wanted_.get(), &drained, sizeof drained);
  lock.lock();
}

launched_worker standby_pool::take() {
  bool waking = false;
  {
    std::unique_lock lock(mutex_);
    last_take_ = std::chrono::steady_clock::now();
    if (dormant_) {  // the first call in a while: its own worker now, the pool once it has exited
      dormant_ = false;
      hurry_ = false;
      waking = waking_pending_ = true;
      target_ = size_;
    } else if (waking_pending_ || waking_) {
      // A second call while the first still runs: they come in a burst, which the pool serves
      // best started at once (the first call's own start is behind it).
      hurry_ = true;
      if (waking_) {
        unwatch(waking_);
        waking_.reset();
      }
      wake_filler();
    }
    // A call taken while an earlier one still runs: they come back to back, and the replacement
    // is launched at once instead of after that exit.
    std::erase_if(running_, exited);
    const bool back_to_back = !running_.empty();
    if (back_to_back && !waking) target_ = std::min(max_size_, target_ + 1);  // calls overlap: keep more waiting
    while (!ready_.empty()) {
      launched_worker w = std::move(ready_.front());
      ready_.pop_front();
      if (!w.process.peek()) {
        ++hits_;
        // Owed back once it exits (spaced calls): its pidfd joins what the filler sleeps on, which
        // wakes it then, not now (a wake-up now would put the filler on a core just as this call's
        // worker wants one). Without a pidfd to watch it is owed no longer, and the filler is told.
        bool owed = false;
        if (unique_fd pidfd{::fcntl(w.process.pidfd(), F_DUPFD_CLOEXEC, 0)}; pidfd && !back_to_back && watch(pidfd)) {
          owed_.push_back(std::move(pidfd));
          owed = true;
        }
        if (unique_fd pidfd{::fcntl(w.process.pidfd(), F_DUPFD_CLOEXEC, 0)}) running_.push_back(std::move(pidfd));
        const bool now = !owed || (ready_.empty() && !defers_last());  // replacements due now (or more)
        lock.unlock();
        if (now) wake_filler();
        w.waiting = true;
        return w;
      }
      // It died while waiting: `w` is reaped as it goes, and the next one is tried.
      wake_filler();
    }
    ++misses_;
  }
  if (!waking) wake_filler();
  std::unique_lock lock(mutex_);
  std::shared_ptr<launcher> from = source(lock);
  const bool forks = dynamic_cast<zygote_launcher*>(from.get()) != nullptr;
  lock.unlock();
  launch_spec exec_spec;
  if (!forks && spec_.zygote) (exec_spec = spec_).zygote = false;  // a dormant zygote pool's call: exec'd
  std::optional<launched_worker> w;
  try {
    w.emplace(from->launch(!forks && spec_.zygote ? exec_spec : spec_));  // none ready: launched now
  } catch (...) {
    if (waking) {
      lock.lock();
      waking_pending_ = false;  // the pool starts now, without that exit to wait for
      lock.unlock();
      wake_filler();
    }
    throw;
  }
  if (waking) {
    lock.lock();
    waking_pending_ = false;
    if (unique_fd pidfd{::fcntl(w->process.pidfd(), F_DUPFD_CLOEXEC, 0)}; pidfd && !hurry_ && watch(pidfd))
      waking_ = std::move(pidfd);
    if (unique_fd pidfd{::fcntl(w->process.pidfd(), F_DUPFD_CLOEXEC, 0)}) running_.push_back(std::move(pidfd));
    lock.unlock();
    wake_filler();
  }
  return std::move(*w);
}

std::size_t standby_pool::target() const {
  std::lock_guard lock(mutex_);
  return target_;
}

void standby_pool::trim() {
  std::deque<launched_worker> surplus;  // stopped outside the lock
  {
    std::lock_guard lock(mutex_);
    target_ = size_;
    while (ready_.size() > size_) {
      surplus.push_back(std::move(ready_.back()));
      ready_.pop_back();
    }
  }
  changed_.notify_all();  // fill() waits for the target, which is lower now
}

launched_worker standby_pool::launch(const launch_spec& spec) {
  if (same_launch(spec, spec_)) return take();
  launch_spec exec_spec = spec;
  exec_spec.zygote = false;
  return local_launcher().launch(exec_spec);  // another kind of worker: exec'd now
}

void standby_pool::reserve(std::size_t size) {
  {
    std::lock_guard lock(mutex_);
    if (size <= size_) return;  // every call asks again: the filler is woken only for more workers
    size_ = size;
    target_ = std::max(target_, size_);
    max_size_ = std::max(max_size_, size_);
  }
  wake_filler();
}

void standby_pool::interrupt() noexcept {
  std::lock_guard lock(mutex_);
  interrupted_ = true;
  if (auto* z = dynamic_cast<zygote_launcher*>(launcher_.get())) z->interrupt();
}

void standby_pool::fill() {
  std::unique_lock lock(mutex_);
  ++filling_;  // what the pool owes is launched now, not at the exits
  wake_filler();
  if (linger_.count() > 0) {  // a warm-up counts as a call: the linger starts now
    last_take_ = std::chrono::steady_clock::now();
    if (dormant_) {  // woken as by a call, without one to wait for
      dormant_ = false;
      target_ = size_;
      wake_filler();
    }
  }
  // (Dormant again meanwhile, its linger past before it filled: nothing more to wait for.)
  changed_.wait(
      lock, [&] { return dormant_ || (!need_zygote_ && zygote_settled_ && (failing_ || ready_.size() >= target_)); });
  --filling_;
}

// A zygote pool replaces even its last waiting worker once the call's worker has exited: a fork
// is ready within a few ms, before a spaced call's successor, and one forked during the call
// would take a core from it (calls back to back are not owed: theirs are launched at once).
// An exec'd worker takes too long for that. fill() wants them all now.
bool standby_pool::defers_last() const { return spec_.zygote && filling_ == 0; }

standby_pool::stats standby_pool::snapshot() const {
  std::lock_guard lock(mutex_);
  stats out;
  out.zygote = spec_.zygote;
  out.adaptive = linger_.count() > 0;
  out.dormant = dormant_;
  for (const auto& w : ready_) out.waiting.push_back(w.process.pid());
  if (auto* z = dynamic_cast<zygote_launcher*>(launcher_.get())) out.zygote_pid = z->zygote_pid();
  out.hits = hits_;
  out.misses = misses_;
  out.env = spec_.extra_env;
  return out;
}

namespace {
struct pools {
  std::mutex mutex;
  // (launch, zygote, adaptive)
  std::map<std::tuple<launch_key, bool, bool>, std::unique_ptr<standby_pool>> by_spec;
};
pools& all_pools() {
  static pools p;
  return p;
}
}  // namespace

standby_pool& standby_for(const launch_spec& spec, std::size_t size, std::chrono::milliseconds linger) {
  auto& p = all_pools();
  std::lock_guard lock(p.mutex);
  auto& pool = p.by_spec[{key_of(spec), spec.zygote, linger.count() > 0}];
  if (!pool) pool = std::make_unique<standby_pool>(spec, size, 0, std::chrono::seconds(2), linger);
  else pool->reserve(size);
  return *pool;
}

std::vector<standby_pool::stats> standby_stats() {
  auto& p = all_pools();
  std::lock_guard lock(p.mutex);
  std::vector<standby_pool::stats> out;
  for (const auto& [key, pool] : p.by_spec) out.push_back(pool->snapshot());
  return out;
}

void stop_standby() {
  auto& p = all_pools();
  std::lock_guard lock(p.mutex);
  p.by_spec.clear();
}

}  // namespace isorun::runner
