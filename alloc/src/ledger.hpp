#pragma once
// What a caching allocator counts, around whatever strategy it runs: the cap, the statistics,
// the history ring buffer and the out-of-memory report. Every byte taken from or given back to
// the backend passes through here, so the cap and the figures cannot drift apart.

#include <algorithm>
#include <cstdint>
#include <deque>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "arena.hpp"
#include "isorun/alloc/config.hpp"
#include "isorun/alloc/out_of_memory.hpp"
#include "isorun/alloc/stats.hpp"

namespace isorun::alloc::detail {

/// One entry of the history ring buffer (config `history`).
struct event_record {
  std::int64_t t;
  const char* action;
  std::uintptr_t addr;
  std::size_t size;
  stream_id stream;
};

struct ledger {
  std::uint64_t cap = 0;    // as given
  std::uint64_t limit = 0;  // cap minus config.reserve: what may be held
  std::string cap_origin;   // how the cap was derived, for the OOM report
  allocator_stats st;
  std::deque<event_record> history;
  std::size_t history_size = 0;

  [[nodiscard]] std::uint64_t reserved() const { return static_cast<std::uint64_t>(st.reserved_bytes.current); }
  /// Would holding `more` bytes on top of what is held stay within the cap?
  [[nodiscard]] bool fits(std::uint64_t more) const { return reserved() + more <= limit; }
  /// Bytes over the cap that holding `more` would need released first (0 if it fits).
  [[nodiscard]] std::uint64_t excess(std::uint64_t more) const { return fits(more) ? 0 : reserved() + more - limit; }

  void log(const char* action, std::uintptr_t addr, std::size_t size, stream_id s) {
    if (!history_size) return;
    if (history.size() == history_size) history.pop_front();
    history.push_back({now_ns(), action, addr, size, s});
  }

  /// Memory taken from the backend: a segment (`segment` true) or an expandable page.
  void took(std::uintptr_t addr, std::size_t size, stream_id s, bool segment) {
    st.reserved_bytes.add(static_cast<std::int64_t>(size));
    if (segment) st.segment.add(1);
    ++st.num_backend_allocs;
    log(segment ? "segment_alloc" : "map", addr, size, s);
  }
  /// Memory given back to the backend.
  void gave_back(std::uintptr_t addr, std::size_t size, stream_id s, bool segment) {
    st.reserved_bytes.sub(static_cast<std::int64_t>(size));
    if (segment) st.segment.sub(1);
    ++st.num_backend_frees;
    log(segment ? "segment_free" : "unmap", addr, size, s);
  }

  void allocated(const block& b) {
    st.allocated_bytes.add(static_cast<std::int64_t>(b.size));
    st.requested_bytes.add(static_cast<std::int64_t>(b.requested));
    st.active_bytes.add(static_cast<std::int64_t>(b.size));
    st.allocation.add(1);
    st.active.add(1);
    log("alloc", b.addr, b.size, b.stream);
  }
  /// A block freed by the task (it may still wait for other streams).
  void freed(const block& b) {
    st.allocated_bytes.sub(static_cast<std::int64_t>(b.size));
    st.requested_bytes.sub(static_cast<std::int64_t>(b.requested));
    st.allocation.sub(1);
    log("free", b.addr, b.size, b.stream);
  }
  /// A freed block back in its pool: no longer active.
  void released(const block& b) {
    st.active_bytes.sub(static_cast<std::int64_t>(b.size));
    st.active.sub(1);
  }

  /// @brief Throws out_of_memory for a request of `bytes` (`size` rounded) that cannot be met:
  ///        the figures, the largest live allocations, and what to change.
  [[noreturn]] void throw_oom(std::size_t bytes, std::size_t size, stream_id stream, const arena& a,
                              const alloc_config& cfg) {
    ++st.num_ooms;
    log("oom", 0, size, stream);
    std::size_t largest = 0;
    for (auto* set : {&a.small_free, &a.large_free})
      for (const block& b : *set) largest = std::max(largest, b.size);
    const std::uint64_t res = reserved(), alloc = static_cast<std::uint64_t>(st.allocated_bytes.current);
    const double frag = res ? 1.0 - double(alloc) / double(res) : 0.0;
    std::ostringstream m;
    m << "out of memory: tried to allocate " << human(bytes) << " (" << human(size) << " rounded) on stream " << stream
      << "; cap " << human(limit);
    if (!cap_origin.empty()) m << " (" << cap_origin << ")";
    if (cfg.reserve) m << " after keeping " << human(cfg.reserve) << " in reserve";
    m << "; reserved " << human(res) << ", allocated " << human(alloc) << ", cached free "
      << human(res - std::min(res, alloc)) << " (largest free block " << human(largest) << "), fragmentation "
      << int(frag * 100 + 0.5) << "%.";
    std::vector<std::pair<std::uintptr_t, std::size_t>> big;
    a.live.for_each([&](block* b) { big.emplace_back(b->addr, b->size); });
    std::sort(big.begin(), big.end(), [](auto& x, auto& y) { return x.second > y.second; });
    if (!big.empty()) {
      m << " Largest live allocations:";
      for (std::size_t i = 0; i < std::min<std::size_t>(3, big.size()); ++i)
        m << (i ? "," : "") << " " << human(big[i].second);
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
    oom_figures figures{bytes, limit, res, alloc, largest, {}};
    for (std::size_t i = 0; i < std::min<std::size_t>(64, big.size()); ++i) figures.live.push_back(big[i].second);
    throw out_of_memory(m.str(), figures);
  }
};

}  // namespace isorun::alloc::detail
