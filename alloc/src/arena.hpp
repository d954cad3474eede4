#pragma once
// The arena of a caching allocator: segments of device memory tiled by blocks, free blocks in
// size-ordered pools, live blocks by address. Splitting and coalescing live here; where memory
// comes from and when it goes back is the strategy's business (strategy.hpp), and what it all
// counts is the ledger's (ledger.hpp).

#include <time.h>

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <list>
#include <string>
#include <vector>

#include <algorithm>

#include <boost/intrusive/set.hpp>

#include "isorun/alloc/backend.hpp"

namespace isorun::alloc::detail {

constexpr std::size_t KiB = 1024, MiB = 1024 * KiB;
constexpr std::size_t small_request = 1 * MiB;   // at most this: small pool
constexpr std::size_t small_segment = 2 * MiB;   // small pool segments
constexpr std::size_t segment_round = 2 * MiB;   // large segments are multiples of this
constexpr std::size_t compat_buffer = 20 * MiB;  // PyTorch: 1-10 MiB requests get 20 MiB segments
constexpr std::size_t compat_threshold = 10 * MiB;
constexpr std::size_t absurd = std::size_t{1} << 50;

inline std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

inline std::string human(std::uint64_t bytes) {
  char buf[32];
  if (bytes >= (1ULL << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", double(bytes) / double(1ULL << 30));
  else if (bytes >= MiB) std::snprintf(buf, sizeof buf, "%.2f MiB", double(bytes) / double(MiB));
  else if (bytes >= KiB) std::snprintf(buf, sizeof buf, "%.2f KiB", double(bytes) / double(KiB));
  else std::snprintf(buf, sizeof buf, "%" PRIu64 " B", bytes);
  return buf;
}

inline std::int64_t now_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return std::int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

struct segment;

namespace bi = boost::intrusive;

struct block {
  // Free blocks sit in an intrusive tree: no node allocation on the hot path.
  bi::set_member_hook<bi::link_mode<bi::safe_link>> hook;
  std::uintptr_t addr = 0;
  std::size_t size = 0;
  std::size_t requested = 0;
  stream_id stream = 0;
  bool allocated = false;
  bool pending = false;  // freed, waiting for events of other streams
  block* prev = nullptr;
  block* next = nullptr;
  segment* seg = nullptr;
  std::vector<stream_id> uses;
  std::vector<event_id> events;
};

struct segment {
  std::uintptr_t base = 0;
  std::size_t size = 0;  // address range
  bool small = false;
  bool expandable = false;
  stream_id stream = 0;
  std::size_t live = 0;  // allocated or pending blocks
  std::uint64_t last_used = 0;
  std::vector<bool> mapped;  // expandable: per granule
  std::size_t mapped_pages = 0;
  block* first = nullptr;
};

struct by_size {
  bool operator()(const block& a, const block& b) const {
    if (a.stream != b.stream) return a.stream < b.stream;
    if (a.size != b.size) return a.size < b.size;
    return a.addr < b.addr;
  }
};

using free_set = bi::set<block, bi::member_hook<block, decltype(block::hook), &block::hook>, bi::compare<by_size>>;

// Live allocations by address: open addressing, so allocate/free do not touch the heap.
class address_map {
 public:
  block* find(std::uintptr_t addr) const {
    if (slots_.empty()) return nullptr;
    for (std::size_t i = slot(addr);; i = (i + 1) & mask_) {
      if (!slots_[i]) return nullptr;
      if (slots_[i]->addr == addr) return slots_[i];
    }
  }
  void insert(block* b) {
    if ((size_ + 1) * 2 > slots_.size()) grow();
    std::size_t i = slot(b->addr);
    while (slots_[i]) i = (i + 1) & mask_;
    slots_[i] = b;
    ++size_;
  }
  void erase(std::uintptr_t addr) {
    std::size_t i = slot(addr);
    while (slots_[i]->addr != addr) i = (i + 1) & mask_;
    slots_[i] = nullptr;
    --size_;
    // Backward-shift deletion keeps probe chains unbroken without tombstones.
    for (std::size_t j = (i + 1) & mask_; slots_[j]; j = (j + 1) & mask_) {
      const std::size_t home = slot(slots_[j]->addr);
      if (((j - home) & mask_) >= ((j - i) & mask_)) {
        slots_[i] = slots_[j];
        slots_[j] = nullptr;
        i = j;
      }
    }
  }
  [[nodiscard]] std::size_t size() const { return size_; }
  template <class F>
  void for_each(F f) const {
    for (block* b : slots_)
      if (b) f(b);
  }
  void clear() {
    slots_.assign(slots_.size(), nullptr);
    size_ = 0;
  }

 private:
  std::size_t slot(std::uintptr_t addr) const { return ((addr >> 9) * 0x9E3779B97F4A7C15ULL >> 20) & mask_; }
  void grow() {
    std::vector<block*> old = std::move(slots_);
    slots_.assign(old.empty() ? 64 : old.size() * 2, nullptr);
    mask_ = slots_.size() - 1;
    size_ = 0;
    for (block* b : old)
      if (b) insert(b);
  }
  std::vector<block*> slots_;
  std::size_t mask_ = 0, size_ = 0;
};

/// Requests are rounded up to a multiple of this.
constexpr std::size_t rounding = 512;

/// Segments and the blocks that tile them. Not thread-safe: the allocator's lock covers it.
struct arena {
  std::list<segment> segments;
  free_set small_free, large_free;
  address_map live;
  std::vector<block*> pending;  // freed, waiting for other streams' events
  std::uint64_t clock = 0;      // use order, for least-recently-used release

  arena() = default;
  arena(const arena&) = delete;
  arena& operator=(const arena&) = delete;
  ~arena() {
    for (block* b : spare_) delete b;
  }

  free_set& pool_of(const segment& s) { return s.small ? small_free : large_free; }

  /// A new segment over [base, base+size), one free block covering it.
  segment& add_segment(std::uintptr_t base, std::size_t size, bool small, stream_id stream, bool expandable) {
    segments.push_back(segment{});
    segment& s = segments.back();
    s.base = base;
    s.size = size;
    s.small = small;
    s.stream = stream;
    s.expandable = expandable;
    s.last_used = ++clock;
    block* b = make_block();
    *b = block{};
    b->addr = base;
    b->size = size;
    b->stream = stream;
    b->seg = &s;
    s.first = b;
    pool_of(s).insert(*b);
    return s;
  }

  /// Forgets a wholly free segment (its memory is the caller's to return).
  void remove_segment(std::list<segment>::iterator it) {
    block* b = it->first;
    pool_of(*it).erase(pool_of(*it).iterator_to(*b));
    drop_block(b);
    segments.erase(it);
  }

  /// The best-fitting free block of at least `size` on `stream` in the small or large pool. With
  /// `max_split_size`, as in PyTorch: no oversize block for a small request, and no much larger
  /// block for a large one, so oversize blocks do not get chopped into unusable pieces.
  block* best_fit(bool small, stream_id stream, std::size_t size, std::size_t max_split_size) {
    auto& pool = small ? small_free : large_free;
    block key;
    key.stream = stream;
    key.size = size;
    key.addr = 0;
    for (auto it = pool.lower_bound(key); it != pool.end() && it->stream == stream; ++it) {
      block* b = &*it;
      if (max_split_size && !small) {
        if (size < max_split_size && b->size >= max_split_size) continue;
        if (size >= max_split_size && b->size >= size + compat_buffer) continue;
      }
      return b;
    }
    return nullptr;
  }

  static bool segment_free(const segment& s) { return s.live == 0 && s.first->next == nullptr && !s.first->allocated; }

  /// Should a free block `b` serving `size` bytes give up its remainder?
  static bool should_split(const block* b, std::size_t size, std::size_t max_split_size, bool pytorch_compat) {
    const std::size_t remaining = b->size - size;
    if (b->seg->small) return remaining >= rounding;
    if (max_split_size && size >= max_split_size) return false;
    // PyTorch keeps large-pool remainders of 1 MiB or less attached; isorun splits any
    // remainder that can hold an allocation, which is what keeps fragmentation low.
    return pytorch_compat ? remaining > small_request : remaining >= rounding;
  }

  /// Takes free block `b` for `size` bytes on `stream`, splitting off the rest when `split`.
  void take(block* b, std::size_t size, std::size_t requested, stream_id stream, bool split) {
    auto& pool = pool_of(*b->seg);
    pool.erase(pool.iterator_to(*b));
    if (split) {
      block* rest = make_block();
      rest->addr = b->addr + size;
      rest->size = b->size - size;
      rest->stream = b->stream;
      rest->seg = b->seg;
      rest->prev = b;
      rest->next = b->next;
      if (b->next) b->next->prev = rest;
      b->next = rest;
      b->size = size;
      pool.insert(*rest);
    }
    b->allocated = true;
    b->requested = requested;
    b->stream = stream;
    b->seg->live++;
    b->seg->last_used = ++clock;
    live.insert(b);
  }

  /// Returns a freed block to its pool, coalesced with free neighbours. Returns its segment.
  segment& release(block* b) {
    segment& s = *b->seg;
    b->allocated = false;
    b->uses.clear();
    b->stream = s.stream;
    --s.live;
    if (b->next && !b->next->allocated && !b->next->pending) merge_into(b, b->next);
    if (b->prev && !b->prev->allocated && !b->prev->pending) {
      block* p = b->prev;
      auto& pool = pool_of(s);
      pool.erase(pool.iterator_to(*p));
      // b is not in a pool yet: absorb it directly.
      p->size += b->size;
      p->next = b->next;
      if (b->next) b->next->prev = p;
      drop_block(b);
      b = p;
    }
    pool_of(s).insert(*b);
    return s;
  }

  /// Every block object back to the spare list; segments, pools and maps emptied.
  void clear() {
    live.clear();
    pending.clear();
    small_free.clear();
    large_free.clear();
    for (auto& s : segments)
      for (block* b = s.first; b;) {
        block* n = b->next;
        drop_block(b);
        b = n;
      }
    segments.clear();
  }

  /// Segments, least recently used first.
  std::vector<std::list<segment>::iterator> lru_order() {
    std::vector<std::list<segment>::iterator> order;
    for (auto it = segments.begin(); it != segments.end(); ++it) order.push_back(it);
    std::sort(order.begin(), order.end(), [](auto a, auto b) { return a->last_used < b->last_used; });
    return order;
  }

 private:
  block* make_block() {
    if (spare_.empty()) return new block;
    block* b = spare_.back();
    spare_.pop_back();
    return b;
  }
  void drop_block(block* b) {
    b->uses.clear();
    b->events.clear();
    spare_.push_back(b);
  }
  void merge_into(block* dst, block* src) {  // src follows dst, both free; src is in its pool
    auto& pool = pool_of(*dst->seg);
    pool.erase(pool.iterator_to(*src));
    dst->size += src->size;
    dst->next = src->next;
    if (src->next) src->next->prev = dst;
    drop_block(src);
  }

  std::vector<block*> spare_;  // recycled block objects: no heap traffic on the hot path
};

}  // namespace isorun::alloc::detail
