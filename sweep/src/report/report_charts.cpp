// The report's charts (see report_charts.hpp), drawn with svg.hpp.
#include "report/report_charts.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <map>
#include <numeric>
#include <sstream>
#include <unordered_map>

#include "isorun/html/svg.hpp"
#include "isorun/sweep/spec.hpp"
#include "report/report_data.hpp"

namespace isorun::sweep {
using nlohmann::json;
using namespace html::svg;

namespace {

// At most this many marks per chart: beyond, charts sample (lines) or merge (slots); a parameter
// with more distinct words than max_categories gets no boxes or labels (they could not be read).
constexpr std::size_t max_lines = 800, max_bars = 4000, max_categories = 60;

// Each category's place on its axis, found without a search per trial.
std::unordered_map<std::string, std::size_t> places(const param_axis& ax) {
  std::unordered_map<std::string, std::size_t> at;
  for (std::size_t c = 0; c < ax.categories.size(); ++c) at.emplace(ax.categories[c], c);
  return at;
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

std::string metric_label(const report_data& d) {
  return d.metric.empty() ? "wall time (s)" : d.metric + (d.maximize ? " (higher is better)" : " (lower is better)");
}

}  // namespace

std::string detail::param_chart(const report_data& d, const param_axis& ax) {
  const double W = 420, H = 260, L = 56, R = W - 12, T = 12, B = H - 44;
  std::vector<std::pair<const trial_record*, double>> pts;
  for (const auto& r : d.records)
    if (auto m = metric_value(d, r)) pts.emplace_back(&r, *m);
  std::ostringstream o;
  o << "<figure class=\"chart\"><svg viewBox=\"0 0 " << W << " " << H << "\" width=\"" << W << "\" height=\"" << H
    << "\">";
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
      o << "<circle cx=\"" << px(x(v.get<double>())) << "\" cy=\"" << px(y(m)) << "\" r=\"3\"><title>" << esc(r->id)
        << ": " << esc(ax.name) << "=" << esc(v.dump()) << ", " << num(m) << "</title></circle>";
    }
  } else if (ax.categories.size() > max_categories) {
    o << "<text x=\"20\" y=\"40\">" << ax.categories.size() << " distinct values of " << esc(ax.name)
      << ": too many to draw</text>";
  } else {
    axes(o, scale{0, 1, L, R}, y, T, B, L, R, "", metric_label(d));
    const double band = (R - L) / static_cast<double>(std::max<std::size_t>(1, ax.categories.size()));
    std::vector<std::vector<double>> of(ax.categories.size());
    const auto at = places(ax);
    for (auto& [r, m] : pts)
      if (const auto c = at.find(value_text(param_of(*r, ax.name))); c != at.end()) of[c->second].push_back(m);
    for (std::size_t c = 0; c < ax.categories.size(); ++c) {
      std::vector<double>& v = of[c];
      const double cx = L + band * (static_cast<double>(c) + 0.5);
      o << "<text x=\"" << px(cx) << "\" y=\"" << px(B + 14) << "\" text-anchor=\"middle\">" << esc(ax.categories[c])
        << "</text>";
      if (v.empty()) continue;
      std::sort(v.begin(), v.end());
      auto q = [&](double f) { return v[static_cast<std::size_t>(f * static_cast<double>(v.size() - 1) + 0.5)]; };
      const double w = std::min(60.0, band * 0.6);
      o << "<g class=\"box\"><title>" << esc(ax.name) << "=" << esc(ax.categories[c]) << ": " << v.size()
        << " trials, median " << num(q(0.5)) << ", range " << num(v.front()) << " to " << num(v.back()) << "</title>"
        << "<line x1=\"" << px(cx) << "\" x2=\"" << px(cx) << "\" y1=\"" << px(y(v.front())) << "\" y2=\""
        << px(y(v.back())) << "\"/><rect x=\"" << px(cx - w / 2) << "\" width=\"" << px(w) << "\" y=\""
        << px(y(q(0.75))) << "\" height=\"" << px(std::max(1.0, y(q(0.25)) - y(q(0.75))))
        << "\"/><line class=\"median\" x1=\"" << px(cx - w / 2) << "\" x2=\"" << px(cx + w / 2) << "\" y1=\""
        << px(y(q(0.5))) << "\" y2=\"" << px(y(q(0.5))) << "\"/></g>";
    }
  }
  o << "</svg><figcaption>" << esc(metric_label(d)) << " by " << esc(ax.name) << "</figcaption></figure>";
  return o.str();
}

std::string detail::parallel_chart(const report_data& d) {
  std::vector<std::pair<const trial_record*, double>> pts;
  for (const auto& r : d.records)
    if (auto m = metric_value(d, r)) pts.emplace_back(&r, *m);
  if (pts.empty() || d.params.empty()) return "<p>Nothing to draw: no successful trial has the metric.</p>";
  double lo = pts[0].second, hi = lo;
  for (auto& p : pts) lo = std::min(lo, p.second), hi = std::max(hi, p.second);
  const std::size_t n = d.params.size() + 1;
  const double W = std::max(480.0, 140.0 * static_cast<double>(n)), H = 300, T = 24, B = H - 30, L = 60, R = W - 60;
  auto xpos = [&](std::size_t i) {
    return n == 1 ? (L + R) / 2 : L + (R - L) * static_cast<double>(i) / static_cast<double>(n - 1);
  };
  std::vector<scale> ys;
  for (const auto& ax : d.params)
    ys.push_back(ax.numeric ? padded(ax.lo, ax.hi, B, T, ax.log)
                            : scale{-0.5, static_cast<double>(ax.categories.size()) - 0.5, B, T, false});
  const scale my = padded(lo, hi, B, T, false);
  std::vector<std::unordered_map<std::string, std::size_t>> at;
  for (const auto& ax : d.params)
    at.push_back(ax.numeric ? std::unordered_map<std::string, std::size_t>{} : places(ax));
  auto yof = [&](std::size_t i, const trial_record& r, double m) {
    if (i == d.params.size()) return my(m);
    const auto& ax = d.params[i];
    const json& v = param_of(r, ax.name);
    if (ax.numeric) return v.is_number() ? ys[i](v.get<double>()) : B;
    const auto c = at[i].find(value_text(v));
    return ys[i](static_cast<double>(c == at[i].end() ? ax.categories.size() : c->second));
  };
  // The best trials are always drawn (last, on top); the rest sampled.
  std::vector<std::size_t> order(pts.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return goodness(d, pts[a].second) < goodness(d, pts[b].second);
  });
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
    o << "<g class=\"axis\"><line x1=\"" << px(x) << "\" x2=\"" << px(x) << "\" y1=\"" << px(T) << "\" y2=\"" << px(B)
      << "\"/>"
      << "<text x=\"" << px(x) << "\" y=\"" << px(T - 8) << "\" text-anchor=\"middle\" class=\"label\">"
      << esc(i == d.params.size() ? (d.metric.empty() ? "wall_s" : d.metric) : d.params[i].name) << "</text>";
    if (i < d.params.size() && !d.params[i].numeric) {
      for (std::size_t c = 0; d.params[i].categories.size() <= max_categories && c < d.params[i].categories.size(); ++c)
        o << "<text x=\"" << px(x + 4) << "\" y=\"" << px(ys[i](static_cast<double>(c)) + 3) << "\">"
          << esc(d.params[i].categories[c]) << "</text>";
    } else {
      const scale& s = i == d.params.size() ? my : ys[i];
      for (double t : s.ticks())
        o << "<text x=\"" << px(x + 4) << "\" y=\"" << px(s(t) + 3) << "\">" << num(t, 3) << "</text>";
    }
    o << "</g>";
  }
  o << "</svg>";
  return o.str();
}

// At most max_curves trials (the best always among them).
std::string detail::curves_chart(const report_data& d) {
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
  o << "<figure class=\"chart curves\"><svg viewBox=\"0 0 " << W << " " << H << "\" width=\"" << W << "\" height=\""
    << H << "\">";
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
    o << "<line class=\"rung\" x1=\"" << px(x(static_cast<double>(rung))) << "\" x2=\""
      << px(x(static_cast<double>(rung))) << "\" y1=\"" << px(T) << "\" y2=\"" << px(B) << "\"><title>rung at step "
      << rung << "</title></line>";
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
        << px(y(c->back().second)) << "\"><title>" << esc(*id) << " pruned at step " << c->back().first
        << "</title></circle>";
  }
  o << "</svg><figcaption>" << all.size() << " trials"
    << (all.size() > order.size() ? ", " + std::to_string(order.size()) + " drawn" : "") << "</figcaption></figure>";
  return o.str();
}

// Past max_bars bars, each slot's busy time is merged into spans and only failures are drawn
// one by one.
std::string detail::slots_chart(const report_data& d) {
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
    o << "<h3>Run " << run.run << ": " << mine.size() << " trials on " << slots << " slots, " << num(span, 3)
      << " s</h3>"
      << "<svg viewBox=\"0 0 " << W << " " << H << "\" width=\"" << W << "\" height=\"" << H << "\" class=\"gantt\">";
    for (int s = 0; s < slots; ++s) {
      std::string device = "slot " + std::to_string(s);
      for (const auto& [index, dev] : run.slots)
        if (index == s) device += " · " + (dev.size() > 18 ? dev.substr(0, 16) + "…" : dev);
      if (row >= 12)
        o << "<text x=\"" << px(L - 6) << "\" y=\"" << px(T + row * s + row * 0.68) << "\" text-anchor=\"end\">"
          << esc(device) << "</text>";
    }
    const bool merge = mine.size() > max_bars;
    if (merge) {
      std::map<int, std::vector<std::pair<double, double>>> busy;
      for (auto* b : mine) busy[b->slot].emplace_back(b->start_s, b->end_s);
      for (auto& [s, spans] : busy) {
        std::sort(spans.begin(), spans.end());
        std::vector<std::pair<double, double>> merged;
        for (auto sp : spans)
          if (!merged.empty() && sp.first <= merged.back().second + span * 1e-3)
            merged.back().second = std::max(merged.back().second, sp.second);
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
        << px(row - 2) << "\"><title>" << esc(b->id) << " (" << to_string(b->kind) << "): " << num(b->start_s, 4)
        << " to " << num(b->end_s, 4) << " s</title></rect>";
    }
    const double base = T + row * slots;
    o << "<g class=\"axis\"><line x1=\"" << px(L) << "\" x2=\"" << px(R) << "\" y1=\"" << px(base) << "\" y2=\""
      << px(base) << "\"/>";
    for (double t : fitted_ticks(x))
      o << "<text x=\"" << px(x(t)) << "\" y=\"" << px(base + 14) << "\" text-anchor=\"middle\">" << tick_label(t)
        << "</text>";
    o << "<text x=\"" << px((L + R) / 2) << "\" y=\"" << px(base + 30)
      << "\" text-anchor=\"middle\" class=\"label\">seconds "
         "after the run started</text></g></svg>";
  }
  return o.str();
}

std::string detail::memory_chart(const report_data& d) {
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
  byte_ticks(o, y, L, R);
  o << "<text x=\"" << px((L + R) / 2) << "\" y=\"" << px(B + 28)
    << "\" text-anchor=\"middle\" class=\"label\">trials, by peak reserved (" << rs.size()
    << (shown.size() < rs.size() ? ", sampled" : "") << ")</text></g>";
  for (std::size_t k = 0; k < shown.size(); ++k) {
    const trial_record& r = *rs[shown[k]];
    const double x0 = L + w * static_cast<double>(k);
    o << "<g><title>" << esc(r.id) << ": reserved " << bytes(r.peak_reserved) << ", allocated "
      << bytes(r.peak_allocated) << (r.mem_limit ? ", cap " + bytes(r.mem_limit) : std::string())
      << "</title><rect class=\"reserved\" x=\"" << px(x0) << "\" width=\"" << px(std::max(0.5, w - 1)) << "\" y=\""
      << px(y(static_cast<double>(r.peak_reserved))) << "\" height=\""
      << px(B - y(static_cast<double>(r.peak_reserved))) << "\"/><rect class=\"allocated\" x=\"" << px(x0)
      << "\" width=\"" << px(std::max(0.5, w - 1)) << "\" y=\"" << px(y(static_cast<double>(r.peak_allocated)))
      << "\" height=\"" << px(B - y(static_cast<double>(r.peak_allocated))) << "\"/></g>";
  }
  if (cap) cap_line(o, y, cap, L, R);
  o << "</svg><p class=\"legend\"><span class=\"swatch reserved\"></span>peak reserved <span class=\"swatch allocated\"></span>peak "
       "allocated</p>";
  return o.str();
}

std::vector<std::string> axis_tick_labels(const param_axis& axis, double width_px) {
  std::vector<std::string> out;
  if (!axis.numeric) return out;
  for (double t : fitted_ticks(padded(axis.lo, axis.hi, 0, width_px, axis.log, axis.integer)))
    out.push_back(tick_label(t));
  return out;
}

}  // namespace isorun::sweep
