// The allocator itself: the lock, the books and the hot path, around a growth strategy
// (strategy.hpp) working on an arena of blocks (arena.hpp).
#include "isorun/alloc/caching_allocator.hpp"

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <sstream>
#include <stdexcept>

#include "arena.hpp"
#include "ledger.hpp"
#include "strategy.hpp"

namespace isorun::alloc {
using namespace detail;

static_assert(caching_allocator::rounding == detail::rounding);

struct caching_allocator::impl {
  std::unique_ptr<backend> memory;
  alloc_config cfg;
  mutable std::mutex mutex;
  arena blocks;
  ledger books;
  std::unique_ptr<growth_strategy> strategy;

  std::size_t granule() const { return memory->granularity(); }

  // Completes the frees whose other streams' events have all completed.
  void process_events() {
    auto& pending = blocks.pending;
    for (std::size_t i = 0; i < pending.size();) {
      block* b = pending[i];
      auto& ev = b->events;
      ev.erase(std::remove_if(ev.begin(), ev.end(), [&](event_id e) { return memory->event_done(e); }), ev.end());
      if (ev.empty()) {
        pending[i] = pending.back();
        pending.pop_back();
        b->pending = false;
        release_block(b);
      } else {
        ++i;
      }
    }
  }

  void release_block(block* b) {
    books.released(*b);
    segment& s = blocks.release(b);
    if (cfg.no_caching && arena::segment_free(s)) {
      for (auto it = blocks.segments.begin(); it != blocks.segments.end(); ++it)
        if (&*it == &s) {
          strategy->on_segment_free(it);
          break;
        }
    }
  }

  void* allocate(std::size_t bytes, stream_id stream) {
    if (bytes == 0) throw std::invalid_argument("allocate(0): zero-byte allocations are not supported");
    if (bytes > absurd)
      throw std::invalid_argument("allocate(" + std::to_string(bytes) + "): absurd size (over 1 PiB)");
    strategy->check_stream(stream);
    const std::size_t size = round_up(bytes, rounding);
    std::lock_guard lock(mutex);
    if (!blocks.pending.empty()) process_events();
    block* b = strategy->obtain(size, stream);
    if (!b) books.throw_oom(bytes, size, stream, blocks, cfg);
    blocks.take(b, size, bytes, stream, arena::should_split(b, size, cfg.max_split_size, cfg.pytorch_compat));
    books.allocated(*b);
    if (cfg.debug_fill >= 0)
      memory->fill(reinterpret_cast<void*>(b->addr), b->size, static_cast<std::uint8_t>(cfg.debug_fill), stream);
    return reinterpret_cast<void*>(b->addr);
  }

  block* lookup(void* p, const char* what) const {
    block* b = blocks.live.find(reinterpret_cast<std::uintptr_t>(p));
    if (!b) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "%s(%p): not an address returned by this allocator, or already freed", what, p);
      throw std::invalid_argument(buf);
    }
    return b;
  }

  void deallocate(void* p) {
    std::lock_guard lock(mutex);
    block* b = lookup(p, "deallocate");
    blocks.live.erase(b->addr);
    books.freed(*b);
    if (!b->uses.empty()) {
      for (stream_id s : b->uses) b->events.push_back(memory->record_event(s));
      b->pending = true;
      blocks.pending.push_back(b);
      process_events();
      return;
    }
    release_block(b);
  }

  void teardown() {
    auto& st = books.st;
    st.leaked_allocations = blocks.live.size();
    blocks.live.for_each([&](block* b) { st.leaked_bytes += b->size; });
    strategy->release_everything();
    blocks.clear();
    st.reserved_bytes.sub(st.reserved_bytes.current);
    st.allocated_bytes.sub(st.allocated_bytes.current);
    st.segment.sub(st.segment.current);
  }
};

caching_allocator::caching_allocator(std::unique_ptr<backend> memory, std::uint64_t cap, alloc_config config,
                                     std::string cap_origin)
    : impl_{std::make_unique<impl>()} {
  impl& m = *impl_;
  m.memory = std::move(memory);
  m.cfg = config;
  check_cap(cap, config);
  m.books.cap = cap;
  m.books.limit = cap - config.reserve;
  m.books.cap_origin = std::move(cap_origin);
  m.books.history_size = config.history;
  m.strategy = make_strategy({*m.memory, m.blocks, m.books, m.cfg, [&m] { m.process_events(); }});
}

caching_allocator::~caching_allocator() {
  if (impl_ && !impl_->blocks.segments.empty()) impl_->teardown();
}

allocator_stats caching_allocator::release_all() {
  std::lock_guard lock(impl_->mutex);
  impl_->teardown();
  return impl_->books.st;
}

void* caching_allocator::allocate(std::size_t bytes, stream_id stream) { return impl_->allocate(bytes, stream); }
void caching_allocator::deallocate(void* p) { impl_->deallocate(p); }

void caching_allocator::record_stream(void* p, stream_id stream) {
  std::lock_guard lock(impl_->mutex);
  block* b = impl_->lookup(p, "record_stream");
  if (stream != b->stream && std::find(b->uses.begin(), b->uses.end(), stream) == b->uses.end())
    b->uses.push_back(stream);
}

void caching_allocator::empty_cache() {
  std::lock_guard lock(impl_->mutex);
  impl_->strategy->release_cached(UINT64_MAX, true);
}

void caching_allocator::reset_peak() {
  std::lock_guard lock(impl_->mutex);
  auto& s = impl_->books.st;
  for (stat* x : {&s.allocated_bytes, &s.requested_bytes, &s.reserved_bytes, &s.active_bytes, &s.inactive_split_bytes,
                  &s.allocation, &s.segment, &s.active, &s.inactive_split})
    x->reset_peak();
}

allocator_stats caching_allocator::stats() const {
  std::lock_guard lock(impl_->mutex);
  allocator_stats s = impl_->books.st;
  // Free blocks in segments that also hold live blocks: the fragments.
  s.inactive_split_bytes.current = 0;
  s.inactive_split.current = 0;
  for (auto* set : {&impl_->blocks.small_free, &impl_->blocks.large_free})
    for (const block& b : *set)
      if (b.prev || b.next) {
        s.inactive_split_bytes.current += static_cast<std::int64_t>(b.size);
        s.inactive_split.current += 1;
      }
  return s;
}

memory_info caching_allocator::mem_info() const {
  std::lock_guard lock(impl_->mutex);
  const auto alloc = static_cast<std::uint64_t>(impl_->books.st.allocated_bytes.current);
  const std::uint64_t limit = impl_->books.limit;
  return {limit - std::min(limit, alloc), limit};
}

std::size_t caching_allocator::allocation_size(void* p) const {
  std::lock_guard lock(impl_->mutex);
  return impl_->lookup(p, "allocation_size")->size;
}

std::uint64_t caching_allocator::cap() const noexcept { return impl_->books.limit; }
const alloc_config& caching_allocator::config() const noexcept { return impl_->cfg; }
backend& caching_allocator::memory() noexcept { return *impl_->memory; }

std::vector<std::pair<std::uintptr_t, std::size_t>> caching_allocator::largest_allocations(std::size_t n) const {
  std::lock_guard lock(impl_->mutex);
  std::vector<std::pair<std::uintptr_t, std::size_t>> v;
  impl_->blocks.live.for_each([&](block* b) { v.emplace_back(b->addr, b->size); });
  std::sort(v.begin(), v.end(), [](auto& a, auto& b) { return a.second > b.second; });
  if (v.size() > n) v.resize(n);
  return v;
}

std::string caching_allocator::history_json() const {
  std::lock_guard lock(impl_->mutex);
  std::ostringstream o;
  o << "[";
  bool first = true;
  for (const auto& e : impl_->books.history) {
    o << (first ? "" : ",") << "{\"t_ns\":" << e.t << ",\"action\":\"" << e.action << "\",\"addr\":" << e.addr
      << ",\"size\":" << e.size << ",\"stream\":" << e.stream << "}";
    first = false;
  }
  o << "]";
  return o.str();
}

void caching_allocator::check_invariants() const {
  std::lock_guard lock(impl_->mutex);
  const impl& m = *impl_;
  auto fail = [](const std::string& what) { throw std::logic_error("allocator invariant violated: " + what); };
  std::uint64_t reserved = 0, allocated = 0;
  std::size_t live_blocks = 0, free_blocks = 0;
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> ranges;
  for (const segment& s : m.blocks.segments) {
    ranges.emplace_back(s.base, s.base + s.size);
    reserved += s.expandable ? s.mapped_pages * m.granule() : s.size;
    std::uintptr_t expect = s.base;
    std::size_t seg_live = 0;
    const block* prev = nullptr;
    for (const block* b = s.first; b; prev = b, b = b->next) {
      if (b->prev != prev) fail("broken prev link");
      if (b->seg != &s) fail("block points to the wrong segment");
      if (b->addr != expect) fail("blocks do not tile their segment (gap or overlap)");
      if (b->size == 0 || b->size % rounding) fail("block size not a positive multiple of 512");
      expect += b->size;
      const bool is_free = !b->allocated && !b->pending;
      if (b->allocated) {
        ++live_blocks;
        ++seg_live;
        allocated += b->size;
        if (m.blocks.live.find(b->addr) != b) fail("allocated block missing from the live map");
      }
      if (b->pending) ++seg_live;
      if (is_free) {
        ++free_blocks;
        if (!b->hook.is_linked()) fail("free block missing from its pool");
        if (prev && !prev->allocated && !prev->pending) fail("adjacent free blocks not coalesced");
      }
      if (s.expandable && b->allocated) {
        const std::size_t g = m.granule();
        for (std::uintptr_t p = (b->addr - s.base) / g; p <= (b->addr + b->size - 1 - s.base) / g; ++p)
          if (!s.mapped[p]) fail("allocated block over an unmapped page");
      }
    }
    if (expect != s.base + s.size) fail("blocks do not cover their segment");
    if (seg_live != s.live) fail("segment live count is wrong");
  }
  std::sort(ranges.begin(), ranges.end());
  for (std::size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second) fail("segments overlap");
  if (free_blocks != m.blocks.small_free.size() + m.blocks.large_free.size())
    fail("pools hold blocks that are not free");
  if (live_blocks != m.blocks.live.size()) fail("live map holds blocks that are not allocated");
  if (reserved != static_cast<std::uint64_t>(m.books.st.reserved_bytes.current))
    fail("reserved_bytes differs from recomputation");
  if (allocated != static_cast<std::uint64_t>(m.books.st.allocated_bytes.current))
    fail("allocated_bytes differs from recomputation");
  if (live_blocks != static_cast<std::size_t>(m.books.st.allocation.current))
    fail("allocation count differs from recomputation");
  if (reserved > m.books.limit) fail("reserved " + human(reserved) + " exceeds the cap " + human(m.books.limit));
  std::size_t ordinary = 0;
  for (const segment& s : m.blocks.segments) ordinary += !s.expandable;
  if (ordinary != static_cast<std::size_t>(m.books.st.segment.current))
    fail("segment count differs from recomputation");
}

}  // namespace isorun::alloc
