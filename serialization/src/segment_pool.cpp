#include "isorun/serialization/segment_pool.hpp"

#include <algorithm>

#include "isorun/serialization/result_stream.hpp"

namespace isorun::serialization {

std::byte* pooled_segment::writable(std::uint64_t size, bool populate) {
  file_.reserve(size);
  if (map_.size() < size) map_ = mapping::map(file_.fd(), file_.size(), mapping::access::read_write, populate);
  return map_.data();
}

const mapping& pooled_segment::current() {
  const std::uint64_t size = file_.size();
  if (map_.size() != size)
    map_ = mapping::map(file_.fd(), size, sealed_ ? mapping::access::read_only : mapping::access::read_write, true);
  return map_;
}

bool pooled_segment::seal() {
  map_ = {};  // our own writable mapping would refuse the seal too
  sealed_ = file_.seal();
  return sealed_;
}

segment_pool& segment_pool::instance() {
  // Deliberately never destroyed: segments may be released during static destruction.
  static auto* pool = new segment_pool;
  return *pool;
}

segment_pool& segment_pool::rings() {
  // Never destroyed, like instance(). A ring that was used holds its 64 MiB of slots resident: a
  // few are kept warm, the rest closed.
  static auto* pool = [] {
    auto* p = new segment_pool;
    p->set_idle_limit(4 * ring_bytes);
    return p;
  }();
  return *pool;
}

std::shared_ptr<pooled_segment> segment_pool::acquire(std::uint64_t min_capacity, bool largest) {
  std::unique_ptr<pooled_segment> picked;
  {
    std::lock_guard lock(mutex_);
    // Smallest idle segment that fits; otherwise the largest (it is grown once, then stays warm).
    auto best = idle_.end();
    for (auto it = idle_.begin(); it != idle_.end(); ++it) {
      const auto cap = (*it)->capacity();
      if (best == idle_.end()) {
        best = it;
        continue;
      }
      const auto best_cap = (*best)->capacity();
      const bool fits = !largest && cap >= min_capacity, best_fits = !largest && best_cap >= min_capacity;
      if ((fits && (!best_fits || cap < best_cap)) || (!fits && !best_fits && cap > best_cap)) best = it;
    }
    if (best != idle_.end()) {
      picked = std::move(*best);
      idle_.erase(best);
    }
  }
  if (!picked) picked = std::make_unique<pooled_segment>(shm_file::create(0));
  return {picked.release(), [this](pooled_segment* s) { release(std::unique_ptr<pooled_segment>(s)); }};
}

void segment_pool::release(std::unique_ptr<pooled_segment> segment) noexcept {
  if (segment->sealed()) return;  // it can never be written again
  try {
    const auto cap = segment->capacity();
    std::lock_guard lock(mutex_);
    std::uint64_t idle = 0;
    for (const auto& s : idle_) idle += s->capacity();
    if (idle_.size() < max_idle_count_ && idle + cap <= idle_limit_) idle_.push_back(std::move(segment));
  } catch (...) {
    // fstat failed: drop the segment.
  }
}

void segment_pool::set_idle_limit(std::uint64_t bytes) {
  std::lock_guard lock(mutex_);
  idle_limit_ = bytes;
  std::uint64_t idle = 0;
  std::erase_if(idle_, [&](const auto& s) {
    idle += s->capacity();
    return idle > idle_limit_;
  });
}

void segment_pool::clear() {
  std::lock_guard lock(mutex_);
  idle_.clear();
}

std::uint64_t segment_pool::idle_bytes() const {
  std::lock_guard lock(mutex_);
  std::uint64_t idle = 0;
  for (const auto& s : idle_) idle += s->capacity();
  return idle;
}

}  // namespace isorun::serialization
