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
    map_ = mapping::map(file_.fd(), size, sealed() ? mapping::access::read_only : mapping::access::read_write, true);
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
    // Each size read once (an fstat: a worker holding a segment may have grown it), and kept
    // beside the segment it was read for.
    struct candidate {
      decltype(idle_)::iterator at;
      std::uint64_t capacity = 0;
    };
    const auto end = idle_.end();
    candidate biggest{end}, fitting{end}, short_of{end};  // largest; smallest that fits; largest that does not
    for (auto it = idle_.begin(); it != end; ++it) {
      const candidate c{it, (*it)->capacity()};
      if (biggest.at == end || c.capacity > biggest.capacity) biggest = c;
      if (c.capacity >= min_capacity) {
        if (fitting.at == end || c.capacity < fitting.capacity) fitting = c;
      } else if (short_of.at == end || c.capacity > short_of.capacity) {
        short_of = c;
      }
    }
    // A small segment grown is cheap; a large one given to a small request is not: the next
    // large result would find only fresh pages to fault in, each a fault and a zero-fill.
    const bool wasteful = fitting.at != end && fitting.capacity > std::max<std::uint64_t>(4 * min_capacity, 1 << 20);
    const auto pick = largest ? biggest.at : fitting.at != end && !wasteful ? fitting.at : short_of.at;
    if (pick != end) {
      picked = std::move(*pick);
      idle_.erase(pick);
    }
  }
  if (!picked) picked = std::make_unique<pooled_segment>(shm_file::create(0));
  return {picked.release(), [this](pooled_segment* s) { release(std::unique_ptr<pooled_segment>(s)); }};
}

void segment_pool::release(std::unique_ptr<pooled_segment> segment) noexcept {
  if (segment->any_seal()) return;  // it may never be written or grown again
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
