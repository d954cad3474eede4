// Admission: which calls run now, and on which GPUs; the rest wait, first come, first served.
#include "isorun/runner/admission.hpp"

#include <algorithm>
#include <numeric>
#include <set>

#include "isorun/runner/errors.hpp"
#include "isorun/runner/isolated.hpp"
#include "isorun/runner/placement.hpp"
#include "isorun/runner/units.hpp"
#include "isorun/serialization/machine.hpp"

namespace isorun::runner {

struct admission::entry {
  admission_request request;
  std::vector<std::size_t> positions;  // explicit GPUs, resolved at enqueue
  std::condition_variable changed;     // granted or cancelled
  std::function<void()> notify;        // waiter::set_notify's, told as `changed` is
  bool granted = false;
  bool cancelled = false;
  std::list<std::shared_ptr<entry>>::iterator at;  // its place in the queue while it waits
  std::shared_ptr<ticket> ready;                   // made at the grant, until the waiter takes it

  void changed_now() {
    changed.notify_all();
    if (notify) notify();
  }
};

admission_request admission_request_for(const isolated_options& opts) {
  const gpu_request g = gpu_request_for(opts);
  return {.gpus = g.indices, .gpu_count = g.count, .mem_limit = opts.mem_limit};
}

admission_request admission_request_at(const admission& at, bool behind_executor, isolated_options& opts) {
  admission_request request = admission_request_for(opts);
  if (behind_executor && !request.on_gpu() && !at.shares().gpus.empty()) request.gpu_count = 1;
  if (opts.cpus_per_call) request.cpus = opts.cpus_per_call;
  else opts.cpus_per_call = at.share(request);
  return request;
}

admission::admission(limits l)
    : limits_{std::move(l)}, used_bytes_(limits_.gpus.size(), 0), used_calls_(limits_.gpus.size(), 0) {}

admission::~admission() = default;

admission& admission::process() {
  // Never destroyed: workers may be reaped (and their tickets dropped) while the program exits.
  static auto* a = new std::shared_ptr<admission>(std::make_shared<admission>(
      limits{.gpus = isorun::gpus().gpus, .cpu_slots = serialization::usable_cores(), .name = "this process"}));
  return **a;
}

namespace {
std::string plural(std::size_t n, const std::string& what) {
  return std::to_string(n) + " " + what + (n == 1 ? "" : "s");
}
}  // namespace

std::shared_ptr<admission::waiter> admission::enqueue(admission_request request, admission* then) {
  auto e = std::make_shared<entry>();
  const std::size_t n = limits_.gpus.size();
  auto position_of = [&](int index) {
    for (std::size_t i = 0; i < n; ++i)
      if (limits_.gpus[i].index == index) return i;
    std::string have;
    for (const auto& g : limits_.gpus) have += (have.empty() ? "" : ", ") + std::to_string(g.index);
    throw usage_error("GPU " + std::to_string(index) + " is not one of " + limits_.name + "'s GPUs (" +
                      (have.empty() ? "it has none" : have) + ")");
  };
  auto need_on = [&](std::size_t i) { return this->need_on(request, i); };
  if (!request.gpus.empty() && request.gpu_count)
    throw usage_error("give either GPUs by index or a number of GPUs, not both");
  for (int index : request.gpus) {
    const std::size_t i = position_of(index);
    if (std::find(e->positions.begin(), e->positions.end(), i) != e->positions.end())
      throw usage_error("GPU " + std::to_string(index) + " is listed twice; list each GPU once");
    if (need_on(i) > limits_.gpus[i].free_memory)
      throw usage_error("mem-limit " + format_size(request.mem_limit) + " exceeds GPU " + std::to_string(index) +
                        "'s " + format_size(limits_.gpus[i].free_memory) + " free; lower mem_limit");
    e->positions.push_back(i);
  }
  if (request.gpu_count < 0) throw usage_error("gpu_count " + std::to_string(request.gpu_count) + " is negative");
  if (request.gpu_count > 0) {
    const auto want = static_cast<std::size_t>(request.gpu_count);
    std::size_t room = 0;
    for (std::size_t i = 0; i < n; ++i) room += need_on(i) <= limits_.gpus[i].free_memory;
    if (room < want)
      throw usage_error(
          plural(want, "GPU") + " asked for, but " + limits_.name + " has " + plural(n, "GPU") +
          (room < n ? " (" + std::to_string(room) + " with " + format_size(request.mem_limit) + " free for the cap)"
                    : std::string()) +
          "; ask for fewer, or lower mem_limit");
  }
  if (!request.on_gpu() && request.cpus == 0)
    throw usage_error("a CPU call takes at least 1 CPU slot (cpus_per_call 0)");
  std::unique_lock lock(mutex_);
  if (!request.on_gpu() && request.cpus > cpu_slots())
    throw usage_error("a call asks for " + plural(request.cpus, "CPU slot") + ", but " + limits_.name + " has " +
                      plural(cpu_slots(), "CPU slot") + "; lower cpus_per_call or raise cpu_slots");
  e->request = std::move(request);
  e->at = queue_.insert(queue_.end(), e);
  queued_on_gpu_ += e->request.on_gpu();
  pump();
  std::shared_ptr<waiter> w(new waiter(shared_from_this(), std::move(e), then ? then->shared_from_this() : nullptr));
  w->listed_ = waiters_.insert(waiters_.end(), w);
  return w;
}

std::shared_ptr<admission::ticket> admission::admit(admission_request request, admission* then) {
  return enqueue(std::move(request), then)->get();
}

std::uint64_t admission::need_on(const admission_request& r, std::size_t i) const noexcept {
  if (r.mem_limit) return r.mem_limit;
  return limits_.per_gpu ? limits_.gpus[i].free_memory / limits_.per_gpu : limits_.gpus[i].free_memory;
}

unsigned admission::share(const admission_request& request) const noexcept {
  const std::size_t cores = serialization::usable_cores();
  const std::size_t beside = request.on_gpu() ? (limits_.gpu_slots ? limits_.gpu_slots : limits_.gpus.size())
                                              : limits_.cpu_slots;
  const std::size_t each = cores / std::max<std::size_t>(1, beside);
  return static_cast<unsigned>(std::max<std::size_t>(1, request.on_gpu() ? each : each * request.cpus));
}

std::size_t admission::cpu_slots() const noexcept {
  return widened_.empty() ? limits_.cpu_slots : std::max(limits_.cpu_slots, *widened_.rbegin());
}

std::shared_ptr<void> admission::widen_cpu_slots(std::size_t cpu_slots) {
  std::lock_guard lock(mutex_);
  const auto at = widened_.insert(cpu_slots);
  pump();  // calls waiting for a CPU slot may fit now
  // The lease gives its slots back when dropped (calls running on them end as they end).
  return {nullptr, [self = shared_from_this(), at](void*) {
            std::lock_guard lock(self->mutex_);
            self->widened_.erase(at);
          }};
}

void admission::remove(entry& e) noexcept {
  queued_on_gpu_ -= e.request.on_gpu();
  queue_.erase(e.at);
}

void admission::cancel_waiting() {
  std::vector<std::shared_ptr<waiter>> all;
  {
    std::lock_guard lock(mutex_);
    all.reserve(waiters_.size());
    for (const auto& w : waiters_)
      if (auto alive = w.lock()) all.push_back(std::move(alive));
  }
  for (const auto& w : all) w->cancel();  // (one admitted and taken runs on)
}

void admission::wait_idle() {
  std::unique_lock lock(mutex_);
  idle_.wait(lock, [&] { return queue_.empty() && running_ == 0; });
}

std::size_t admission::waiting() const {
  std::lock_guard lock(mutex_);
  return queue_.size();
}

std::size_t admission::running() const {
  std::lock_guard lock(mutex_);
  return running_;
}

bool admission::try_grant(entry& e, const std::vector<bool>& gpu_blocked) {
  const admission_request& r = e.request;
  grant g;
  if (!r.on_gpu()) {
    if (used_cpus_ + r.cpus > cpu_slots()) return false;
    g.cpus = r.cpus;
  } else {
    auto fits = [&](std::size_t i) {
      return (limits_.per_gpu == 0 || used_calls_[i] < limits_.per_gpu) &&
             used_bytes_[i] + need_on(r, i) <= limits_.gpus[i].free_memory;
    };
    if (r.gpu_count > 0) {  // among the GPUs no earlier request waits for, the freest first
      std::vector<std::size_t> fit;
      for (std::size_t i = 0; i < limits_.gpus.size(); ++i)
        if (!gpu_blocked[i] && fits(i)) fit.push_back(i);
      if (fit.size() < static_cast<std::size_t>(r.gpu_count)) return false;
      auto room = [&](std::size_t i) { return limits_.gpus[i].free_memory - used_bytes_[i]; };
      std::stable_sort(fit.begin(), fit.end(), [&](std::size_t x, std::size_t y) { return room(x) > room(y); });
      fit.resize(static_cast<std::size_t>(r.gpu_count));
      g.positions = std::move(fit);
    } else {
      if (!std::all_of(e.positions.begin(), e.positions.end(), fits)) return false;
      g.positions = e.positions;
    }
    std::sort(g.positions.begin(), g.positions.end());  // PCI bus order, as CUDA numbers them
    for (std::size_t i : g.positions) g.bytes.push_back(need_on(r, i));
  }
  used_cpus_ += g.cpus;
  std::vector<gpu_info> gpus;
  for (std::size_t k = 0; k < g.positions.size(); ++k) {
    used_bytes_[g.positions[k]] += g.bytes[k];
    ++used_calls_[g.positions[k]];
    gpus.push_back(limits_.gpus[g.positions[k]]);
  }
  ++running_;
  e.granted = true;
  e.ready = std::shared_ptr<ticket>(new ticket(shared_from_this(), std::move(g), std::move(gpus)));
  e.changed_now();
  return true;
}

// In arrival order, each request that fits is granted; one that does not blocks its resources
// for the requests behind it (a CPU call waits behind the CPU call before it, never behind a GPU
// call), so no request is overtaken on what it waits for, and none starves.
//
// Once every resource is blocked, or what is blocked is all that the rest of the queue asks for,
// nothing behind can be granted: a queue of many calls waiting for the CPU costs a look at its
// head, not at each of them.
void admission::pump() {
  std::vector<bool> gpu_blocked(limits_.gpus.size(), false);
  bool cpu_blocked = false;
  std::size_t gpu_entries_left = queued_on_gpu_, cpu_entries_left = queue_.size() - queued_on_gpu_;
  for (auto it = queue_.begin(); it != queue_.end();) {
    entry& e = **it;
    const bool gpus_stuck = gpu_entries_left == 0 ||
                            std::all_of(gpu_blocked.begin(), gpu_blocked.end(), [](bool b) { return b; });
    if (gpus_stuck && (cpu_blocked || cpu_entries_left == 0)) break;
    (e.request.on_gpu() ? gpu_entries_left : cpu_entries_left) -= 1;
    bool granted = false;
    if (!e.request.on_gpu()) {
      granted = !cpu_blocked && try_grant(e, gpu_blocked);
      cpu_blocked = cpu_blocked || !granted;
    } else if (e.request.gpu_count > 0) {
      granted = try_grant(e, gpu_blocked);
      // Any GPU will do: whichever comes free next is its, ahead of later requests.
      if (!granted) std::fill(gpu_blocked.begin(), gpu_blocked.end(), true);
    } else {
      granted = std::none_of(e.positions.begin(), e.positions.end(), [&](std::size_t i) { return gpu_blocked[i]; }) &&
                try_grant(e, gpu_blocked);
      if (!granted)
        for (std::size_t i : e.positions) gpu_blocked[i] = true;
    }
    if (granted) {
      queued_on_gpu_ -= e.request.on_gpu();
      it = queue_.erase(it);
    } else {
      ++it;
    }
  }
  if (queue_.empty()) idle_.notify_all();
}

void admission::release(const grant& g) noexcept {
  std::lock_guard lock(mutex_);
  used_cpus_ -= g.cpus;
  for (std::size_t k = 0; k < g.positions.size(); ++k) {
    used_bytes_[g.positions[k]] -= g.bytes[k];
    --used_calls_[g.positions[k]];
  }
  --running_;
  try {
    pump();
  } catch (...) {  // (allocation in a grant: the next release tries again)
  }
  idle_.notify_all();
}

admission::ticket::ticket(std::shared_ptr<admission> from, grant taken, std::vector<gpu_info> gpus)
    : from_{from}, taken_{std::move(taken)}, gpus_{std::move(gpus)} {}

admission::ticket::~ticket() {
  inner_.reset();  // the process's first: what an executor admits next then finds it free
  from_->release(taken_);
}

admission::waiter::waiter(std::shared_ptr<admission> at, std::shared_ptr<entry> e, std::shared_ptr<admission> then)
    : at_{std::move(at)}, entry_{std::move(e)}, then_{std::move(then)} {}

admission::waiter::~waiter() {
  std::shared_ptr<ticket> unused;  // dropped after the lock: its release takes the lock
  {
    std::lock_guard lock(at_->mutex_);
    at_->waiters_.erase(listed_);
    if (!entry_->granted && !entry_->cancelled) {
      at_->remove(*entry_);
      at_->pump();  // what waited behind it may fit now
    }
    unused = std::move(entry_->ready);
  }
}

void admission::waiter::cancel() noexcept {
  std::shared_ptr<waiter> there;
  std::shared_ptr<ticket> unused, unused_outer;  // released after the lock: a release takes it
  {
    std::lock_guard lock(at_->mutex_);
    cancel_asked_ = true;
    if (!entry_->granted && !entry_->cancelled) {
      entry_->cancelled = true;
      at_->remove(*entry_);
      try {
        at_->pump();
      } catch (...) {
      }
      entry_->changed_now();
      return;
    }
    if (!taken_) {
      // Granted here but never to be taken: what it holds goes now, for the calls behind it, not
      // when its waiter is dropped (which a thread about to look at it may delay).
      entry_->cancelled = true;
      unused = std::move(entry_->ready);
      unused_outer = std::move(outer_);
    }
    there = inner_;  // the place behind it is left (once queued there)
  }
  if (there) there->cancel();
}

// Waits for the grant here, then (behind an executor) queues in `then_` for the same GPUs and
// waits there; true once admitted everywhere or cancelled.
bool admission::waiter::advance(std::unique_lock<std::mutex>& lock, std::chrono::steady_clock::time_point deadline) {
  const auto decided = [&] { return entry_->granted || entry_->cancelled; };
  // A look (a deadline already past) does not wait: a futex wait with a timeout sleeps for the
  // timer slack (tens of µs) even when the timeout has passed, on every submit.
  if (!decided() &&
      (deadline <= std::chrono::steady_clock::now() || !entry_->changed.wait_until(lock, deadline, decided)))
    return false;
  if (entry_->cancelled || !then_ || failed_) return true;
  if (!inner_) {
    if (!outer_) outer_ = std::move(entry_->ready);
    // The same GPUs there, with what the grant here charged on them (an uncapped call's share).
    admission_request same{.mem_limit = outer_->taken_.bytes.empty() ? 0 : outer_->taken_.bytes.front(),
                           .cpus = entry_->request.cpus};
    for (const auto& g : outer_->gpus()) same.gpus.push_back(g.index);
    lock.unlock();
    std::shared_ptr<waiter> there;
    std::exception_ptr failed;
    try {
      there = then_->enqueue(std::move(same));
    } catch (...) {  // it can never fit there: the call ends, get() says why
      failed = std::current_exception();
    }
    lock.lock();
    if (failed) {
      failed_ = failed;
      return true;
    }
    inner_ = std::move(there);
    if (notify_) inner_->set_notify(notify_);
    if (cancel_asked_) inner_->cancel();
  }
  auto there = inner_;
  lock.unlock();
  const bool forever = deadline == std::chrono::steady_clock::time_point::max();
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  const bool done = there->wait_for(forever ? std::chrono::milliseconds::max()
                                            : std::max(left, std::chrono::milliseconds(0)));
  lock.lock();
  return done;
}

void admission::waiter::set_notify(std::function<void()> notify) {
  std::shared_ptr<waiter> there;
  {
    std::lock_guard lock(at_->mutex_);
    notify_ = notify;
    entry_->notify = notify;
    if (entry_->granted || entry_->cancelled || failed_) notify();
    there = inner_;
  }
  if (there) there->set_notify(std::move(notify));
}

bool admission::waiter::wait_for(std::chrono::milliseconds timeout) {
  std::unique_lock lock(at_->mutex_);
  const auto deadline = timeout == std::chrono::milliseconds::max() ? std::chrono::steady_clock::time_point::max()
                                                                    : std::chrono::steady_clock::now() + timeout;
  return advance(lock, deadline);
}

std::shared_ptr<admission::ticket> admission::waiter::get() {
  std::unique_lock lock(at_->mutex_);
  advance(lock, std::chrono::steady_clock::time_point::max());
  if (taken_) return nullptr;
  if (entry_->cancelled) throw cancelled("cancelled while waiting for admission");
  taken_ = true;
  if (!then_) return std::move(entry_->ready);
  auto there = inner_;
  auto failed = failed_;
  lock.unlock();
  try {
    if (failed) std::rethrow_exception(failed);
    // One ticket for both: the executor's, holding the process's (which goes first).
    outer_->inner_ = there->get();  // throws `cancelled` if cancelled there
  } catch (...) {
    // Not admitted there: what it holds here goes now, for the calls behind it (not under the
    // lock, which its release takes).
    std::shared_ptr<ticket> drop;
    lock.lock();
    drop = std::move(outer_);
    lock.unlock();
    throw;
  }
  return std::move(outer_);
}

}  // namespace isorun::runner
