#include "isorun/serialization/segment_pool.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <thread>

#include "isorun/serialization/result_stream.hpp"

namespace isorun::serialization {

std::byte* pooled_segment::writable(std::uint64_t size, bool populate) {
  file_.reserve(size);
  if (map_.size() < size) map_ = mapping::map(file_.fd(), size, mapping::access::read_write, populate);
  return map_.data();
}

std::span<const std::byte> pooled_segment::payload(std::uint64_t magic, std::uint64_t max_payload, encoding& enc) {
  // The worker wrote the file and may have grown it to any size (a sparse terabyte costs it
  // nothing): mapped whole, with its pages faulted in, it would cost this process that much
  // memory. Only the header and the payload it declares are mapped: the file cannot shrink under
  // that mapping (born sealed against it), and what it grows by afterwards is never mapped here.
  if (!(file_.seals() & F_SEAL_SHRINK)) throw wire_error("segment is not sealed against shrinking");
  const std::uint64_t size = file_.size();
  if (size > header_size && size - header_size > max_payload)
    throw wire_error("segment grew to " + std::to_string(size) +
                     " bytes, past its 64-byte header and the largest payload it may hold (" +
                     std::to_string(max_payload) + " bytes)");
  segment_header h{};
  if (size < header_size || ::pread(file_.fd(), &h, sizeof h, 0) != static_cast<ssize_t>(sizeof h))
    throw wire_error("segment of " + std::to_string(size) + " bytes is smaller than its 64-byte header");
  h = read_header(reinterpret_cast<const std::byte*>(&h), sizeof h, magic, max_payload);
  if (h.payload_size > size - header_size)
    throw wire_error("payload claims " + std::to_string(h.payload_size) + " bytes but the segment holds only " +
                     std::to_string(size - header_size));
  const std::uint64_t length = header_size + h.payload_size;
  // This process's mapping from the segment's last use, where it covers the payload, serves as it
  // is: its pages' entries are still in place, and mapping a warm gigabyte again (and unmapping
  // the old one) costs more than copying it. It is never longer than this process chose to map.
  // A sealed segment has no writable mapping anywhere (the seal is refused while one exists).
  if (map_.size() < length)
    map_ = mapping::map(file_.fd(), length, sealed() ? mapping::access::read_only : mapping::access::read_write, true);
  return open_payload(map_.data(), length, magic, max_payload, enc);
}

bool pooled_segment::reusable() const noexcept { return !sealed_ && (file_.seals() & ~F_SEAL_SHRINK) == 0; }

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
    bool grown = false;
    for (auto it = idle_.begin(); it != end; ++it) {
      const candidate c{it, (*it)->capacity()};
      // Grown while idle, by a process a worker left behind that still holds it: never handed
      // out larger than it came back.
      if (c.capacity != (*it)->released_capacity_) {
        grown = true;
        continue;
      }
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
    if (grown) std::erase_if(idle_, [](const auto& s) { return s->capacity() != s->released_capacity_; });
  }
  if (!picked) picked = std::make_unique<pooled_segment>(shm_file::create(0));
  return {picked.release(), [this](pooled_segment* s) { release(std::unique_ptr<pooled_segment>(s)); }};
}

void segment_pool::release(std::unique_ptr<pooled_segment> segment) noexcept {
  if (!segment->reusable()) return;  // it may never be written or grown again
  try {
    const auto cap = segment->capacity();
    std::lock_guard lock(mutex_);
    const std::uint64_t idle = idle_locked() + cap;
    const bool kept = idle <= idle_limit_;
    if (idle_.size() < max_idle_count_ && (kept || idle <= linger_limit_)) {
      segment->released_capacity_ = cap;
      segment->released_at_ = clock::now();
      idle_.push_back(std::move(segment));
      if (!kept) {
        if (trimmer_pid_ != ::getpid()) {
          std::thread(&segment_pool::trim_loop, this).detach();  // the pool is never destroyed
          trimmer_pid_ = ::getpid();
        }
        trim_wake_.notify_one();
      }
    }
  } catch (...) {
    // fstat failed, or no thread to trim with: the segment is closed.
  }
}

std::uint64_t segment_pool::idle_locked() const {
  std::uint64_t idle = 0;
  for (const auto& s : idle_) idle += s->released_capacity_;
  return idle;
}

segment_pool::clock::time_point segment_pool::expire_locked(clock::time_point now,
                                                            std::vector<std::unique_ptr<pooled_segment>>& out) {
  std::uint64_t idle = idle_locked();
  while (idle > idle_limit_) {
    auto oldest = clock::time_point::max();
    auto largest = idle_.end();
    for (auto it = idle_.begin(); it != idle_.end(); ++it) {
      if (now - (*it)->released_at_ < linger_) oldest = std::min(oldest, (*it)->released_at_);
      else if (largest == idle_.end() || (*it)->released_capacity_ > (*largest)->released_capacity_) largest = it;
    }
    if (largest == idle_.end()) return oldest == clock::time_point::max() ? oldest : oldest + linger_;
    idle -= (*largest)->released_capacity_;
    out.push_back(std::move(*largest));
    idle_.erase(largest);
  }
  return clock::time_point::max();
}

void segment_pool::trim_loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    std::vector<std::unique_ptr<pooled_segment>> expired;
    const auto next = expire_locked(clock::now(), expired);
    if (!expired.empty()) {
      lock.unlock();
      expired.clear();
      lock.lock();
      continue;
    }
    if (next == clock::time_point::max()) trim_wake_.wait(lock);
    else trim_wake_.wait_until(lock, next);
  }
}

void segment_pool::set_idle_limit(std::uint64_t bytes) {
  std::lock_guard lock(mutex_);
  idle_limit_ = bytes;
  linger_limit_ = 0;  // a limit set is what is kept: nothing lingers beyond it unless set_linger says
  std::uint64_t idle = 0;
  std::erase_if(idle_, [&](const auto& s) {
    idle += s->released_capacity_;
    return idle > idle_limit_;
  });
}

void segment_pool::set_linger(std::uint64_t bytes, std::chrono::milliseconds linger) {
  std::lock_guard lock(mutex_);
  linger_limit_ = bytes;
  linger_ = linger;
  trim_wake_.notify_one();
}

void segment_pool::clear() {
  std::lock_guard lock(mutex_);
  idle_.clear();
}

std::uint64_t segment_pool::idle_bytes() const {
  std::lock_guard lock(mutex_);
  return idle_locked();
}

}  // namespace isorun::serialization
