#include "strategy.hpp"

#include <stdexcept>
#include <utility>
#include <vector>

namespace isorun::alloc::detail {
namespace {

// Strategies whose memory comes in whole segments: auto_growth and preallocate.
class segmented : public growth_strategy {
 public:
  using growth_strategy::growth_strategy;

  std::uint64_t release_cached(std::uint64_t want, bool settle) override {
    if (settle) c_.settle();
    std::uint64_t released = 0;
    for (auto it : c_.blocks.lru_order()) {
      if (released >= want) break;
      if (releasable() && arena::segment_free(*it)) {
        released += it->size;
        release_segment(it);
      }
    }
    return released;
  }

  void release_everything() override {
    for (auto& s : c_.blocks.segments) {
      c_.memory.deallocate(reinterpret_cast<void*>(s.base), s.size);
      ++c_.books.st.num_backend_frees;
    }
  }

 protected:
  [[nodiscard]] virtual bool releasable() const { return true; }

  block* find_free(bool small, stream_id stream, std::size_t size) {
    return c_.blocks.best_fit(small, stream, size, c_.cfg.max_split_size);
  }

  void release_segment(std::list<segment>::iterator it) {
    const segment& s = *it;
    c_.memory.deallocate(reinterpret_cast<void*>(s.base), s.size);
    c_.books.gave_back(s.base, s.size, s.stream, true);
    c_.blocks.remove_segment(it);
  }
};

class auto_growth final : public segmented {
 public:
  using segmented::segmented;

  block* obtain(std::size_t size, stream_id stream) override {
    const bool small = size <= small_request;
    if (c_.cfg.no_caching) return grow(small, stream, size) ? find_free(small, stream, size) : nullptr;
    block* b = find_free(small, stream, size);
    if (!b && grow(small, stream, size)) b = find_free(small, stream, size);
    if (!b) {
      // Flush everything cached and try once more.
      release_cached(UINT64_MAX, true);
      ++c_.books.st.num_alloc_retries;
      b = find_free(small, stream, size);
      if (!b && grow(small, stream, size)) b = find_free(small, stream, size);
    }
    return b;
  }

  void on_segment_free(std::list<segment>::iterator it) override {
    if (c_.cfg.no_caching) release_segment(it);
  }

 private:
  std::size_t segment_size_for(bool small, std::size_t size) const {
    if (small) return small_segment;
    std::size_t seg = round_up(size, segment_round);
    if (c_.cfg.pytorch_compat && size < compat_threshold) seg = compat_buffer;
    const std::size_t chunk = first_growth_ ? c_.cfg.initial_chunk : c_.cfg.regrowth_chunk;
    if (chunk) seg = std::max(seg, round_up(chunk, segment_round));
    return seg;
  }

  // A new segment able to hold `size`, within the cap; false if impossible.
  bool grow(bool small, stream_id stream, std::size_t size) {
    ledger& books = c_.books;
    std::size_t seg = segment_size_for(small, size);
    if (!books.fits(seg) && seg > round_up(size, segment_round) && !small)
      seg = round_up(size, segment_round);  // the chunk minimum is a preference, not a need
    const double gc = c_.cfg.garbage_collection_threshold;
    if (gc > 0 && double(books.reserved() + seg) > gc * double(books.limit))
      release_cached(books.reserved() + seg - static_cast<std::uint64_t>(gc * double(books.limit)), true);
    if (!books.fits(seg)) {
      release_cached(books.excess(seg), true);
      ++books.st.num_alloc_retries;
      if (!books.fits(seg)) return false;
    }
    void* p = c_.memory.allocate(seg);
    if (!p) {
      ++books.st.num_device_alloc_failures;
      release_cached(UINT64_MAX, true);
      ++books.st.num_alloc_retries;
      p = c_.memory.allocate(seg);
      if (!p) return false;
    }
    first_growth_ = false;
    const auto base = reinterpret_cast<std::uintptr_t>(p);
    c_.blocks.add_segment(base, seg, small, stream, false);
    books.took(base, seg, stream, true);
    return true;
  }

  bool first_growth_ = true;
};

class preallocate final : public segmented {
 public:
  explicit preallocate(strategy_context c) : segmented(std::move(c)) {
    default_stream_only_ = true;
    std::uint64_t want = c_.books.limit;
    if (c_.cfg.fraction > 0)
      want = std::min<std::uint64_t>(
          want, static_cast<std::uint64_t>(c_.cfg.fraction * double(c_.memory.device_memory().free)));
    want = want / segment_round * segment_round;
    if (want < small_segment) throw config_error("preallocate: fraction leaves less than one 2 MiB segment");
    void* p = c_.memory.allocate(want);
    if (!p) throw config_error("preallocate: the device cannot provide " + human(want));
    const auto base = reinterpret_cast<std::uintptr_t>(p);
    c_.blocks.add_segment(base, want, false, 0, false);
    c_.books.took(base, want, 0, true);
  }

  block* obtain(std::size_t size, stream_id stream) override {
    block* b = find_free(false, stream, size);
    if (!b) {
      c_.settle();  // frees waiting for other streams may complete now
      ++c_.books.st.num_alloc_retries;
      b = find_free(false, stream, size);
    }
    return b;
  }

 private:
  [[nodiscard]] bool releasable() const override { return false; }  // the one segment stays
};

class expandable final : public growth_strategy {
 public:
  using growth_strategy::growth_strategy;

  block* obtain(std::size_t size, stream_id stream) override {
    segment& s = range_for(stream);
    block* b = c_.blocks.best_fit(false, stream, size, c_.cfg.max_split_size);
    return b && ensure_mapped(s, b->addr, size) ? b : nullptr;
  }

  std::uint64_t release_cached(std::uint64_t want, bool settle) override {
    if (settle) c_.settle();
    std::uint64_t released = 0;
    for (auto it : c_.blocks.lru_order()) {
      if (released >= want) break;
      released += unmap_free_pages(*it, want - released);
    }
    return released;
  }

  void release_everything() override {
    const std::size_t g = c_.memory.granularity();
    for (auto& s : c_.blocks.segments) {
      c_.memory.synchronize(s.stream);
      for_each_run(s, 0, s.mapped.size(), true, [&](std::size_t p, std::size_t n) {
        c_.memory.unmap(reinterpret_cast<void*>(s.base + p * g), n * g);
      });
      c_.memory.release_address(reinterpret_cast<void*>(s.base), s.size);
      ++c_.books.st.num_backend_frees;
    }
  }

 private:
  // The stream's address range, reserved on first use. Address space is cheap: eight times the
  // cap, so that a large request finds a contiguous range even when live blocks are scattered
  // (physical pages are what the cap counts).
  segment& range_for(stream_id stream) {
    for (auto& s : c_.blocks.segments)
      if (s.stream == stream) return s;
    const std::size_t g = c_.memory.granularity();
    const std::size_t span = round_up(std::max<std::uint64_t>(c_.books.limit, g) * 8, g);
    void* p = c_.memory.reserve_address(span);
    if (!p) throw std::runtime_error("cannot reserve " + human(span) + " of address space for the expandable strategy");
    segment& s = c_.blocks.add_segment(reinterpret_cast<std::uintptr_t>(p), span, false, stream, true);
    s.mapped.assign(span / g, false);
    return s;
  }

  // Calls f(first page, page count) for each run of consecutive pages in [from, to) whose
  // mapped state is `mapped`.
  template <class F>
  static void for_each_run(const segment& s, std::size_t from, std::size_t to, bool mapped, F&& f) {
    for (std::size_t p = from; p < to;) {
      if (s.mapped[p] != mapped) {
        ++p;
        continue;
      }
      std::size_t end = p + 1;
      while (end < to && s.mapped[end] == mapped) ++end;
      f(p, end - p);
      p = end;
    }
  }

  void set_mapped(segment& s, std::size_t first, std::size_t n, bool mapped) {
    for (std::size_t p = first; p < first + n; ++p) s.mapped[p] = mapped;
    s.mapped_pages = mapped ? s.mapped_pages + n : s.mapped_pages - n;
  }

  // Maps the pages under [addr, addr+size), within the cap. False if it cannot.
  bool ensure_mapped(segment& s, std::uintptr_t addr, std::size_t size) {
    const std::size_t g = c_.memory.granularity();
    const std::size_t first = (addr - s.base) / g, end = (addr + size - 1 - s.base) / g + 1;
    auto unmapped = [&] {
      std::size_t n = 0;
      for (std::size_t p = first; p < end; ++p) n += !s.mapped[p];
      return n;
    };
    ledger& books = c_.books;
    std::size_t need = unmapped();
    if (!need) return true;
    if (!books.fits(need * g)) {
      ++books.st.num_alloc_retries;
      // Releasing may unmap pages under this very block, which raises `need`: repeat until it
      // fits or nothing more can be released.
      while (!books.fits(need * g)) {
        if (!release_cached(books.excess(need * g), false)) return false;
        need = unmapped();
      }
    }
    // One backend call per run of missing pages (usually one run: the block's tail beyond what
    // is mapped), not one per page.
    bool ok = true;
    for_each_run(s, first, end, false, [&](std::size_t p, std::size_t n) {
      if (!ok) return;
      const std::uintptr_t at = s.base + p * g;
      if (!c_.memory.map(reinterpret_cast<void*>(at), n * g)) {
        ++books.st.num_device_alloc_failures;
        ok = false;
        return;
      }
      set_mapped(s, p, n, true);
      books.took(at, n * g, s.stream, false);
    });
    return ok;
  }

  // Unmaps pages lying entirely inside free blocks of `s`, up to `want` bytes, after waiting
  // once for the stream's queued work (a kernel may still be using a freed block: the stream
  // order that makes reusing it safe does not cover giving its memory back). Returns bytes released.
  std::uint64_t unmap_free_pages(segment& s, std::uint64_t want) {
    const std::size_t g = c_.memory.granularity();
    std::vector<std::pair<std::size_t, std::size_t>> runs;  // first page, count
    std::uint64_t released = 0;
    for (block* b = s.first; b && released < want; b = b->next) {
      if (b->allocated || b->pending) continue;
      const std::size_t lo = round_up(b->addr - s.base, g) / g, hi = (b->addr + b->size - s.base) / g;
      for_each_run(s, lo, std::max(lo, hi), true, [&](std::size_t p, std::size_t n) {
        if (released >= want) return;
        const std::uint64_t left = want - released;  // want may be UINT64_MAX: no rounding up by addition
        n = static_cast<std::size_t>(std::min<std::uint64_t>(n, left / g + (left % g != 0)));
        runs.emplace_back(p, n);
        released += n * g;
      });
    }
    if (runs.empty()) return 0;
    c_.memory.synchronize(s.stream);
    for (auto [p, n] : runs) {
      const std::uintptr_t at = s.base + p * g;
      c_.memory.unmap(reinterpret_cast<void*>(at), n * g);
      set_mapped(s, p, n, false);
      c_.books.gave_back(at, n * g, s.stream, false);
    }
    return released;
  }
};

}  // namespace

std::unique_ptr<growth_strategy> make_strategy(strategy_context c) {
  switch (c.cfg.kind) {
    case strategy::preallocate: return std::make_unique<preallocate>(std::move(c));
    case strategy::expandable: return std::make_unique<expandable>(std::move(c));
    case strategy::auto_growth: break;
  }
  return std::make_unique<auto_growth>(std::move(c));
}

}  // namespace isorun::alloc::detail
