#include "isorun/alloc/config.hpp"

#include <charconv>
#include <cmath>
#include <sstream>

#include "isorun/alloc/stats.hpp"

namespace isorun::alloc {
namespace {

constexpr std::uint64_t MiB = 1ULL << 20;

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::uint64_t as_mb(std::string_view key, std::string_view v) {
  std::uint64_t n = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (ec != std::errc{} || p != v.data() + v.size() || n > (1ULL << 30))
    throw config_error("alloc conf: " + std::string(key) + ":" + std::string(v) + ": expected a whole number of MiB");
  return n * MiB;
}

double as_fraction(std::string_view key, std::string_view v, bool open_zero) {
  double d = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), d);
  if (ec != std::errc{} || p != v.data() + v.size() || !(open_zero ? d > 0 : d >= 0) || d > 1 || !std::isfinite(d))
    throw config_error("alloc conf: " + std::string(key) + ":" + std::string(v) + ": expected a number in (0, 1]");
  return d;
}

bool as_bool(std::string_view key, std::string_view v) {
  if (v == "1" || v == "true" || v == "True") return true;
  if (v == "0" || v == "false" || v == "False") return false;
  throw config_error("alloc conf: " + std::string(key) + ":" + std::string(v) + ": expected true or false");
}

}  // namespace

void check_cap(std::uint64_t cap, const alloc_config& config) {
  auto mib = [](std::uint64_t b) {
    return std::to_string(b / MiB) + (b % MiB ? "." + std::to_string(b % MiB * 10 / MiB) : "") + " MiB";
  };
  if (config.reserve >= cap)
    throw config_error("reserve_mb (" + mib(config.reserve) + ") leaves nothing of the " + mib(cap) + " cap");
  if (cap - config.reserve < 2 * MiB)
    throw config_error(
        "a cap of " + mib(cap - config.reserve) +
        " cannot hold a single 2 MiB segment, the allocator's smallest unit; raise --mem-limit to 2M or more");
}

const char* to_string(strategy s) noexcept {
  switch (s) {
    case strategy::auto_growth: return "auto_growth";
    case strategy::preallocate: return "preallocate";
    case strategy::expandable: return "expandable";
  }
  return "?";
}

alloc_config alloc_config::parse(std::string_view text) {
  alloc_config c;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find(',', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view entry = trim(text.substr(start, end - start));
    start = end + 1;
    if (entry.empty()) continue;
    const auto colon = entry.find(':');
    if (colon == std::string_view::npos)
      throw config_error("alloc conf: entry '" + std::string(entry) + "' is not key:value");
    std::string_view key = trim(entry.substr(0, colon)), v = trim(entry.substr(colon + 1));
    if (key == "strategy") {
      if (v == "auto_growth") c.kind = strategy::auto_growth;
      else if (v == "preallocate") c.kind = strategy::preallocate;
      else if (v == "expandable") c.kind = strategy::expandable;
      else
        throw config_error("alloc conf: strategy:" + std::string(v) +
                           ": expected auto_growth, preallocate or expandable");
    } else if (key == "expandable_segments") {
      if (as_bool(key, v)) c.kind = strategy::expandable;
    } else if (key == "pytorch_compat") {
      c.pytorch_compat = as_bool(key, v);
    } else if (key == "max_split_size_mb") {
      c.max_split_size = as_mb(key, v);
      if (c.max_split_size && c.max_split_size < 2 * MiB)
        throw config_error("alloc conf: max_split_size_mb:" + std::string(v) + ": must be at least 2");
    } else if (key == "garbage_collection_threshold") {
      c.garbage_collection_threshold = as_fraction(key, v, true);
    } else if (key == "fraction") {
      c.fraction = as_fraction(key, v, true);
    } else if (key == "initial_chunk_mb") {
      c.initial_chunk = as_mb(key, v);
    } else if (key == "regrowth_chunk_mb") {
      c.regrowth_chunk = as_mb(key, v);
    } else if (key == "reserve_mb") {
      c.reserve = as_mb(key, v);
    } else if (key == "no_caching") {
      c.no_caching = as_bool(key, v);
    } else if (key == "debug_fill") {
      if (v == "true" || v == "True") c.debug_fill = 0xA5;
      else if (v == "false" || v == "False") c.debug_fill = -1;
      else {
        int n = 0;
        int base = v.substr(0, 2) == "0x" ? 16 : 10;
        std::string_view digits = base == 16 ? v.substr(2) : v;
        auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n, base);
        if (ec != std::errc{} || p != digits.data() + digits.size() || n < 0 || n > 255)
          throw config_error("alloc conf: debug_fill:" + std::string(v) +
                             ": expected true, false or a byte (0..255, 0xA5)");
        c.debug_fill = n;
      }
    } else if (key == "history") {
      std::uint64_t n = 0;
      auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
      if (ec != std::errc{} || p != v.data() + v.size() || n > 10'000'000)
        throw config_error("alloc conf: history:" + std::string(v) + ": expected a number of events (0..10000000)");
      c.history = n;
    } else {
      throw config_error("alloc conf: unknown key '" + std::string(key) +
                         "'; known: strategy, expandable_segments, pytorch_compat, max_split_size_mb, "
                         "garbage_collection_threshold, fraction, initial_chunk_mb, regrowth_chunk_mb, reserve_mb, "
                         "no_caching, debug_fill, history");
    }
  }
  if (c.fraction > 0 && c.kind != strategy::preallocate)
    throw config_error("alloc conf: fraction applies to strategy:preallocate only");
  if (c.no_caching && c.kind != strategy::auto_growth)
    throw config_error(
        "alloc conf: no_caching applies to strategy:auto_growth only (preallocate keeps its one "
        "segment; expandable returns free pages under pressure)");
  return c;
}

std::string alloc_config::to_string() const {
  std::ostringstream o;
  o << "strategy:" << alloc::to_string(kind);
  if (pytorch_compat) o << ",pytorch_compat:true";
  if (max_split_size) o << ",max_split_size_mb:" << max_split_size / MiB;
  if (garbage_collection_threshold > 0) o << ",garbage_collection_threshold:" << garbage_collection_threshold;
  if (fraction > 0) o << ",fraction:" << fraction;
  if (initial_chunk) o << ",initial_chunk_mb:" << initial_chunk / MiB;
  if (regrowth_chunk) o << ",regrowth_chunk_mb:" << regrowth_chunk / MiB;
  if (reserve) o << ",reserve_mb:" << reserve / MiB;
  if (no_caching) o << ",no_caching:true";
  if (debug_fill >= 0) o << ",debug_fill:" << debug_fill;
  if (history) o << ",history:" << history;
  return o.str();
}

std::string allocator_stats::to_json() const {
  std::ostringstream o;
  auto put = [&](const char* name, const stat& s) {
    o << "\"" << name << "\":{\"current\":" << s.current << ",\"peak\":" << s.peak << ",\"allocated\":" << s.allocated
      << ",\"freed\":" << s.freed << "},";
  };
  o << "{";
  put("allocated_bytes", allocated_bytes);
  put("requested_bytes", requested_bytes);
  put("reserved_bytes", reserved_bytes);
  put("active_bytes", active_bytes);
  put("inactive_split_bytes", inactive_split_bytes);
  put("allocation", allocation);
  put("segment", segment);
  put("active", active);
  put("inactive_split", inactive_split);
  o << "\"num_ooms\":" << num_ooms << ",\"num_alloc_retries\":" << num_alloc_retries
    << ",\"num_backend_allocs\":" << num_backend_allocs << ",\"num_backend_frees\":" << num_backend_frees
    << ",\"num_device_alloc_failures\":" << num_device_alloc_failures << ",\"leaked_bytes\":" << leaked_bytes
    << ",\"leaked_allocations\":" << leaked_allocations << ",\"fragmentation\":" << fragmentation() << "}";
  return o.str();
}

}  // namespace isorun::alloc
