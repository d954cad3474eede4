#include "isorun/runner/units.hpp"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace isorun {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Splits "1.5GiB" into 1.5 and "gib"; false if there is no leading non-negative number.
bool split_number(std::string_view text, double& value, std::string& unit) {
  std::size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  if (i == 0) return false;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + i, value);
  if (ec != std::errc{} || ptr != text.data() + i || !std::isfinite(value)) return false;
  std::size_t j = i;
  while (j < text.size() && text[j] == ' ') ++j;
  unit = lower(text.substr(j));
  return true;
}

}  // namespace

std::uint64_t parse_size(std::string_view text) {
  const std::string what = "invalid size '" + std::string(text) +
                           "': expected bytes or a number with K, M, G, T (also KB/KiB...), e.g. 2G, 512M, 1.5GiB";
  double value = 0;
  std::string unit;
  if (!split_number(text, value, unit)) throw parse_error(what);
  int shift = 0;
  if (unit.empty() || unit == "b") shift = 0;
  else if (unit == "k" || unit == "kb" || unit == "kib") shift = 10;
  else if (unit == "m" || unit == "mb" || unit == "mib") shift = 20;
  else if (unit == "g" || unit == "gb" || unit == "gib") shift = 30;
  else if (unit == "t" || unit == "tb" || unit == "tib") shift = 40;
  else throw parse_error(what);
  const double bytes = std::ldexp(value, shift);
  if (bytes >= 18446744073709551615.0) throw parse_error("size '" + std::string(text) + "' is too large");
  if (shift == 0 && value != std::floor(value)) throw parse_error(what);
  return static_cast<std::uint64_t>(std::llround(bytes));
}

std::chrono::milliseconds parse_duration(std::string_view text) {
  const std::string what = "invalid duration '" + std::string(text) +
                           "': expected a number with ms, s, m or h, e.g. 500ms, 30s, 5m";
  double value = 0;
  std::string unit;
  if (!split_number(text, value, unit)) throw parse_error(what);
  double ms;
  if (unit.empty())
    throw parse_error("duration '" + std::string(text) + "' has no unit: write " + std::string(text) + "s, " +
                      std::string(text) + "ms or " + std::string(text) + "m");
  if (unit == "s" || unit == "sec") ms = value * 1e3;
  else if (unit == "ms") ms = value;
  else if (unit == "m" || unit == "min") ms = value * 60e3;
  else if (unit == "h") ms = value * 3600e3;
  else throw parse_error(what);
  if (ms > 1e15) throw parse_error("duration '" + std::string(text) + "' is too long");
  return std::chrono::milliseconds(static_cast<std::int64_t>(std::llround(ms)));
}

std::string format_size(std::uint64_t bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (u == 0) std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  else std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

std::string format_duration(std::chrono::nanoseconds d) {
  const double ns = static_cast<double>(d.count());
  char buf[32];
  if (ns < 1e3) std::snprintf(buf, sizeof buf, "%.0f ns", ns);
  else if (ns < 1e6) std::snprintf(buf, sizeof buf, "%.1f us", ns / 1e3);
  else if (ns < 1e9) std::snprintf(buf, sizeof buf, "%.2f ms", ns / 1e6);
  else std::snprintf(buf, sizeof buf, "%.2f s", ns / 1e9);
  return buf;
}

}  // namespace isorun
