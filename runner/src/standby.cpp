#include "isorun/runner/standby.hpp"

#include <algorithm>
#include <map>
#include <memory>
#include <tuple>

#include "isorun/runner/errors.hpp"

namespace isorun::runner {

namespace {
// What makes two launches interchangeable: everything but the label, which only names the
// worker in ps.
using launch_key = std::tuple<std::string, std::vector<std::string>, bool, std::string, std::vector<std::string>>;
launch_key key_of(const launch_spec& s) {
  return {s.executable, s.extra_env, s.stdout_to_stderr, s.warm ? serialization::to_env(*s.warm) : std::string(),
          s.argv};
}
}  // namespace

standby_pool::standby_pool(launch_spec spec, std::size_t size) : spec_{std::move(spec)}, size_{size} {
  spec_.label = "standby";  // its task is not known yet
  filler_ = std::thread([this] { refill(); });
}

standby_pool::~standby_pool() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wanted_.notify_all();
  filler_.join();
  std::lock_guard lock(mutex_);
  ready_.clear();  // each waiting worker's handle stops its process group and reaps it
}

void standby_pool::refill() {
  std::unique_lock lock(mutex_);
  for (;;) {
    wanted_.wait(lock, [&] { return stopping_ || (!failing_ && ready_.size() < size_); });
    if (stopping_) return;
    lock.unlock();
    // Launched outside the lock: take() never waits for a launch that is not its own.
    std::optional<launched_worker> w;
    try {
      w.emplace(launcher_.launch(spec_));
    } catch (const std::exception&) {
    }
    lock.lock();
    if (w) ready_.push_back(std::move(*w));
    else failing_ = true;
    changed_.notify_all();
  }
}

launched_worker standby_pool::take() {
  {
    std::unique_lock lock(mutex_);
    while (!ready_.empty()) {
      launched_worker w = std::move(ready_.front());
      ready_.pop_front();
      wanted_.notify_one();
      if (!w.process.peek()) return w;
      // It died while waiting: `w` is reaped as it goes, and the next one is tried.
    }
  }
  return launcher_.launch(spec_);  // none ready: launched now, as without standby
}

launched_worker standby_pool::launch(const launch_spec& spec) {
  return key_of(spec) == key_of(spec_) ? take() : launcher_.launch(spec);
}

void standby_pool::reserve(std::size_t size) {
  {
    std::lock_guard lock(mutex_);
    size_ = std::max(size_, size);
  }
  wanted_.notify_one();
}

void standby_pool::fill() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return failing_ || ready_.size() >= size_; });
}

std::vector<pid_t> standby_pool::waiting_pids() const {
  std::lock_guard lock(mutex_);
  std::vector<pid_t> pids;
  for (const auto& w : ready_) pids.push_back(w.process.pid());
  return pids;
}

namespace {
struct pools {
  std::mutex mutex;
  std::map<launch_key, std::unique_ptr<standby_pool>> by_spec;
};
pools& all_pools() {
  static pools p;
  return p;
}
}  // namespace

standby_pool& standby_for(const launch_spec& spec, std::size_t size) {
  auto& p = all_pools();
  std::lock_guard lock(p.mutex);
  auto& pool = p.by_spec[key_of(spec)];
  if (!pool) pool = std::make_unique<standby_pool>(spec, size);
  else pool->reserve(size);
  return *pool;
}

void stop_standby() {
  auto& p = all_pools();
  std::lock_guard lock(p.mutex);
  p.by_spec.clear();
}

}  // namespace isorun::runner
