#include "isorun/alloc/caching_allocator.hpp"

#include <time.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <deque>
#include <list>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

#include <boost/intrusive/set.hpp>

namespace isorun::alloc {
namespace {

constexpr std::size_t KiB = 1024, MiB = 1024 * KiB;
constexpr std::size_t small_request = 1 * MiB;   // at most this: small pool
constexpr std::size_t small_segment = 2 * MiB;   // small pool segments
constexpr std::size_t segment_round = 2 * MiB;   // large segments are multiples of this
constexpr std::size_t compat_buffer = 20 * MiB;  // PyTorch: 1-10 MiB requests get 20 MiB segments
constexpr std::size_t compat_threshold = 10 * MiB;
constexpr std::size_t absurd = std::size_t{1} << 50;

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

std::string human(std::uint64_t bytes) {
  char buf[32];
  if (bytes >= (1ULL << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", double(bytes) / double(1ULL << 30));
  else if (bytes >= MiB) std::snprintf(buf, sizeof buf, "%.2f MiB", double(bytes) / double(MiB));
  else if (bytes >= KiB) std::snprintf(buf, sizeof buf, "%.2f KiB", double(bytes) / double(KiB));
  else std::snprintf(buf, sizeof buf, "%" PRIu64 " B", bytes);
  return buf;
}

std::int64_t now_ns() {
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
  std::size_t size = 0;      // address range
  bool small = false;
  bool expandable = false;
  stream_id stream = 0;
  std::size_t live = 0;      // allocated or pending blocks
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

struct event_record {
  std::int64_t t;
  const char* action;
  std::uintptr_t addr;
  std::size_t size;
  stream_id stream;
};

}  // namespace

struct caching_allocator::impl {
  std::unique_ptr<backend> memory;
  std::uint64_t cap;       // as given
  std::uint64_t limit;     // cap minus config.reserve: what may be held
  alloc_config cfg;
  std::string cap_origin;
  mutable std::mutex mutex;

  std::list<segment> segments;
  free_set small_free, large_free;
  address_map live;
  std::vector<block*> spare;  // recycled block objects

  block* make_block() {
    if (spare.empty()) return new block;
    block* b = spare.back();
    spare.pop_back();
    return b;
  }
  void drop_block(block* b) {
    b->uses.clear();
    b->events.clear();
    spare.push_back(b);
  }
  ~impl() {
    for (block* b : spare) delete b;
  }
  std::vector<block*> pending;
  allocator_stats st;
  std::uint64_t clock = 0;
  bool first_growth = true;
  std::deque<event_record> history;

  std::size_t granule() const { return memory->granularity(); }
  std::uint64_t reserved() const { return static_cast<std::uint64_t>(st.reserved_bytes.current); }

  void log(const char* action, std::uintptr_t addr, std::size_t size, stream_id s) {
    if (!cfg.history) return;
    if (history.size() == cfg.history) history.pop_front();
    history.push_back({now_ns(), action, addr, size, s});
  }

  free_set& pool_of(const segment& s) { return s.small ? small_free : large_free; }

  // --- segments -------------------------------------------------------------------------

  segment* add_segment(std::uintptr_t base, std::size_t size, bool small, stream_id stream, bool expandable) {
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
    return &s;
  }

  // Returns a fully free ordinary segment to the backend.
  void release_segment(std::list<segment>::iterator it) {
    segment& s = *it;
    block* b = s.first;
    pool_of(s).erase(pool_of(s).iterator_to(*b));
    memory->deallocate(reinterpret_cast<void*>(s.base), s.size);
    st.reserved_bytes.sub(static_cast<std::int64_t>(s.size));
    st.segment.sub(1);
    ++st.num_backend_frees;
    log("segment_free", s.base, s.size, s.stream);
    drop_block(b);
    segments.erase(it);
  }

  bool segment_free(const segment& s) const { return s.live == 0 && s.first->next == nullptr && !s.first->allocated; }

  // Unmaps expandable pages lying entirely inside free blocks. Returns bytes released.
  std::uint64_t unmap_free_pages(segment& s, std::uint64_t want) {
    std::uint64_t released = 0;
    const std::size_t g = granule();
    for (block* b = s.first; b && released < want; b = b->next) {
      if (b->allocated || b->pending) continue;
      std::uintptr_t lo = round_up(b->addr - s.base, g), hi = (b->addr + b->size - s.base) / g * g;
      for (std::uintptr_t off = lo; off + g <= hi && released < want; off += g) {
        if (!s.mapped[off / g]) continue;
        memory->unmap(reinterpret_cast<void*>(s.base + off), g);
        s.mapped[off / g] = false;
        --s.mapped_pages;
        released += g;
        st.reserved_bytes.sub(static_cast<std::int64_t>(g));
        ++st.num_backend_frees;
        log("unmap", s.base + off, g, s.stream);
      }
    }
    return released;
  }

  // Releases cached memory, least recently used segments first, until `want` bytes are back.
  // `settle` also completes pending frees first; callers iterating a pool must pass false.
  std::uint64_t release_cached(std::uint64_t want, bool settle = true) {
    if (settle) process_events();
    std::vector<std::list<segment>::iterator> order;
    for (auto it = segments.begin(); it != segments.end(); ++it) order.push_back(it);
    std::sort(order.begin(), order.end(), [](auto a, auto b) { return a->last_used < b->last_used; });
    std::uint64_t released = 0;
    for (auto it : order) {
      if (released >= want) break;
      if (it->expandable) {
        released += unmap_free_pages(*it, want - released);
      } else if (segment_free(*it) && !(cfg.kind == strategy::preallocate)) {
        released += it->size;
        release_segment(it);
      }
    }
    return released;
  }

  // --- events ---------------------------------------------------------------------------

  void process_events() {
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

  // --- blocks ---------------------------------------------------------------------------

  void merge_into(block* dst, block* src) {  // src follows dst, both free; src is in its pool
    auto& pool = pool_of(*dst->seg);
    pool.erase(pool.iterator_to(*src));
    dst->size += src->size;
    dst->next = src->next;
    if (src->next) src->next->prev = dst;
    drop_block(src);
  }

  void release_block(block* b) {
    segment& s = *b->seg;
    b->allocated = false;
    b->uses.clear();
    b->stream = s.stream;
    st.active_bytes.sub(static_cast<std::int64_t>(b->size));
    st.active.sub(1);
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
    if (cfg.no_caching && !s.expandable && segment_free(s)) {
      for (auto it = segments.begin(); it != segments.end(); ++it)
        if (&*it == &s) {
          release_segment(it);
          break;
        }
    }
  }

  bool should_split(const block* b, std::size_t size) const {
    const std::size_t remaining = b->size - size;
    if (b->seg->small) return remaining >= rounding;
    if (cfg.max_split_size && size >= cfg.max_split_size) return false;
    // PyTorch keeps large-pool remainders of 1 MiB or less attached; isorun splits any
    // remainder that can hold an allocation, which is what keeps fragmentation low.
    return cfg.pytorch_compat ? remaining > small_request : remaining >= rounding;
  }

  block* find_free(bool small, stream_id stream, std::size_t size) {
    auto& pool = small ? small_free : large_free;
    block key;
    key.stream = stream;
    key.size = size;
    key.addr = 0;
    for (auto it = pool.lower_bound(key); it != pool.end() && it->stream == stream; ++it) {
      block* b = &*it;
      if (cfg.max_split_size && !small) {
        // As in PyTorch: no oversize block for a small request, and no much larger block for a
        // large one, so oversize blocks do not get chopped into unusable pieces.
        if (size < cfg.max_split_size && b->size >= cfg.max_split_size) continue;
        if (size >= cfg.max_split_size && b->size >= size + compat_buffer) continue;
      }
      if (b->seg->expandable && !ensure_mapped(*b->seg, b->addr, size)) return nullptr;
      return b;
    }
    return nullptr;
  }

  // Maps the expandable pages under [addr, addr+size), within the cap. False if it cannot.
  bool ensure_mapped(segment& s, std::uintptr_t addr, std::size_t size) {
    const std::size_t g = granule();
    const std::size_t first = (addr - s.base) / g, last = (addr + size - 1 - s.base) / g;
    auto unmapped = [&] {
      std::size_t n = 0;
      for (std::size_t p = first; p <= last; ++p) n += !s.mapped[p];
      return n;
    };
    std::size_t need = unmapped();
    if (!need) return true;
    if (reserved() + need * g > limit) {
      ++st.num_alloc_retries;
      // Releasing may unmap pages under this very block, which raises `need`: repeat until it
      // fits or nothing more can be released.
      while (reserved() + need * g > limit) {
        if (!release_cached(reserved() + need * g - limit, false)) return false;
        need = unmapped();
      }
    }
    for (std::size_t p = first; p <= last; ++p) {
      if (s.mapped[p]) continue;
      if (!memory->map(reinterpret_cast<void*>(s.base + p * g), g)) {
        ++st.num_device_alloc_failures;
        return false;
      }
      s.mapped[p] = true;
      ++s.mapped_pages;
      st.reserved_bytes.add(static_cast<std::int64_t>(g));
      ++st.num_backend_allocs;
      log("map", s.base + p * g, g, s.stream);
    }
    return true;
  }

  std::size_t segment_size_for(bool small, std::size_t size) {
    if (small) return small_segment;
    std::size_t seg = round_up(size, segment_round);
    if (cfg.pytorch_compat && size < compat_threshold) seg = compat_buffer;
    if (cfg.kind == strategy::auto_growth) {
      const std::size_t chunk = first_growth ? cfg.initial_chunk : cfg.regrowth_chunk;
      if (chunk) seg = std::max(seg, round_up(chunk, segment_round));
    }
    return seg;
  }

  // A new segment able to hold `size`, within the cap; nullptr if impossible.
  bool grow(bool small, stream_id stream, std::size_t size) {
    std::size_t seg = segment_size_for(small, size);
    if (reserved() + seg > limit && seg > round_up(size, segment_round) && !small)
      seg = round_up(size, segment_round);  // the chunk minimum is a preference, not a need
    if (cfg.garbage_collection_threshold > 0 &&
        double(reserved() + seg) > cfg.garbage_collection_threshold * double(limit))
      release_cached(reserved() + seg - static_cast<std::uint64_t>(cfg.garbage_collection_threshold * double(limit)));
    if (reserved() + seg > limit) {
      release_cached(reserved() + seg - limit);
      ++st.num_alloc_retries;
      if (reserved() + seg > limit) return false;
    }
    void* p = memory->allocate(seg);
    if (!p) {
      ++st.num_device_alloc_failures;
      release_cached(UINT64_MAX);
      ++st.num_alloc_retries;
      p = memory->allocate(seg);
      if (!p) return false;
    }
    first_growth = false;
    st.reserved_bytes.add(static_cast<std::int64_t>(seg));
    st.segment.add(1);
    ++st.num_backend_allocs;
    add_segment(reinterpret_cast<std::uintptr_t>(p), seg, small, stream, false);
    log("segment_alloc", reinterpret_cast<std::uintptr_t>(p), seg, stream);
    return true;
  }

  segment* expandable_segment(stream_id stream) {
    for (auto& s : segments)
      if (s.expandable && s.stream == stream) return &s;
    // Address space is cheap: eight times the cap, so that a large request finds a contiguous
    // range even when live blocks are scattered (physical pages are what the cap counts).
    const std::size_t g = granule();
    const std::size_t span = round_up(std::max<std::uint64_t>(limit, g) * 8, g);
    void* p = memory->reserve_address(span);
    if (!p) throw std::runtime_error("cannot reserve " + human(span) + " of address space for the expandable strategy");
    segment* s = add_segment(reinterpret_cast<std::uintptr_t>(p), span, false, stream, true);
    s->mapped.assign(span / g, false);
    return s;
  }

  [[noreturn]] void throw_oom(std::size_t bytes, std::size_t size, stream_id stream) {
    ++st.num_ooms;
    log("oom", 0, size, stream);
    std::size_t largest = 0;
    for (auto* set : {&small_free, &large_free})
      for (const block& b : *set) largest = std::max(largest, b.size);
    const std::uint64_t res = reserved(), alloc = static_cast<std::uint64_t>(st.allocated_bytes.current);
    const double frag = res ? 1.0 - double(alloc) / double(res) : 0.0;
    std::ostringstream m;
    m << "out of memory: tried to allocate " << human(bytes) << " (" << human(size) << " rounded) on stream " << stream
      << "; cap " << human(limit);
    if (!cap_origin.empty()) m << " (" << cap_origin << ")";
    if (cfg.reserve) m << " after keeping " << human(cfg.reserve) << " in reserve";
    m << "; reserved " << human(res) << ", allocated " << human(alloc) << ", cached free " << human(res - std::min(res, alloc))
      << " (largest free block " << human(largest) << "), fragmentation " << int(frag * 100 + 0.5) << "%.";
    std::vector<std::pair<std::uintptr_t, std::size_t>> big;
    live.for_each([&](block* b) { big.emplace_back(b->addr, b->size); });
    std::sort(big.begin(), big.end(), [](auto& a, auto& b) { return a.second > b.second; });
    if (!big.empty()) {
      m << " Largest live allocations:";
      for (std::size_t i = 0; i < std::min<std::size_t>(3, big.size()); ++i) m << (i ? "," : "") << " " << human(big[i].second);
      m << ".";
    }
    if (alloc + size > limit) {
      m << " The live allocations alone would exceed the cap: raise --mem-limit or use less memory (e.g. a smaller batch).";
    } else {
      std::vector<std::string> tips;
      if (cfg.kind != strategy::expandable)
        tips.push_back("strategy:expandable (freed pages are returned, so they cannot strand as fragments)");
      if (cfg.kind != strategy::expandable && cfg.max_split_size == 0)
        tips.push_back("max_split_size_mb:" + std::to_string(std::max<std::size_t>(size / MiB, 64)) +
                       " (keeps large cached blocks from being split)");
      if (cfg.garbage_collection_threshold == 0 && cfg.kind == strategy::auto_growth)
        tips.push_back("garbage_collection_threshold:0.8");
      if (!tips.empty()) {
        m << " Memory is fragmented; try ISORUN_ALLOC_CONF=";
        for (std::size_t i = 0; i < tips.size(); ++i) m << (i ? " or " : "") << tips[i];
        m << ".";
      }
    }
    oom_figures f{bytes, limit, res, alloc, largest};
    throw out_of_memory(m.str(), f);
  }

  void* allocate(std::size_t bytes, stream_id stream) {
    if (bytes == 0) throw std::invalid_argument("allocate(0): zero-byte allocations are not supported");
    if (bytes > absurd) throw std::invalid_argument("allocate(" + std::to_string(bytes) + "): absurd size (over 1 PiB)");
    if (cfg.kind == strategy::preallocate && stream != 0)
      throw std::invalid_argument("strategy:preallocate serves the default stream only; use auto_growth or expandable "
                                  "for work on other streams");
    const std::size_t size = round_up(bytes, rounding);
    std::lock_guard lock(mutex);
    if (!pending.empty()) process_events();
    const bool expandable = cfg.kind == strategy::expandable;
    const bool small = !expandable && size <= small_request && cfg.kind != strategy::preallocate;
    block* b = nullptr;
    if (cfg.no_caching && !expandable) {
      if (grow(small, stream, size)) b = find_free(small, stream, size);
    } else {
      if (expandable) expandable_segment(stream);
      b = find_free(small, stream, size);
      if (!b && !expandable && cfg.kind != strategy::preallocate && grow(small, stream, size)) b = find_free(small, stream, size);
      if (!b && !expandable) {
        // Flush everything cached and try once more.
        release_cached(UINT64_MAX);
        ++st.num_alloc_retries;
        b = find_free(small, stream, size);
        if (!b && cfg.kind != strategy::preallocate && grow(small, stream, size)) b = find_free(small, stream, size);
      }
    }
    if (!b) throw_oom(bytes, size, stream);

    auto& pool = pool_of(*b->seg);
    pool.erase(pool.iterator_to(*b));
    if (should_split(b, size)) {
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
    b->requested = bytes;
    b->stream = stream;
    b->seg->live++;
    b->seg->last_used = ++clock;
    live.insert(b);
    st.allocated_bytes.add(static_cast<std::int64_t>(b->size));
    st.requested_bytes.add(static_cast<std::int64_t>(bytes));
    st.active_bytes.add(static_cast<std::int64_t>(b->size));
    st.allocation.add(1);
    st.active.add(1);
    log("alloc", b->addr, b->size, stream);
    if (cfg.debug_fill >= 0)
      memory->fill(reinterpret_cast<void*>(b->addr), b->size, static_cast<std::uint8_t>(cfg.debug_fill), stream);
    return reinterpret_cast<void*>(b->addr);
  }

  block* lookup(void* p, const char* what) const {
    block* b = live.find(reinterpret_cast<std::uintptr_t>(p));
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
    live.erase(b->addr);
    st.allocated_bytes.sub(static_cast<std::int64_t>(b->size));
    st.requested_bytes.sub(static_cast<std::int64_t>(b->requested));
    st.allocation.sub(1);
    log("free", b->addr, b->size, b->stream);
    if (!b->uses.empty()) {
      for (stream_id s : b->uses) b->events.push_back(memory->record_event(s));
      b->pending = true;
      pending.push_back(b);
      process_events();
      return;
    }
    release_block(b);
  }

  void teardown() {
    st.leaked_allocations = live.size();
    live.for_each([&](block* b) { st.leaked_bytes += b->size; });
    live.clear();
    pending.clear();
    small_free.clear();
    large_free.clear();
    for (auto& s : segments) {
      for (block* b = s.first; b;) {
        block* n = b->next;
        drop_block(b);
        b = n;
      }
      if (s.expandable) {
        const std::size_t g = granule();
        for (std::size_t p = 0; p < s.mapped.size(); ++p)
          if (s.mapped[p]) memory->unmap(reinterpret_cast<void*>(s.base + p * g), g);
        memory->release_address(reinterpret_cast<void*>(s.base), s.size);
      } else {
        memory->deallocate(reinterpret_cast<void*>(s.base), s.size);
      }
      ++st.num_backend_frees;
    }
    segments.clear();
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
  m.cap = cap;
  m.cfg = config;
  m.cap_origin = std::move(cap_origin);
  check_cap(cap, config);
  m.limit = cap - config.reserve;
  if (config.kind == strategy::preallocate) {
    std::uint64_t want = m.limit;
    if (config.fraction > 0)
      want = std::min<std::uint64_t>(want, static_cast<std::uint64_t>(config.fraction * double(m.memory->device_memory().free)));
    want = want / segment_round * segment_round;
    if (want < small_segment) throw config_error("preallocate: fraction leaves less than one 2 MiB segment");
    void* p = m.memory->allocate(want);
    if (!p) throw config_error("preallocate: the device cannot provide " + human(want));
    m.st.reserved_bytes.add(static_cast<std::int64_t>(want));
    m.st.segment.add(1);
    ++m.st.num_backend_allocs;
    m.add_segment(reinterpret_cast<std::uintptr_t>(p), want, false, 0, false);
  }
}

caching_allocator::~caching_allocator() {
  if (impl_ && !impl_->segments.empty()) impl_->teardown();
}

allocator_stats caching_allocator::release_all() {
  std::lock_guard lock(impl_->mutex);
  impl_->teardown();
  return impl_->st;
}

void* caching_allocator::allocate(std::size_t bytes, stream_id stream) { return impl_->allocate(bytes, stream); }
void caching_allocator::deallocate(void* p) { impl_->deallocate(p); }

void caching_allocator::record_stream(void* p, stream_id stream) {
  std::lock_guard lock(impl_->mutex);
  block* b = impl_->lookup(p, "record_stream");
  if (stream != b->stream && std::find(b->uses.begin(), b->uses.end(), stream) == b->uses.end()) b->uses.push_back(stream);
}

void caching_allocator::empty_cache() {
  std::lock_guard lock(impl_->mutex);
  impl_->release_cached(UINT64_MAX);
}

void caching_allocator::reset_peak() {
  std::lock_guard lock(impl_->mutex);
  auto& s = impl_->st;
  for (stat* x : {&s.allocated_bytes, &s.requested_bytes, &s.reserved_bytes, &s.active_bytes, &s.inactive_split_bytes,
                  &s.allocation, &s.segment, &s.active, &s.inactive_split})
    x->reset_peak();
}

allocator_stats caching_allocator::stats() const {
  std::lock_guard lock(impl_->mutex);
  allocator_stats s = impl_->st;
  // Free blocks in segments that also hold live blocks: the fragments.
  s.inactive_split_bytes.current = 0;
  s.inactive_split.current = 0;
  for (auto* set : {&impl_->small_free, &impl_->large_free})
    for (const block& b : *set)
      if (b.prev || b.next) {
        s.inactive_split_bytes.current += static_cast<std::int64_t>(b.size);
        s.inactive_split.current += 1;
      }
  return s;
}

memory_info caching_allocator::mem_info() const {
  std::lock_guard lock(impl_->mutex);
  const auto alloc = static_cast<std::uint64_t>(impl_->st.allocated_bytes.current);
  return {impl_->limit - std::min(impl_->limit, alloc), impl_->limit};
}

std::size_t caching_allocator::allocation_size(void* p) const {
  std::lock_guard lock(impl_->mutex);
  return impl_->lookup(p, "allocation_size")->size;
}

std::uint64_t caching_allocator::cap() const noexcept { return impl_->limit; }
const alloc_config& caching_allocator::config() const noexcept { return impl_->cfg; }
backend& caching_allocator::memory() noexcept { return *impl_->memory; }

std::vector<std::pair<std::uintptr_t, std::size_t>> caching_allocator::largest_allocations(std::size_t n) const {
  std::lock_guard lock(impl_->mutex);
  std::vector<std::pair<std::uintptr_t, std::size_t>> v;
  impl_->live.for_each([&](block* b) { v.emplace_back(b->addr, b->size); });
  std::sort(v.begin(), v.end(), [](auto& a, auto& b) { return a.second > b.second; });
  if (v.size() > n) v.resize(n);
  return v;
}

std::string caching_allocator::history_json() const {
  std::lock_guard lock(impl_->mutex);
  std::ostringstream o;
  o << "[";
  bool first = true;
  for (const auto& e : impl_->history) {
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
  for (const segment& s : m.segments) {
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
        if (m.live.find(b->addr) != b) fail("allocated block missing from the live map");
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
  if (free_blocks != m.small_free.size() + m.large_free.size()) fail("pools hold blocks that are not free");
  if (live_blocks != m.live.size()) fail("live map holds blocks that are not allocated");
  if (reserved != static_cast<std::uint64_t>(m.st.reserved_bytes.current)) fail("reserved_bytes differs from recomputation");
  if (allocated != static_cast<std::uint64_t>(m.st.allocated_bytes.current)) fail("allocated_bytes differs from recomputation");
  if (live_blocks != static_cast<std::size_t>(m.st.allocation.current)) fail("allocation count differs from recomputation");
  if (reserved > m.limit) fail("reserved " + human(reserved) + " exceeds the cap " + human(m.limit));
  std::size_t ordinary = 0;
  for (const segment& s : m.segments) ordinary += !s.expandable;
  if (ordinary != static_cast<std::size_t>(m.st.segment.current)) fail("segment count differs from recomputation");
}

}  // namespace isorun::alloc
