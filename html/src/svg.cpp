// The pages' SVG primitives (see svg.hpp).
#include "isorun/html/svg.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>

#include "isorun/runner/units.hpp"

namespace isorun::html::svg {

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

std::string num(double v, int digits) {
  char b[48];
  std::snprintf(b, sizeof b, "%.*g", digits, v);
  return b;
}

std::string px(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", v);
  return b;
}

std::string bytes(std::uint64_t b) { return format_size(b); }

const char* outcome_colour(outcome_kind k) {
  switch (k) {
    case outcome_kind::success: return "#2a9d8f";
    case outcome_kind::task_error: return "#e76f51";
    case outcome_kind::out_of_memory: return "#9b2226";
    case outcome_kind::crashed: return "#6d597a";
    case outcome_kind::timeout: return "#e9c46a";
    case outcome_kind::invalid_result: return "#f4a261";
    case outcome_kind::cancelled: return "#adb5bd";
    case outcome_kind::internal_error: return "#495057";
  }
  return "#000";
}

std::string ramp(double t) {
  static const double stops[][3] = {{68, 1, 84}, {59, 82, 139}, {33, 145, 140}, {94, 201, 98}, {253, 231, 37}};
  t = std::clamp(std::isfinite(t) ? t : 0.0, 0.0, 1.0) * 4;
  const int i = std::min(3, static_cast<int>(t));
  const double f = t - i;
  char b[16];
  std::snprintf(b, sizeof b, "#%02x%02x%02x", static_cast<int>(stops[i][0] + f * (stops[i + 1][0] - stops[i][0])),
                static_cast<int>(stops[i][1] + f * (stops[i + 1][1] - stops[i][1])),
                static_cast<int>(stops[i][2] + f * (stops[i + 1][2] - stops[i][2])));
  return b;
}

double scale::operator()(double v) const {
  double x = log ? std::log10(std::max(v, 1e-300)) : v, l = log ? std::log10(lo) : lo, h = log ? std::log10(hi) : hi;
  if (h == l) return (a + b) / 2;
  return a + (x - l) / (h - l) * (b - a);
}

std::vector<double> scale::ticks() const {
  std::vector<double> t;
  if (!(hi > lo)) return {lo};
  if (log) {
    for (double d = std::floor(std::log10(lo)); d <= std::ceil(std::log10(hi)); ++d)
      if (const double v = std::pow(10.0, d); v >= lo * 0.999 && v <= hi * 1.001) t.push_back(v);
    if (t.size() >= 2) return t;
    return {lo, hi};
  }
  return ticks_every(round_step((hi - lo) / 5));
}

std::vector<double> scale::ticks_every(double step) const {
  if (integer) step = std::max(1.0, std::round(step));
  // A step below the precision of values this large (a range a few ulps wide) would not advance
  // `v`, and a huge count of steps is no axis: the ends instead.
  constexpr std::size_t most = 1000;
  const double first = std::ceil(lo / step - 1e-9) * step;
  if (!(step > 0) || !std::isfinite(first) || first + step == first || (hi - first) / step > static_cast<double>(most))
    return {lo, hi};
  std::vector<double> t;
  for (double v = first; v <= hi + step * 1e-9 && t.size() <= most; v += step)
    t.push_back(std::abs(v) < step * 1e-9 ? 0 : v);
  return t;
}

double scale::round_step(double raw) {
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  return raw / mag > 5 ? 10 * mag : raw / mag > 2 ? 5 * mag : raw / mag > 1 ? 2 * mag : mag;
}

std::string tick_label(double v) {
  const double a = std::abs(v);
  if (a != 0 && (a < 1e-3 || a >= 1e6)) {
    char b[32];
    std::snprintf(b, sizeof b, "%.2g", v);
    return b;
  }
  return num(v, 3);
}

std::vector<double> fitted_ticks(const scale& x) {
  const double width = std::abs(x.b - x.a);
  auto fits = [&](const std::vector<double>& t) {
    double need = 0;
    for (double v : t) need += static_cast<double>(tick_label(v).size()) * 6.0 + 10;
    return need <= width;
  };
  std::vector<double> t = x.ticks();
  if (x.log || !(x.hi > x.lo)) {
    while (!fits(t) && t.size() > 2) {
      std::vector<double> fewer;
      for (std::size_t i = 0; i < t.size(); i += 2) fewer.push_back(t[i]);
      t = fewer;
    }
    return t;
  }
  for (double step = scale::round_step((x.hi - x.lo) / 5); !fits(t) && t.size() > 2;) {
    step = scale::round_step(step * 1.5);
    std::vector<double> fewer = x.ticks_every(step);
    if (fewer.size() < 2) return {t.front(), t.back()};  // a step that wide leaves one: the ends instead
    t = std::move(fewer);
  }
  return t;
}

byte_axis::byte_axis(std::uint64_t top, double a, double b) {
  unit = top >= (4ULL << 30) ? double(1ULL << 30) : double(1ULL << 20);
  s = scale{0, std::max(1.0, double(top) * 1.08), a, b, false};
}

std::vector<double> byte_axis::ticks() const {
  const scale in_units{0, s.hi / unit, s.a, s.b, false};
  std::vector<double> out;
  for (double t : in_units.ticks()) out.push_back(t * unit);
  return out;
}

scale padded(double lo, double hi, double a, double b, bool log, bool integer) {
  if (!log && hi == lo) {
    lo -= std::abs(lo) * 0.1 + 0.5;
    hi += std::abs(hi) * 0.1 + 0.5;
  } else if (!log) {
    const double pad = (hi - lo) * 0.05;
    lo -= pad;
    hi += pad;
  } else if (hi == lo) {
    lo /= 2;
    hi *= 2;
  }
  return {lo, hi, a, b, log, integer};
}

void byte_ticks(std::ostringstream& o, const byte_axis& y, double left, double right) {
  for (double t : y.ticks())
    o << "<text x=\"" << px(left - 4) << "\" y=\"" << px(y(t) + 3) << "\" text-anchor=\"end\">"
      << bytes(static_cast<std::uint64_t>(t)) << "</text><line class=\"grid\" x1=\"" << px(left) << "\" x2=\""
      << px(right) << "\" y1=\"" << px(y(t)) << "\" y2=\"" << px(y(t)) << "\"/>";
}

void cap_line(std::ostringstream& o, const byte_axis& y, std::uint64_t cap, double left, double right) {
  o << "<line class=\"cap\" x1=\"" << px(left) << "\" x2=\"" << px(right) << "\" y1=\""
    << px(y(static_cast<double>(cap))) << "\" y2=\"" << px(y(static_cast<double>(cap)))
    << "\"/><text class=\"cap\" x=\"" << px(right - 4) << "\" y=\"" << px(y(static_cast<double>(cap)) - 4)
    << "\" text-anchor=\"end\">cap " << bytes(cap) << "</text>";
}

void axes(std::ostringstream& o, const scale& x, const scale& y, double top, double bottom, double left, double right,
          const std::string& xlabel, const std::string& ylabel) {
  o << "<g class=\"axis\"><line x1=\"" << px(left) << "\" y1=\"" << px(bottom) << "\" x2=\"" << px(right) << "\" y2=\""
    << px(bottom) << "\"/><line x1=\"" << px(left) << "\" y1=\"" << px(top) << "\" x2=\"" << px(left) << "\" y2=\""
    << px(bottom) << "\"/>";
  for (double t : y.ticks())
    o << "<text x=\"" << px(left - 4) << "\" y=\"" << px(y(t) + 3) << "\" text-anchor=\"end\">" << num(t, 3)
      << "</text>"
      << "<line class=\"grid\" x1=\"" << px(left) << "\" x2=\"" << px(right) << "\" y1=\"" << px(y(t)) << "\" y2=\""
      << px(y(t)) << "\"/>";
  if (!xlabel.empty()) {
    for (double t : fitted_ticks(x))
      o << "<text x=\"" << px(x(t)) << "\" y=\"" << px(bottom + 14) << "\" text-anchor=\"middle\">" << tick_label(t)
        << "</text>";
  }
  o << "<text x=\"" << px((left + right) / 2) << "\" y=\"" << px(bottom + 30)
    << "\" text-anchor=\"middle\" class=\"label\">" << esc(xlabel) << "</text><text transform=\"translate(12,"
    << px((top + bottom) / 2) << ") rotate(-90)\" text-anchor=\"middle\" class=\"label\">" << esc(ylabel)
    << "</text></g>";
}

}  // namespace isorun::html::svg
