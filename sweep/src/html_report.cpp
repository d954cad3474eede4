// The sweep report page: SVG drawn here, data for the table embedded as JSON, no dependencies.
#include "isorun/sweep/html_report.hpp"
#include "isorun/sweep/stop_rule.hpp"
#include "isorun/sweep/report_log.hpp"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <numeric>
#include <set>
#include <sstream>

#include "folder.hpp"
#include "isorun/runner/bounded_json.hpp"
#include "isorun/runner/errors.hpp"
#include "isorun/runner/printable.hpp"
#include "isorun/runner/unique_fd.hpp"
#include "isorun/runner/units.hpp"
#include "isorun/sweep/report.hpp"

namespace isorun::sweep {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// At most this many marks per chart: beyond, charts sample (scatter, lines) or merge (slots).
constexpr std::size_t max_points = 2000, max_lines = 800, max_bars = 4000, max_timelines = 8;

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

std::string num(double v, int digits = 4) {
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

constexpr const char* pruned_colour = "#cdb4db";  // stopped early: done, not a failure

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

// t in [0, 1] to a colour from dark blue (worst) to yellow (best), as viridis runs.
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

// A linear or log mapping of [lo, hi] onto [a, b] (pixels), for axes.
struct scale {
  double lo = 0, hi = 1, a = 0, b = 1;
  bool log = false;
  bool integer = false;  // ticks on whole numbers only
  [[nodiscard]] double operator()(double v) const {
    double x = log ? std::log10(std::max(v, 1e-300)) : v, l = log ? std::log10(lo) : lo, h = log ? std::log10(hi) : hi;
    if (h == l) return (a + b) / 2;
    return a + (x - l) / (h - l) * (b - a);
  }
  // About five round tick values within [lo, hi].
  [[nodiscard]] std::vector<double> ticks() const {
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
  // Ticks on the multiples of `step` within [lo, hi] (a linear scale).
  [[nodiscard]] std::vector<double> ticks_every(double step) const {
    if (integer) step = std::max(1.0, std::round(step));
    std::vector<double> t;
    for (double v = std::ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9; v += step)
      t.push_back(std::abs(v) < step * 1e-9 ? 0 : v);
    return t;
  }
  // The round step (1, 2 or 5 times a power of ten) at or above `raw`.
  [[nodiscard]] static double round_step(double raw) {
    const double mag = std::pow(10.0, std::floor(std::log10(raw)));
    return raw / mag > 5 ? 10 * mag : raw / mag > 2 ? 5 * mag : raw / mag > 1 ? 2 * mag : mag;
  }
};

// A tick's label: short, whatever the magnitude (1e-04 rather than 0.0001).
std::string tick_label(double v) {
  const double a = std::abs(v);
  if (a != 0 && (a < 1e-3 || a >= 1e6)) {
    char b[32];
    std::snprintf(b, sizeof b, "%.2g", v);
    return b;
  }
  return num(v, 3);
}

// Ticks along a horizontal axis whose labels do not overlap: the step grows (linear) or every
// other decade is kept (log) until the labels, at about 6 px a character and a gap, fit.
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

// A byte axis from 0 to `top`: its ticks fall on round MiB (or GiB) values.
struct byte_axis {
  scale s;       // in bytes
  double unit;   // bytes per tick unit
  explicit byte_axis(std::uint64_t top, double a, double b) {
    unit = top >= (4ULL << 30) ? double(1ULL << 30) : double(1ULL << 20);
    s = scale{0, std::max(1.0, double(top) * 1.08), a, b, false};
  }
  [[nodiscard]] double operator()(double bytes) const { return s(bytes); }
  [[nodiscard]] std::vector<double> ticks() const {
    const scale in_units{0, s.hi / unit, s.a, s.b, false};
    std::vector<double> out;
    for (double t : in_units.ticks()) out.push_back(t * unit);
    return out;
  }
};

scale padded(double lo, double hi, double a, double b, bool log, bool integer = false) {
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

// Parameter `name` of `r`, null where it has none: a journal's trials need not share their
// parameters (a crafted or damaged one, records of an older spec).
const json& param_of(const trial_record& r, const std::string& name) {
  static const json none;
  const auto it = r.params.find(name);
  return it == r.params.end() ? none : *it;
}

// Every `n`-th of `count` indices so at most `limit` remain, plus those `keep` says.
template <class Keep>
std::vector<std::size_t> sample(std::size_t count, std::size_t limit, Keep&& keep) {
  std::vector<std::size_t> out;
  const std::size_t stride = count <= limit ? 1 : (count + limit - 1) / limit;
  for (std::size_t i = 0; i < count; ++i)
    if (i % stride == 0 || keep(i)) out.push_back(i);
  return out;
}

std::optional<double> metric_value(const report_data& d, const trial_record& r) {
  if (r.kind != outcome_kind::success) return std::nullopt;
  if (d.metric.empty()) return r.wall_s;
  if (r.result.is_object() && r.result.contains(d.metric) && r.result[d.metric].is_number())
    return r.result[d.metric].get<double>();
  return std::nullopt;
}

// Higher is better, whatever the metric's goal (wall time, without a metric: shorter is better).
double goodness(const report_data& d, double m) { return !d.metric.empty() && d.maximize ? m : -m; }

std::string metric_label(const report_data& d) {
  return d.metric.empty() ? "wall time (s)" : d.metric + (d.maximize ? " (higher is better)" : " (lower is better)");
}

// Axes frame: y ticks on the left, x ticks (numeric or given labels) at the bottom.
void axes(std::ostringstream& o, const scale& x, const scale& y, double top, double bottom, double left, double right,
          const std::string& xlabel, const std::string& ylabel) {
  o << "<g class=\"axis\"><line x1=\"" << px(left) << "\" y1=\"" << px(bottom) << "\" x2=\"" << px(right) << "\" y2=\""
    << px(bottom) << "\"/><line x1=\"" << px(left) << "\" y1=\"" << px(top) << "\" x2=\"" << px(left) << "\" y2=\""
    << px(bottom) << "\"/>";
  for (double t : y.ticks())
    o << "<text x=\"" << px(left - 4) << "\" y=\"" << px(y(t) + 3) << "\" text-anchor=\"end\">" << num(t, 3) << "</text>"
      << "<line class=\"grid\" x1=\"" << px(left) << "\" x2=\"" << px(right) << "\" y1=\"" << px(y(t)) << "\" y2=\""
      << px(y(t)) << "\"/>";
  if (!xlabel.empty()) {
    for (double t : fitted_ticks(x))
      o << "<text x=\"" << px(x(t)) << "\" y=\"" << px(bottom + 14) << "\" text-anchor=\"middle\">" << tick_label(t)
        << "</text>";
  }
  o << "<text x=\"" << px((left + right) / 2) << "\" y=\"" << px(bottom + 30) << "\" text-anchor=\"middle\" class=\"label\">"
    << esc(xlabel) << "</text><text transform=\"translate(12," << px((top + bottom) / 2)
    << ") rotate(-90)\" text-anchor=\"middle\" class=\"label\">" << esc(ylabel) << "</text></g>";
}

// The metric against one parameter: points for a numeric one, a box per value otherwise.
std::string param_chart(const report_data& d, const param_axis& ax) {
  const double W = 420, H = 260, L = 56, R = W - 12, T = 12, B = H - 44;
  std::vector<std::pair<const trial_record*, double>> pts;
  for (const auto& r : d.records)
    if (auto m = metric_value(d, r)) pts.emplace_back(&r, *m);
  std::ostringstream o;
  o << "<figure class=\"chart\"><svg viewBox=\"0 0 " << W << " " << H << "\" width=\"" << W << "\" height=\"" << H << "\">";
  if (pts.empty()) {
    o << "<text x=\"20\" y=\"40\">no successful trial has the metric</text></svg></figure>";
    return o.str();
  }
  double ylo = pts[0].second, yhi = ylo;
  for (auto& p : pts) ylo = std::min(ylo, p.second), yhi = std::max(yhi, p.second);
  const scale y = padded(ylo, yhi, B, T, false);
  if (ax.numeric) {
    const scale x = padded(ax.lo, ax.hi, L, R, ax.log, ax.integer);
    axes(o, x, y, T, B, L, R, ax.name + (ax.log ? " (log)" : ""), metric_label(d));
    for (std::size_t i : sample(pts.size(), max_points, [](std::size_t) { return false; })) {
      const auto& [r, m] = pts[i];
      const json& v = param_of(*r, ax.name);
      if (!v.is_number()) continue;
      o << "<circle cx=\"" << px(x(v.get<double>())) << "\" cy=\"" << px(y(m)) << "\" r=\"3\"><title>" << esc(r->id) << ": "
        << esc(ax.name) << "=" << esc(v.dump()) << ", " << num(m) << "</title></circle>";
    }
  } else {
    axes(o, scale{0, 1, L, R}, y, T, B, L, R, "", metric_label(d));
    const double band = (R - L) / static_cast<double>(std::max<std::size_t>(1, ax.categories.size()));
    for (std::size_t c = 0; c < ax.categories.size(); ++c) {
      std::vector<double> v;
      for (auto& [r, m] : pts)
        if (value_text(param_of(*r, ax.name)) == ax.categories[c]) v.push_back(m);
      const double cx = L + band * (static_cast<double>(c) + 0.5);
      o << "<text x=\"" << px(cx) << "\" y=\"" << px(B + 14) << "\" text-anchor=\"middle\">" << esc(ax.categories[c]) << "</text>";
      if (v.empty()) continue;
      std::sort(v.begin(), v.end());
      auto q = [&](double f) { return v[static_cast<std::size_t>(f * static_cast<double>(v.size() - 1) + 0.5)]; };
      const double w = std::min(60.0, band * 0.6);
      o << "<g class=\"box\"><title>" << esc(ax.name) << "=" << esc(ax.categories[c]) << ": " << v.size()
        << " trials, median " << num(q(0.5)) << ", range " << num(v.front()) << " to " << num(v.back()) << "</title>"
        << "<line x1=\"" << px(cx) << "\" x2=\"" << px(cx) << "\" y1=\"" << px(y(v.front())) << "\" y2=\"" << px(y(v.back()))
        << "\"/><rect x=\"" << px(cx - w / 2) << "\" width=\"" << px(w) << "\" y=\"" << px(y(q(0.75))) << "\" height=\""
        << px(std::max(1.0, y(q(0.25)) - y(q(0.75)))) << "\"/><line class=\"median\" x1=\"" << px(cx - w / 2) << "\" x2=\""
        << px(cx + w / 2) << "\" y1=\"" << px(y(q(0.5))) << "\" y2=\"" << px(y(q(0.5))) << "\"/></g>";
    }
  }
  o << "</svg><figcaption>" << esc(metric_label(d)) << " by " << esc(ax.name) << "</figcaption></figure>";
  return o.str();
}

// All trials across all parameters, one line each, coloured by the metric.
std::string parallel_chart(const report_data& d) {
  std::vector<std::pair<const trial_record*, double>> pts;
  for (const auto& r : d.records)
    if (auto m = metric_value(d, r)) pts.emplace_back(&r, *m);
  if (pts.empty() || d.params.empty()) return "<p>Nothing to draw: no successful trial has the metric.</p>";
  double lo = pts[0].second, hi = lo;
  for (auto& p : pts) lo = std::min(lo, p.second), hi = std::max(hi, p.second);
  const std::size_t n = d.params.size() + 1;
  const double W = std::max(480.0, 140.0 * static_cast<double>(n)), H = 300, T = 24, B = H - 30, L = 60, R = W - 60;
  auto xpos = [&](std::size_t i) { return n == 1 ? (L + R) / 2 : L + (R - L) * static_cast<double>(i) / static_cast<double>(n - 1); };
  std::vector<scale> ys;
  for (const auto& ax : d.params)
    ys.push_back(ax.numeric ? padded(ax.lo, ax.hi, B, T, ax.log)
                            : scale{-0.5, static_cast<double>(ax.categories.size()) - 0.5, B, T, false});
  const scale my = padded(lo, hi, B, T, false);
  auto yof = [&](std::size_t i, const trial_record& r, double m) {
    if (i == d.params.size()) return my(m);
    const auto& ax = d.params[i];
    const json& v = param_of(r, ax.name);
    if (ax.numeric) return v.is_number() ? ys[i](v.get<double>()) : B;
    const auto at = std::find(ax.categories.begin(), ax.categories.end(), value_text(v));
    return ys[i](static_cast<double>(at - ax.categories.begin()));
  };
  // The best trials are always drawn (last, on top); the rest sampled.
  std::vector<std::size_t> order(pts.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return goodness(d, pts[a].second) < goodness(d, pts[b].second); });
  std::ostringstream o;
  o << "<svg viewBox=\"0 0 " << W << " " << H << "\" width=\"" << W << "\" height=\"" << H << "\" class=\"parallel\">";
  for (std::size_t k : sample(order.size(), max_lines, [&](std::size_t i) { return i + 50 >= order.size(); })) {
    const auto& [r, m] = pts[order[k]];
    const double t = hi > lo ? (m - lo) / (hi - lo) : 1;
    o << "<polyline stroke=\"" << ramp(goodness(d, 1) > 0 ? t : 1 - t) << "\" points=\"";
    for (std::size_t i = 0; i < n; ++i) o << px(xpos(i)) << "," << px(yof(i, *r, m)) << " ";
    o << "\"><title>" << esc(r->id) << ": " << num(m) << "</title></polyline>";
  }
  for (std::size_t i = 0; i < n; ++i) {
    const double x = xpos(i);
    o << "<g class=\"axis\"><line x1=\"" << px(x) << "\" x2=\"" << px(x) << "\" y1=\"" << px(T) << "\" y2=\"" << px(B) << "\"/>"
      << "<text x=\"" << px(x) << "\" y=\"" << px(T - 8) << "\" text-anchor=\"middle\" class=\"label\">"
      << esc(i == d.params.size() ? (d.metric.empty() ? "wall_s" : d.metric) : d.params[i].name) << "</text>";
    if (i < d.params.size() && !d.params[i].numeric) {
      for (std::size_t c = 0; c < d.params[i].categories.size(); ++c)
        o << "<text x=\"" << px(x + 4) << "\" y=\"" << px(ys[i](static_cast<double>(c)) + 3) << "\">"
          << esc(d.params[i].categories[c]) << "</text>";
    } else {
      const scale& s = i == d.params.size() ? my : ys[i];
      for (double t : s.ticks()) o << "<text x=\"" << px(x + 4) << "\" y=\"" << px(s(t) + 3) << "\">" << num(t, 3) << "</text>";
    }
    o << "</g>";
  }
  o << "</svg>";
  return o.str();
}

// Trials on slots over time, per run: packing and idle gaps. Past max_bars bars, each slot's
// busy time is merged into spans and only failures are drawn one by one.
// Every trial's reported metric against its step: pruned trials faded, the best drawn last
// (on top), the rule's rungs marked. At most max_curves trials (the best always among them).
std::string curves_chart(const report_data& d) {
  constexpr std::size_t max_curves = 400;
  const double W = 860, H = 340, L = 60, R = W - 14, T = 14, B = H - 44;
  std::map<std::string, const trial_record*> by_id;
  for (const auto& r : d.records) by_id[r.id] = &r;
  std::vector<std::pair<const std::string*, const std::vector<std::pair<std::int64_t, double>>*>> all;
  std::int64_t xhi = std::max<std::int64_t>(1, d.max_t);
  double ylo = INFINITY, yhi = -INFINITY;
  for (const auto& [id, c] : d.curves) {
    if (c.empty()) continue;
    all.emplace_back(&id, &c);
    for (const auto& [step, v] : c) {
      xhi = std::max(xhi, step);
      ylo = std::min(ylo, v), yhi = std::max(yhi, v);
    }
  }
  std::ostringstream o;
  o << "<figure class=\"chart curves\"><svg viewBox=\"0 0 " << W << " " << H << "\" width=\"" << W << "\" height=\"" << H << "\">";
  if (all.empty() || !(yhi >= ylo)) return o.str() + "<text x=\"20\" y=\"40\">no reports</text></svg></figure>";
  // The final value of each curve decides its order: worst first, best drawn last.
  auto final_of = [&](std::size_t i) { return goodness(d, all[i].second->back().second); };
  std::vector<std::size_t> order(all.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return final_of(a) < final_of(b); });
  if (order.size() > max_curves) {  // the best always kept, the rest sampled evenly
    std::vector<std::size_t> kept;
    for (std::size_t i : sample(order.size(), max_curves, [&](std::size_t k) { return k + 20 >= order.size(); }))
      kept.push_back(order[i]);
    order = std::move(kept);
  }
  const scale x = padded(0, static_cast<double>(xhi), L, R, false, true);
  const scale y = padded(ylo, yhi, B, T, false);
  axes(o, x, y, T, B, L, R, "step", metric_label(d));
  for (std::int64_t rung : d.rungs)
    o << "<line class=\"rung\" x1=\"" << px(x(static_cast<double>(rung))) << "\" x2=\"" << px(x(static_cast<double>(rung)))
      << "\" y1=\"" << px(T) << "\" y2=\"" << px(B) << "\"><title>rung at step " << rung << "</title></line>";
  for (std::size_t i : order) {
    const auto& [id, c] = all[i];
    const auto rec = by_id.find(*id);
    const bool pruned = rec != by_id.end() && rec->second->pruned;
    o << "<polyline class=\"" << (pruned ? "pruned" : "full") << "\" points=\"";
    for (const auto& [step, v] : *c) o << px(x(static_cast<double>(step))) << "," << px(y(v)) << " ";
    o << "\"><title>" << esc(*id) << (pruned ? " (pruned)" : "") << ": " << num(c->back().second) << " at step "
      << c->back().first << "</title></polyline>";
    if (pruned)  // where it was stopped (a trial stopped at its first report has no line)
      o << "<circle class=\"stop\" r=\"2.5\" cx=\"" << px(x(static_cast<double>(c->back().first))) << "\" cy=\""
        << px(y(c->back().second)) << "\"><title>" << esc(*id) << " pruned at step " << c->back().first << "</title></circle>";
  }
  o << "</svg><figcaption>" << all.size() << " trials" << (all.size() > order.size() ? ", " + std::to_string(order.size()) + " drawn" : "")
    << "</figcaption></figure>";
  return o.str();
}

std::string slots_chart(const report_data& d) {
  const auto bars = slot_intervals(d);
  if (bars.empty()) return "<p>No trial of this sweep recorded when it ran (journaled by an older isorun).</p>";
  std::ostringstream o;
  for (const auto& run : d.runs) {
    std::vector<const slot_interval*> mine;
    double span = 0;
    int slots = 0;
    for (const auto& b : bars)
      if (b.run == run.run) {
        mine.push_back(&b);
        span = std::max(span, b.end_s);
        slots = std::max(slots, b.slot + 1);
      }
    if (mine.empty()) continue;
    slots = std::max(slots, static_cast<int>(run.slots.size()));
    const double W = 900, row = slots > 40 ? 8 : 18, L = 190, R = W - 10, T = 8;
    const double H = T + row * slots + 40;
    const scale x{0, std::max(span, 1e-3), L, R};
    o << "<h3>Run " << run.run << ": " << mine.size() << " trials on " << slots << " slots, " << num(span, 3) << " s</h3>"
      << "<svg viewBox=\"0 0 " << W << " " << H << "\" width=\"" << W << "\" height=\"" << H << "\" class=\"gantt\">";
    for (int s = 0; s < slots; ++s) {
      std::string device = "slot " + std::to_string(s);
      for (const auto& [index, dev] : run.slots)
        if (index == s) device += " · " + (dev.size() > 18 ? dev.substr(0, 16) + "…" : dev);
      if (row >= 12)
        o << "<text x=\"" << px(L - 6) << "\" y=\"" << px(T + row * s + row * 0.68) << "\" text-anchor=\"end\">" << esc(device)
          << "</text>";
    }
    const bool merge = mine.size() > max_bars;
    if (merge) {
      std::map<int, std::vector<std::pair<double, double>>> busy;
      for (auto* b : mine) busy[b->slot].emplace_back(b->start_s, b->end_s);
      for (auto& [s, spans] : busy) {
        std::sort(spans.begin(), spans.end());
        std::vector<std::pair<double, double>> merged;
        for (auto sp : spans)
          if (!merged.empty() && sp.first <= merged.back().second + span * 1e-3) merged.back().second = std::max(merged.back().second, sp.second);
          else merged.push_back(sp);
        for (auto& [a, b] : merged)
          o << "<rect class=\"busy\" x=\"" << px(x(a)) << "\" width=\"" << px(std::max(0.5, x(b) - x(a))) << "\" y=\""
            << px(T + row * s + 1) << "\" height=\"" << px(row - 2) << "\"/>";
      }
    }
    for (auto* b : mine) {
      if (merge && b->kind == outcome_kind::success) continue;
      o << "<rect fill=\"" << outcome_colour(b->kind) << "\" x=\"" << px(x(b->start_s)) << "\" width=\""
        << px(std::max(0.5, x(b->end_s) - x(b->start_s))) << "\" y=\"" << px(T + row * b->slot + 1) << "\" height=\""
        << px(row - 2) << "\"><title>" << esc(b->id) << " (" << to_string(b->kind) << "): " << num(b->start_s, 4) << " to "
        << num(b->end_s, 4) << " s</title></rect>";
    }
    const double base = T + row * slots;
    o << "<g class=\"axis\"><line x1=\"" << px(L) << "\" x2=\"" << px(R) << "\" y1=\"" << px(base) << "\" y2=\"" << px(base) << "\"/>";
    for (double t : fitted_ticks(x))
      o << "<text x=\"" << px(x(t)) << "\" y=\"" << px(base + 14) << "\" text-anchor=\"middle\">" << tick_label(t) << "</text>";
    o << "<text x=\"" << px((L + R) / 2) << "\" y=\"" << px(base + 30) << "\" text-anchor=\"middle\" class=\"label\">seconds "
         "after the run started</text></g></svg>";
  }
  return o.str();
}

// Peak memory per trial against its cap, highest first.
std::string memory_chart(const report_data& d) {
  std::vector<const trial_record*> rs;
  std::uint64_t top = 0, cap = 0;
  for (const auto& r : d.records)
    if (r.peak_reserved || r.peak_allocated) {
      rs.push_back(&r);
      top = std::max({top, r.peak_reserved, r.mem_limit});
      cap = std::max(cap, r.mem_limit);
    }
  if (rs.empty()) return "<p>No trial reported device memory (the task used no allocator).</p>";
  std::stable_sort(rs.begin(), rs.end(), [](auto* a, auto* b) { return a->peak_reserved > b->peak_reserved; });
  const auto shown = sample(rs.size(), 400, [](std::size_t i) { return i == 0; });
  const double W = 900, H = 240, L = 70, R = W - 10, T = 10, B = H - 40;
  const byte_axis y(top, B, T);
  const double w = (R - L) / static_cast<double>(shown.size());
  std::ostringstream o;
  o << "<svg viewBox=\"0 0 " << W << " " << H << "\" width=\"" << W << "\" height=\"" << H << "\" class=\"peaks\">";
  o << "<g class=\"axis\">";
  for (double t : y.ticks())
    o << "<text x=\"" << px(L - 4) << "\" y=\"" << px(y(t) + 3) << "\" text-anchor=\"end\">" << bytes(static_cast<std::uint64_t>(t))
      << "</text><line class=\"grid\" x1=\"" << px(L) << "\" x2=\"" << px(R) << "\" y1=\"" << px(y(t)) << "\" y2=\"" << px(y(t)) << "\"/>";
  o << "<text x=\"" << px((L + R) / 2) << "\" y=\"" << px(B + 28) << "\" text-anchor=\"middle\" class=\"label\">trials, by peak reserved ("
    << rs.size() << (shown.size() < rs.size() ? ", sampled" : "") << ")</text></g>";
  for (std::size_t k = 0; k < shown.size(); ++k) {
    const trial_record& r = *rs[shown[k]];
    const double x0 = L + w * static_cast<double>(k);
    o << "<g><title>" << esc(r.id) << ": reserved " << bytes(r.peak_reserved) << ", allocated " << bytes(r.peak_allocated)
      << (r.mem_limit ? ", cap " + bytes(r.mem_limit) : std::string()) << "</title><rect class=\"reserved\" x=\"" << px(x0)
      << "\" width=\"" << px(std::max(0.5, w - 1)) << "\" y=\"" << px(y(static_cast<double>(r.peak_reserved))) << "\" height=\""
      << px(B - y(static_cast<double>(r.peak_reserved))) << "\"/><rect class=\"allocated\" x=\"" << px(x0) << "\" width=\""
      << px(std::max(0.5, w - 1)) << "\" y=\"" << px(y(static_cast<double>(r.peak_allocated))) << "\" height=\""
      << px(B - y(static_cast<double>(r.peak_allocated))) << "\"/></g>";
  }
  if (cap)
    o << "<line class=\"cap\" x1=\"" << px(L) << "\" x2=\"" << px(R) << "\" y1=\"" << px(y(static_cast<double>(cap)))
      << "\" y2=\"" << px(y(static_cast<double>(cap))) << "\"/><text class=\"cap\" x=\"" << px(R - 4) << "\" y=\""
      << px(y(static_cast<double>(cap)) - 4) << "\" text-anchor=\"end\">cap " << bytes(cap) << "</text>";
  o << "</svg><p class=\"legend\"><span class=\"swatch reserved\"></span>peak reserved <span class=\"swatch allocated\"></span>peak "
       "allocated</p>";
  return o.str();
}

// a + b, held at the ends of the range: a crafted timeline's sizes cannot overflow the counts
// drawn back from them (timeline_problem has checked each size is from 0 to 2^63-1).
std::int64_t plus(std::int64_t a, std::int64_t b) {
  std::int64_t r;
  if (__builtin_add_overflow(a, b, &r)) return b > 0 ? INT64_MAX : INT64_MIN;
  return r;
}

// One device's allocated and reserved bytes over the task's time, with the cap; and, after an
// OOM, what was live when it failed. `t` has passed timeline_problem.
std::string timeline_svg(const json& t) {
  std::ostringstream o;
  const std::int64_t start = t.value("start_ns", std::int64_t{0}), end = t.value("end_ns", start);
  for (const auto& dev : t.value("devices", json::array())) {
    const auto events = dev.value("events", json::array());
    const std::uint64_t cap = dev.value("cap", std::uint64_t{0});
    // The ring buffer may have dropped the oldest events: start from what the end counts imply.
    std::int64_t alloc = dev.value("allocated", std::int64_t{0}), res = dev.value("reserved", std::int64_t{0});
    for (const auto& e : events) {
      const std::string a = e.value("action", "");
      const std::int64_t n = e.value("size", std::int64_t{0});
      if (a == "alloc") alloc = plus(alloc, -n);
      else if (a == "free") alloc = plus(alloc, n);
      else if (a == "segment_alloc" || a == "map") res = plus(res, -n);
      else if (a == "segment_free" || a == "unmap") res = plus(res, n);
    }
    struct point {
      double ms;
      std::int64_t alloc, res;
    };
    std::vector<point> pts{{0, alloc, res}};
    std::vector<double> ooms;
    std::uint64_t top = cap;
    for (const auto& e : events) {
      const std::string a = e.value("action", "");
      const std::int64_t n = e.value("size", std::int64_t{0});
      const double ms = std::max(0.0, static_cast<double>(e.value("t_ns", start) - start) / 1e6);
      if (a == "alloc") alloc = plus(alloc, n);
      else if (a == "free") alloc = plus(alloc, -n);
      else if (a == "segment_alloc" || a == "map") res = plus(res, n);
      else if (a == "segment_free" || a == "unmap") res = plus(res, -n);
      else if (a == "oom") ooms.push_back(ms);
      pts.push_back({ms, alloc, res});
      top = std::max({top, static_cast<std::uint64_t>(std::max<std::int64_t>(0, res)), static_cast<std::uint64_t>(std::max<std::int64_t>(0, alloc))});
    }
    const double span = std::max(pts.back().ms, static_cast<double>(end - start) / 1e6);
    pts.push_back({span, alloc, res});
    const double W = 900, H = 220, L = 70, R = W - 10, T = 10, B = H - 36;
    const scale x{0, std::max(span, 1e-3), L, R};
    const byte_axis y(top, B, T);
    o << "<svg viewBox=\"0 0 " << W << " " << H << "\" width=\"" << W << "\" height=\"" << H << "\" class=\"timeline\">";
    o << "<g class=\"axis\">";
    for (double v : y.ticks())
      o << "<text x=\"" << px(L - 4) << "\" y=\"" << px(y(v) + 3) << "\" text-anchor=\"end\">" << bytes(static_cast<std::uint64_t>(v))
        << "</text><line class=\"grid\" x1=\"" << px(L) << "\" x2=\"" << px(R) << "\" y1=\"" << px(y(v)) << "\" y2=\"" << px(y(v)) << "\"/>";
    for (double v : fitted_ticks(x))
      o << "<text x=\"" << px(x(v)) << "\" y=\"" << px(B + 14) << "\" text-anchor=\"middle\">" << tick_label(v) << "</text>";
    o << "<text x=\"" << px((L + R) / 2) << "\" y=\"" << px(B + 30) << "\" text-anchor=\"middle\" class=\"label\">ms into the task"
      << (dev.value("index", -1) >= 0 ? " · GPU " + std::to_string(dev.value("index", -1)) : std::string(" · CPU")) << " · "
      << events.size() << " events</text></g>";
    // Step lines: a value holds until the next event. A command's timeline (the cap's view)
    // has what its processes held alone, drawn as reserved: no allocator's count of its own.
    const bool has_allocated = dev.contains("allocated");
    for (const char* which : {"reserved", "allocated"}) {
      if (!has_allocated && std::string(which) == "allocated") continue;
      o << "<polyline class=\"" << which << "\" points=\"";
      const std::size_t stride = pts.size() > 4 * max_points ? pts.size() / (4 * max_points) + 1 : 1;
      double prev_y = -1;
      for (std::size_t i = 0; i < pts.size(); i += (i + stride < pts.size() || i + 1 == pts.size()) ? stride : pts.size() - 1 - i) {
        const double v = static_cast<double>(std::string(which) == "reserved" ? pts[i].res : pts[i].alloc);
        if (prev_y >= 0) o << px(x(pts[i].ms)) << "," << px(prev_y) << " ";
        prev_y = y(std::max(0.0, v));
        o << px(x(pts[i].ms)) << "," << px(prev_y) << " ";
        if (i + 1 == pts.size()) break;
      }
      o << "\"/>";
    }
    if (cap)
      o << "<line class=\"cap\" x1=\"" << px(L) << "\" x2=\"" << px(R) << "\" y1=\"" << px(y(static_cast<double>(cap))) << "\" y2=\""
        << px(y(static_cast<double>(cap))) << "\"/><text class=\"cap\" x=\"" << px(R - 4) << "\" y=\""
        << px(y(static_cast<double>(cap)) - 4) << "\" text-anchor=\"end\">cap " << bytes(cap) << "</text>";
    for (double ms : ooms)
      o << "<line class=\"oom\" x1=\"" << px(x(ms)) << "\" x2=\"" << px(x(ms)) << "\" y1=\"" << px(T) << "\" y2=\"" << px(B)
        << "\"><title>out of memory at " << num(ms, 4) << " ms</title></line>";
    o << "</svg>";
  }
  bool allocator = false;
  for (const auto& dev : t.value("devices", json::array())) allocator = allocator || dev.contains("allocated");
  if (allocator)
    o << "<p class=\"legend\"><span class=\"swatch reserved\"></span>reserved <span class=\"swatch allocated\"></span>allocated "
         "<span class=\"swatch cap\"></span>cap</p>";
  else
    o << "<p class=\"legend\"><span class=\"swatch reserved\"></span>held by the command's processes "
         "<span class=\"swatch cap\"></span>cap</p>";
  if (t.contains("oom") && t["oom"].is_object() && t["oom"].contains("processes")) {
    // A command's: what each of its processes held on that device when the cap refused.
    const json& f = t["oom"];
    o << "<div class=\"oom\"><p><b>Out of memory:</b> a process asked for " << bytes(f.value("requested", std::uint64_t{0}))
      << " with " << bytes(f.value("reserved", std::uint64_t{0})) << " held of a cap of "
      << bytes(f.value("limit", std::uint64_t{0})) << ". Held at the refusal, by process, largest first"
      << (f.value("complete", true) ? "" : " (from the changes still kept: the oldest were dropped)") << ":</p>"
      << "<table class=\"live\"><tr><th>process</th><th>held</th><th>share of the cap</th></tr>";
    const double limit = static_cast<double>(std::max<std::uint64_t>(1, f.value("limit", std::uint64_t{1})));
    for (const auto& p : f["processes"]) {
      const std::uint64_t held = p.value("bytes", std::uint64_t{0});
      const double share = 100.0 * static_cast<double>(held) / limit;
      o << "<tr><td>" << p.value("pid", 0) << "</td><td>" << bytes(held) << "</td><td><span class=\"bar\" style=\"width:"
        << px(std::min(100.0, share)) << "px\"></span> " << num(share, 3) << "%</td></tr>";
    }
    o << "</table></div>";
  } else if (t.contains("oom") && t["oom"].is_object()) {
    const json& f = t["oom"];
    o << "<div class=\"oom\"><p><b>Out of memory:</b> asked for " << bytes(f.value("requested", std::uint64_t{0})) << " with "
      << bytes(f.value("allocated", std::uint64_t{0})) << " allocated and " << bytes(f.value("reserved", std::uint64_t{0}))
      << " reserved of a cap of " << bytes(f.value("limit", std::uint64_t{0})) << " (largest free cached block "
      << bytes(f.value("largest_free", std::uint64_t{0})) << "). Live allocations at the failure, by size, largest first:</p>"
      << "<table class=\"live\"><tr><th>allocations</th><th>together</th><th>share of the cap</th></tr>";
    // Allocations of one size are one row (a model's layers are many of the same size).
    std::map<std::uint64_t, std::uint64_t, std::greater<>> by_size;
    for (const auto& b : f.value("live", json::array()))
      if (b.is_number_unsigned()) ++by_size[b.get<std::uint64_t>()];
    const double limit = static_cast<double>(std::max<std::uint64_t>(1, f.value("limit", std::uint64_t{1})));
    for (const auto& [size, count] : by_size) {
      const double share = 100.0 * static_cast<double>(size) * static_cast<double>(count) / limit;
      o << "<tr><td>" << count << " &times; " << bytes(size) << "</td><td>" << bytes(size * count)
        << "</td><td><span class=\"bar\" style=\"width:" << px(std::min(100.0, share)) << "px\"></span> " << num(share, 3)
        << "%</td></tr>";
    }
    o << "</table></div>";
  }
  return o.str();
}

const char* style = R"(
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1100px;color:#222;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
h3{font-size:14px;margin:14px 0 4px;color:#444}
.sub{color:#666}.cards{display:flex;flex-wrap:wrap;gap:10px;margin:12px 0}
.card{border:1px solid #ddd;border-radius:6px;padding:8px 12px;min-width:110px}.card b{display:block;font-size:18px}
.charts{display:flex;flex-wrap:wrap;gap:8px}figure{margin:0}figcaption{font-size:12px;color:#555;text-align:center}
svg text{font-size:10px;fill:#444}svg .label{font-size:11px;fill:#222}
.axis line{stroke:#888}.grid{stroke:#eee!important}circle{fill:#264653;fill-opacity:.55}
.box rect{fill:#a8dadc;stroke:#1d3557}.box line{stroke:#1d3557}.box .median{stroke-width:2}
.parallel polyline{fill:none;stroke-opacity:.55;stroke-width:1.2}.parallel polyline:hover{stroke-width:3;stroke-opacity:1}
.gantt rect:hover,.peaks g:hover rect{stroke:#000}.busy{fill:#8ab17d}
.reserved{fill:#bcd4e6;stroke:#457b9d}.allocated{fill:#457b9d;stroke:#1d3557}
polyline.reserved{fill:none;stroke:#7fa7c9;stroke-width:1.5}polyline.allocated{fill:none;stroke:#1d3557;stroke-width:1.5}
line.cap{stroke:#c1121f;stroke-dasharray:6 3;stroke-width:1.5}text.cap{fill:#c1121f}line.oom{stroke:#9b2226;stroke-width:2}
.legend{font-size:12px;color:#555}.swatch{display:inline-block;width:12px;height:10px;margin:0 4px 0 10px;vertical-align:middle}
.swatch.reserved{background:#bcd4e6}.swatch.allocated{background:#457b9d}.swatch.cap{background:#c1121f;height:2px}
table{border-collapse:collapse;font-size:12px}th,td{border-bottom:1px solid #eee;padding:3px 8px;text-align:left;white-space:nowrap}
th{cursor:pointer;background:#f6f6f6;position:sticky;top:0}th.sorted-asc:after{content:" ▲"}th.sorted-desc:after{content:" ▼"}
td.num{text-align:right;font-variant-numeric:tabular-nums}td.err{white-space:normal;max-width:360px;color:#9b2226}
.outcome{display:inline-block;width:9px;height:9px;border-radius:2px;margin-right:5px}
.tablewrap{overflow-x:auto;max-height:620px;overflow-y:auto;border:1px solid #ddd}
.pager{margin:6px 0}.pager button{margin-right:6px}.oom{background:#fff5f5;border:1px solid #f1c0c0;padding:6px 10px;margin:6px 0}
.bar{display:inline-block;height:8px;background:#9b2226;vertical-align:middle}
.curves polyline{fill:none;stroke-width:1.2}.curves .full{stroke:#264653;stroke-opacity:.8}
.curves .pruned{stroke:#adb5bd;stroke-opacity:.35}.curves circle.stop{fill:#9d8189;fill-opacity:.5}.curves polyline:hover{stroke-width:3;stroke-opacity:1}
line.rung{stroke:#e76f51;stroke-dasharray:4 3}
)";

// Sorting and paging of the table, whose rows are the JSON in #trials-data. Marks the page
// ready when done, so a headless browser (and its test) can tell the script ran.
const char* script = R"(
(function(){
  var data = JSON.parse(document.getElementById('trials-data').textContent);
  var cols = data.columns, rows = data.rows, page = 0, size = 50, key = -1, dir = 1;
  var thead = document.querySelector('#trials thead tr'), tbody = document.querySelector('#trials tbody');
  var info = document.getElementById('page-info');
  cols.forEach(function(c, i){
    var th = document.createElement('th'); th.textContent = c.name;
    th.onclick = function(){ dir = key === i ? -dir : 1; key = i; page = 0; sort(); draw(); };
    thead.appendChild(th);
  });
  function cmp(a, b){
    if (a === null || a === undefined) return 1; if (b === null || b === undefined) return -1;
    if (typeof a === 'number' && typeof b === 'number') return a - b;
    return String(a).localeCompare(String(b));
  }
  function sort(){
    rows.sort(function(a, b){ return dir * cmp(a[key], b[key]); });
    Array.prototype.forEach.call(thead.children, function(th, i){
      th.className = i === key ? (dir > 0 ? 'sorted-asc' : 'sorted-desc') : '';
    });
  }
  function draw(){
    var pages = Math.max(1, Math.ceil(rows.length / size));
    page = Math.min(Math.max(page, 0), pages - 1);
    tbody.textContent = '';
    rows.slice(page * size, page * size + size).forEach(function(r){
      var tr = document.createElement('tr');
      cols.forEach(function(c, i){
        var td = document.createElement('td'), v = r[i];
        if (c.kind === 'outcome') {
          var s = document.createElement('span'); s.className = 'outcome'; s.style.background = data.colours[v] || '#000';
          td.appendChild(s); td.appendChild(document.createTextNode(v));
        } else if (c.kind === 'bytes' && typeof v === 'number') {
          td.textContent = (v / 1048576).toFixed(1) + ' MiB'; td.className = 'num';
        } else if (typeof v === 'number') {
          td.textContent = Number.isInteger(v) ? String(v) : v.toPrecision(5); td.className = 'num';
        } else {
          td.textContent = v === null || v === undefined ? '' : (typeof v === 'string' ? v : JSON.stringify(v));
          if (c.kind === 'error') td.className = 'err';
        }
        tr.appendChild(td);
      });
      tbody.appendChild(tr);
    });
    info.textContent = rows.length + ' trials; page ' + (page + 1) + ' of ' + pages;
  }
  document.getElementById('prev').onclick = function(){ page--; draw(); };
  document.getElementById('next').onclick = function(){ page++; draw(); };
  if (data.sort >= 0) { key = data.sort; dir = data.dir; sort(); }
  draw();
  document.body.setAttribute('data-ready', 'yes');
})();
)";

// The table's data: the columns of results.csv (mem_limit: the cap the trial finally needed), plus
// the peak against the cap.
json table_data(const report_data& d) {
  const result_columns columns = columns_of(d.records);
  json cols = json::array({{{"name", "id"}}, {{"name", "outcome"}, {"kind", "outcome"}}, {{"name", "attempts"}},
                           {{"name", "wall_s"}}, {{"name", "device"}}, {{"name", "peak_reserved"}, {"kind", "bytes"}},
                           {{"name", "mem_limit"}, {"kind", "bytes"}}, {{"name", "peak/cap"}}});
  for (const auto& h : columns.headers) cols.push_back({{"name", h}});
  cols.push_back({{"name", "error"}, {"kind", "error"}});
  json rows = json::array();
  for (const auto& r : d.records) {
    json row = {r.id, std::string(outcome_name(r)), r.attempts, r.wall_s, r.device, r.peak_reserved, r.mem_limit,
                r.mem_limit ? json(static_cast<double>(r.peak_reserved) / static_cast<double>(r.mem_limit)) : json()};
    for (auto& v : columns.values(r)) row.push_back(std::move(v));
    row.push_back(r.error);
    rows.push_back(std::move(row));
  }
  json colours = json::object();
  for (auto k : all_outcome_kinds) colours[std::string(to_string(k))] = outcome_colour(k);
  colours["pruned"] = pruned_colour;
  int sort_col = -1;
  if (!d.metric.empty())
    for (std::size_t i = 0; i < cols.size(); ++i)
      if (cols[i]["name"] == d.metric) sort_col = static_cast<int>(i);
  return {{"columns", cols}, {"rows", rows}, {"colours", colours}, {"sort", sort_col}, {"dir", d.maximize ? -1 : 1}};
}

// A JSON text safe inside <script>, whatever its strings hold: '<', '>' and '&' as \u escapes,
// so that no "</script" ends the element and no "<!--" with "<script" switches the parser into
// its escaped states (which would swallow the rest of the page); U+2028 and U+2029 as escapes,
// so the text is JavaScript too. JSON.parse reads it back unchanged. (Outside strings dump()
// writes none of these.)
std::string script_json(const json& j) {
  const std::string s = j.dump();
  std::string o;
  o.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<') o += "\\u003c";
    else if (s[i] == '>') o += "\\u003e";
    else if (s[i] == '&') o += "\\u0026";
    else if (s.compare(i, 3, "\xe2\x80\xa8") == 0) o += "\\u2028", i += 2;
    else if (s.compare(i, 3, "\xe2\x80\xa9") == 0) o += "\\u2029", i += 2;
    else o += s[i];
  }
  return o;
}

// sweep.json is small; anything near this is not one isorun wrote.
constexpr std::size_t max_identity = std::size_t{64} << 20;
// A timeline holds the allocator's history (history:N events); this is far beyond any.
constexpr std::size_t max_timeline = std::size_t{256} << 20;

// A trial id as trial_id() makes them: the only names a timeline file is looked up by.
bool is_trial_id(const std::string& id) {
  return id.size() == 16 && std::all_of(id.begin(), id.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); });
}

// The memory timeline `name` in `dir` (shown as `shown`), checked; null if there is none.
// @throws std::exception saying what is wrong with it.
json read_timeline(int dir, const std::string& name, const fs::path& shown) {
  const unique_fd fd = detail::open_file(dir, name, O_RDONLY, shown);
  if (!fd) return json();
  json t = parse_bounded_json(detail::read_all(fd.get(), max_timeline, shown));
  const std::string problem = t.is_discarded() ? "it is not JSON (cut short?)" : timeline_problem(t);
  if (!problem.empty()) throw std::runtime_error(shown.string() + " is not a memory timeline: " + problem);
  return t;
}

// The timelines shown for `d` (see report_data::timelines), read from `out`/logs: failures
// first, then the best; a file that cannot be read, or is not a timeline, is skipped with a
// warning and the next one is shown in its place.
void load_timelines(report_data& d, int out) {
  const fs::path logs_shown = fs::path(d.out) / "logs";
  unique_fd logs;
  try {
    logs = detail::open_subfolder(out, "logs", false, logs_shown);
  } catch (const usage_error& e) {
    d.warnings.push_back(std::string(e.what()) + "; no memory timelines in the report");
    return;
  }
  if (!logs) return;
  std::vector<std::size_t> with;
  for (std::size_t i = 0; i < d.records.size(); ++i) {
    const trial_record& r = d.records[i];
    struct stat st {};
    if (!r.timeline.empty() && is_trial_id(r.id) &&
        ::fstatat(logs.get(), detail::timeline_file(r.id, r.attempts).c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0)
      with.push_back(i);
  }
  d.timelines_kept = with.size();
  std::stable_sort(with.begin(), with.end(), [&](std::size_t ia, std::size_t ib) {
    const trial_record &a = d.records[ia], &b = d.records[ib];
    const bool oa = a.kind == outcome_kind::out_of_memory, ob = b.kind == outcome_kind::out_of_memory;
    if (oa != ob) return oa;
    auto ma = metric_value(d, a), mb = metric_value(d, b);
    if (ma.has_value() != mb.has_value()) return ma.has_value();
    return ma && goodness(d, *ma) > goodness(d, *mb);
  });
  for (std::size_t i : with) {
    if (d.timelines.size() == max_timelines) break;
    const std::string name = detail::timeline_file(d.records[i].id, d.records[i].attempts);
    try {
      if (json t = read_timeline(logs.get(), name, logs_shown / name); !t.is_null()) d.timelines.emplace_back(i, std::move(t));
    } catch (const std::exception& e) {
      d.warnings.push_back(std::string(e.what()) + "; left out of the report");
    }
  }
}

// Whether the distinct values are spaced more evenly by ratio than by difference (a grid made
// with scale: log, or by hand as 0.01, 0.055, 0.3); two values, a decade apart or more, count.
bool spaced_by_ratio(const std::vector<json>& values) {
  std::vector<double> v;
  for (const auto& j : values) v.push_back(j.get<double>());
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  if (v.size() < 3) return true;
  // How unevenly spaced: the spread of the gaps relative to their mean.
  auto unevenness = [&](auto&& f) {
    std::vector<double> gaps;
    for (std::size_t i = 1; i < v.size(); ++i) gaps.push_back(f(v[i]) - f(v[i - 1]));
    double mean = 0, var = 0;
    for (double g : gaps) mean += g / static_cast<double>(gaps.size());
    for (double g : gaps) var += (g - mean) * (g - mean) / static_cast<double>(gaps.size());
    return std::sqrt(var) / mean;
  };
  return unevenness([](double x) { return std::log(x); }) < unevenness([](double x) { return x; });
}

}  // namespace

std::vector<std::string> axis_tick_labels(const param_axis& axis, double width_px) {
  std::vector<std::string> out;
  if (!axis.numeric) return out;
  for (double t : fitted_ticks(padded(axis.lo, axis.hi, 0, width_px, axis.log, axis.integer))) out.push_back(tick_label(t));
  return out;
}

param_axis axis_for(const std::string& name, const std::vector<json>& values) {
  param_axis ax;
  ax.name = name;
  ax.numeric = !values.empty() && std::all_of(values.begin(), values.end(), [](const json& v) { return v.is_number(); });
  if (ax.numeric) {
    ax.lo = ax.hi = values.front().get<double>();
    for (const auto& v : values) ax.lo = std::min(ax.lo, v.get<double>()), ax.hi = std::max(ax.hi, v.get<double>());
    ax.integer = std::all_of(values.begin(), values.end(), [](const json& v) {
      return v.is_number_integer() || (v.is_number_float() && v.get<double>() == std::floor(v.get<double>()));
    });
    ax.log = ax.lo > 0 && ax.hi / ax.lo >= 10 && spaced_by_ratio(values);  // (one value: hi == lo, no log)
    return ax;
  }
  for (const auto& v : values)
    if (const std::string w = value_text(v); std::find(ax.categories.begin(), ax.categories.end(), w) == ax.categories.end())
      ax.categories.push_back(w);
  return ax;
}

std::vector<slot_interval> slot_intervals(const report_data& d) {
  std::map<int, std::size_t> slots_of;  // run -> its slots, as sweep.json lists them
  for (const auto& run : d.runs) slots_of[run.run] = run.slots.size();
  std::vector<slot_interval> out;
  for (const auto& r : d.records) {
    const auto run = slots_of.find(r.run);
    if (r.run > 0 && run != slots_of.end() && r.slot >= 0 && static_cast<std::size_t>(r.slot) < run->second)
      out.push_back({r.run, r.slot, r.start_s, r.start_s + r.wall_s, r.id, r.kind});
  }
  std::sort(out.begin(), out.end(), [](const slot_interval& a, const slot_interval& b) {
    return std::tie(a.run, a.slot, a.start_s) < std::tie(b.run, b.slot, b.start_s);
  });
  return out;
}

// The learning curves from OUT/reports.jsonl: the metric (else the first numeric field) by
// step, a trial's last report of a step counting, each curve thinned to max_curve_points.
void load_curves(report_data& d, const fs::path& out) {
  constexpr std::size_t max_curve_points = 300;
  std::map<std::string, std::map<std::int64_t, double>> by_step;
  for (const auto& r : report_log::read(out)) {
    std::optional<double> v;
    if (!d.metric.empty()) {
      if (const auto it = r.metrics.find(d.metric); it != r.metrics.end() && it->is_number()) v = it->get<double>();
    } else {
      for (const auto& [k, x] : r.metrics.items())
        if (x.is_number()) {
          v = x.get<double>();
          break;
        }
    }
    if (v && std::isfinite(*v)) by_step[r.trial][r.step] = *v;
  }
  for (auto& [id, steps] : by_step) {
    auto& c = d.curves[id];
    const std::size_t every = steps.size() / max_curve_points + 1;
    std::size_t k = 0;
    for (const auto& [step, v] : steps)
      if (k++ % every == 0 || k == steps.size()) c.emplace_back(step, v);
  }
}

report_data load_report_data(const fs::path& out) {
  const fs::path identity_file = out / "sweep.json", journal_file = out / "results.jsonl";
  const unique_fd dir = detail::open_folder(out);
  const unique_fd identity_fd = dir ? detail::open_file(dir.get(), "sweep.json", O_RDONLY, identity_file) : unique_fd();
  const unique_fd journal_fd = dir ? detail::open_file(dir.get(), "results.jsonl", O_RDONLY, journal_file) : unique_fd();
  const json identity =
      identity_fd ? parse_bounded_json(detail::read_all(identity_fd.get(), max_identity, identity_file)) : json();
  if (!identity.is_object() || !journal_fd)
    throw usage_error(out.string() + " is not a sweep's output folder (it has no sweep.json and results.jsonl); "
                      "give the folder a sweep wrote (its --out)");
  report_data d;
  d.out = out.string();
  // sweep.json as a damaged or crafted folder may hold it: what has the wrong type is taken as
  // absent.
  auto text = [](const json& o, const char* key) {
    const auto it = o.find(key);
    return it != o.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  auto number = [](const json& o, const char* key) {
    const auto it = o.find(key);
    return it != o.end() && it->is_number() ? it->get<double>() : 0.0;
  };
  auto whole = [](const json& o, const char* key) -> std::int64_t {  // from 0 to 2^31-1
    const auto it = o.find(key);
    if (it == o.end() || !it->is_number_integer()) return 0;
    if (it->is_number_unsigned()) return std::min<std::uint64_t>(it->get<std::uint64_t>(), INT32_MAX);
    return std::clamp<std::int64_t>(it->get<std::int64_t>(), 0, INT32_MAX);
  };
  d.subject = text(identity, "subject").empty() ? text(identity, "task") : text(identity, "subject");
  if (const auto m = identity.find("metric"); m != identity.end() && m->is_object()) {
    d.metric = text(*m, "name");
    if (const auto max = m->find("maximize"); max != m->end() && max->is_boolean()) d.maximize = max->get<bool>();
  }
  if (const auto runs = identity.find("runs"); runs != identity.end() && runs->is_array())
    for (const auto& r : *runs) {
      if (!r.is_object()) continue;
      const auto limit = r.find("mem_limit");
      run_info run{.run = static_cast<int>(whole(r, "run")), .slots = {},
                   .mem_limit = limit != r.end() && limit->is_number_unsigned() ? limit->get<std::uint64_t>() : 0,
                   .wall_s = number(r, "wall_s")};
      if (const auto slots = r.find("slots"); slots != r.end() && slots->is_array())
        for (const auto& s : *slots)
          if (s.is_object()) run.slots.emplace_back(static_cast<int>(whole(s, "index")), text(s, "device"));
      d.runs.push_back(std::move(run));
    }
  // Read only, never repaired: a sweep may be writing to it now. A line that is not a record
  // (one being written, or cut short) is left out; a trial's last record counts.
  std::map<std::string, std::size_t> at;
  detail::for_each_line(journal_fd.get(), journal::max_line, journal_file, [&](std::string_view line, int, bool too_long) {
    if (too_long) return;
    const json rec = parse_bounded_json(line);
    if (!rec.is_object()) return;
    try {
      trial_record r = trial_record::from_json(rec);
      if (auto it = at.find(r.id); it != at.end()) d.records[it->second] = std::move(r);
      else {
        at[r.id] = d.records.size();
        d.records.push_back(std::move(r));
      }
    } catch (const std::exception&) {
    }
  });
  for (const auto& r : d.records) ++d.outcomes[std::string(outcome_name(r))];
  std::map<std::string, std::vector<json>> values;
  std::vector<std::string> names;
  for (const auto& r : d.records)
    for (auto it = r.params.begin(); it != r.params.end(); ++it) {
      if (!values.count(it.key())) names.push_back(it.key());
      values[it.key()].push_back(it.value());
    }
  for (const auto& n : names) {
    std::set<std::string> distinct;
    for (const auto& v : values[n]) distinct.insert(v.dump());
    if (distinct.size() > 1) d.params.push_back(axis_for(n, values[n]));  // a constant says nothing
  }
  if (const auto e = identity.find("scheduler"); e != identity.end() && e->is_object()) {
    d.scheduler = text(*e, "type");
    d.max_t = whole(*e, "max_t");
    d.rungs = stop_rule_rungs(early_stopping_from_json(*e));  // the rule's own (an unknown one: none)
    if (d.rungs.size() > 64) d.rungs.resize(64);
  }
  load_curves(d, out);
  load_timelines(d, dir.get());
  return d;
}

std::string render_report(const report_data& d) {
  std::ostringstream o;
  double wall = 0;
  std::size_t slots = 0;
  std::set<std::string> gpus;
  for (const auto& r : d.runs) {
    wall += r.wall_s;
    slots = std::max(slots, r.slots.size());
    for (const auto& [i, dev] : r.slots)
      if (dev != "cpu") {
        std::size_t at = 0;
        for (std::size_t comma; (comma = dev.find(',', at)) != std::string::npos; at = comma + 1) gpus.insert(dev.substr(at, comma - at));
        gpus.insert(dev.substr(at));
      }
  }
  o << "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width\">"
    << "<title>isorun sweep: " << esc(d.subject) << "</title><style>" << style << "</style></head><body>";
  o << "<section id=\"summary\"><h1>Sweep: " << esc(d.subject) << "</h1><p class=\"sub\">" << esc(d.out) << " · "
    << d.records.size() << " trials journaled · " << d.runs.size() << " run" << (d.runs.size() == 1 ? "" : "s") << "</p>";
  o << "<div class=\"cards\">";
  auto card = [&](const std::string& title, const std::string& value, const char* colour = nullptr) {
    o << "<div class=\"card\"" << (colour ? std::string(" style=\"border-left:4px solid ") + colour + "\"" : "") << ">" << esc(title)
      << "<b>" << esc(value) << "</b></div>";
  };
  for (const auto& [k, n] : d.outcomes)
    card(k, std::to_string(n),
         k == "pruned" ? pruned_colour : outcome_colour(outcome_kind_named(k).value_or(outcome_kind::internal_error)));
  if (d.max_t > 0 && !d.records.empty()) {
    // The share of the full budget (every trial to max_t) that early stopping let the sweep use.
    std::uint64_t steps = 0;
    for (const auto& r : d.records) steps += r.step > 0 ? static_cast<std::uint64_t>(r.step) : 0;
    const double full = static_cast<double>(d.records.size()) * static_cast<double>(d.max_t);
    card("budget used", num(100.0 * static_cast<double>(steps) / full, 3) + "% (" + std::to_string(steps) + " of " +
                            num(full, 12) + " steps)");
  }
  card("wall time", num(wall, 4) + " s");
  card("slots", std::to_string(slots));
  card("GPUs", gpus.empty() ? "none (CPU)" : std::to_string(gpus.size()));
  if (!d.runs.empty() && d.runs.back().mem_limit) {
    // Trials retried at larger caps after running out of memory: how many, and the largest cap.
    const std::uint64_t cap = d.runs.back().mem_limit;
    std::size_t larger = 0;
    std::uint64_t largest = cap;
    for (const auto& r : d.records)
      if (r.mem_limit > cap) {
        ++larger;
        largest = std::max(largest, r.mem_limit);
      }
    card("cap per trial", bytes(cap) + (larger ? " (" + std::to_string(larger) + " trial" + (larger == 1 ? "" : "s") +
                                                     " retried at larger caps, up to " + bytes(largest) + ")"
                                               : std::string()));
  }
  std::optional<double> best;
  const trial_record* best_trial = nullptr;
  for (const auto& r : d.records)
    if (auto m = metric_value(d, r); m && (!best || goodness(d, *m) > goodness(d, *best))) {
      best = m;
      best_trial = &r;
    }
  if (best) card("best " + (d.metric.empty() ? std::string("wall_s") : d.metric), num(*best, 5) + " (" + best_trial->id + ")");
  o << "</div></section>";

  o << "<section id=\"params\"><h2>" << esc(d.metric.empty() ? "Wall time" : d.metric) << " by parameter</h2>";
  if (d.params.empty()) o << "<p>Every trial has the same parameters.</p>";
  o << "<div class=\"charts\">";
  for (const auto& ax : d.params) o << param_chart(d, ax);
  o << "</div></section>";
  o << "<section id=\"parallel\"><h2>All trials, all parameters</h2><p class=\"sub\">One line per successful trial, coloured by "
    << esc(d.metric.empty() ? "wall time (short is bright)" : d.metric + " (best is bright)") << ".</p>" << parallel_chart(d)
    << "</section>";
  if (!d.curves.empty())
    o << "<section id=\"curves\"><h2>Learning curves</h2><p class=\"sub\">" << esc(d.metric.empty() ? "the first metric" : d.metric)
      << " against the step each trial reported, one line per trial" << (d.scheduler.empty() ? "" : "; pruned trials faded")
      << (d.rungs.empty() ? "" : "; dashed: the rungs where ASHA decides") << ".</p>" << curves_chart(d) << "</section>";
  o << "<section id=\"table\"><h2>Trials</h2><div class=\"pager\"><button id=\"prev\">previous</button><button id=\"next\">next"
       "</button><span id=\"page-info\"></span></div><div class=\"tablewrap\"><table id=\"trials\"><thead><tr></tr></thead><tbody>"
       "</tbody></table></div></section>";
  o << "<section id=\"slots\"><h2>Slots over time</h2><p class=\"sub\">Each bar a trial on its slot, coloured by outcome; gaps "
       "are idle slots.</p>"
    << slots_chart(d) << "</section>";
  o << "<section id=\"memory\"><h2>Device memory against the cap</h2>" << memory_chart(d) << "</section>";

  // Memory timelines: the trials that ran out of memory first, then the best.
  if (!d.timelines.empty()) {
    o << "<section id=\"timelines\"><h2>Memory timelines</h2><p class=\"sub\">" << d.timelines_kept
      << " trials kept a memory timeline (a task's allocator with history:N in alloc_conf; a command, what its cap "
         "saw); " << d.timelines.size()
      << " shown, failures first.</p>";
    for (const auto& [i, timeline] : d.timelines) {
      const trial_record& r = d.records[i];
      std::string desc;
      for (const auto& w : param_words(r.params)) desc += (desc.empty() ? "" : " ") + w;
      o << "<h3>" << esc(r.id) << " · " << outcome_name(r) << " · " << esc(desc) << "</h3>" << timeline_svg(timeline);
    }
    o << "</section>";
  }
  o << "<script type=\"application/json\" id=\"trials-data\">" << script_json(table_data(d)) << "</script><script>" << script
    << "</script></body></html>\n";
  return o.str();
}

void write_report(const fs::path& out) {
  const report_data d = load_report_data(out);
  for (const auto& w : d.warnings) std::fprintf(stderr, "isorun: warning: %s\n", printable(w).c_str());
  write_file_durably(out / "report.html", render_report(d));
}

std::string timeline_problem(const json& t) {
  if (!t.is_object()) return "it is not a JSON object";
  // Absent, or a whole number from 0 to 2^63-1 (what times, sizes and counts are).
  auto count = [](const json& o, const char* key) {
    const auto it = o.find(key);
    if (it == o.end()) return true;
    if (it->is_number_unsigned()) return it->get<std::uint64_t>() <= INT64_MAX;
    return it->is_number_integer() && it->get<std::int64_t>() >= 0;
  };
  for (const char* k : {"start_ns", "end_ns"})
    if (!count(t, k)) return std::string(k) + " is not a time in ns";
  if (const auto devices = t.find("devices"); devices != t.end()) {
    if (!devices->is_array()) return "devices is not a list";
    for (std::size_t i = 0; i < devices->size(); ++i) {
      const json& dev = (*devices)[i];
      const std::string where = "devices[" + std::to_string(i) + "]";
      if (!dev.is_object()) return where + " is not an object";
      for (const char* k : {"cap", "allocated", "reserved"})
        if (!count(dev, k)) return where + "." + k + " is not a number of bytes";
      if (const auto index = dev.find("index"); index != dev.end()) {
        const bool ok = index->is_number_unsigned() ? index->get<std::uint64_t>() <= INT32_MAX
                                                    : index->is_number_integer() && index->get<std::int64_t>() >= -1 &&
                                                          index->get<std::int64_t>() <= INT32_MAX;
        if (!ok) return where + ".index is not a GPU index";
      }
      const auto events = dev.find("events");
      if (events == dev.end()) continue;
      if (!events->is_array()) return where + ".events is not a list";
      for (std::size_t k = 0; k < events->size(); ++k) {
        const json& e = (*events)[k];
        const std::string at = where + ".events[" + std::to_string(k) + "]";
        if (!e.is_object()) return at + " is not an object";
        if (const auto a = e.find("action"); a != e.end() && !a->is_string()) return at + ".action is not a word";
        if (!count(e, "size")) return at + ".size is not a number of bytes";
        if (!count(e, "t_ns")) return at + ".t_ns is not a time in ns";
      }
    }
  }
  if (const auto oom = t.find("oom"); oom != t.end() && oom->is_object()) {
    for (const char* k : {"requested", "limit", "reserved", "allocated", "largest_free"})
      if (!count(*oom, k)) return std::string("oom.") + k + " is not a number of bytes";
    if (const auto live = oom->find("live"); live != oom->end()) {
      if (!live->is_array()) return "oom.live is not a list";
      for (const auto& b : *live)
        if (!b.is_number_unsigned() && !(b.is_number_integer() && b.get<std::int64_t>() >= 0))
          return "oom.live holds something that is not a number of bytes";
    }
  }
  return "";
}

json read_memory_timeline(const fs::path& file) {
  const fs::path folder = file.has_parent_path() ? file.parent_path() : fs::path(".");
  const unique_fd dir = detail::open_folder(folder);
  json t = dir ? read_timeline(dir.get(), file.filename().string(), file) : json();
  if (t.is_null()) throw std::runtime_error(file.string() + " is not there");
  return t;
}

std::string render_memory_timeline(const json& timeline, const std::string& title) {
  std::ostringstream o;
  o << "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>" << esc(title) << "</title><style>" << style
    << "</style></head><body><section id=\"timelines\"><h1>" << esc(title) << "</h1>" << timeline_svg(timeline)
    << "</section><script>document.body.setAttribute('data-ready', 'yes');</script></body></html>\n";
  return o.str();
}

}  // namespace isorun::sweep
