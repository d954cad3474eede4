#pragma once
/// @file svg.hpp
/// What isorun's pages draw their SVG with: text escaped for the page, numbers written as the page
/// shows them, the outcomes' colours, and scales (linear, log, bytes) with round ticks whose
/// labels do not overlap.

#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "isorun/runner/outcome.hpp"

namespace isorun::html::svg {

// At most this many points per chart: beyond, a chart samples them.
constexpr std::size_t max_points = 2000;

// `s` with the characters HTML gives a meaning to as entities: for text and attribute values.
std::string esc(const std::string& s);
// `v` with `digits` significant digits (%g): values in titles, labels and cards.
std::string num(double v, int digits = 4);
// A coordinate, to a tenth of a pixel.
std::string px(double v);
// A size as people read it (1.5 GiB).
std::string bytes(std::uint64_t b);

constexpr const char* pruned_colour = "#cdb4db";  // stopped early: done, not a failure
const char* outcome_colour(outcome_kind k);
// t in [0, 1] to a colour from dark blue (worst) to yellow (best), as viridis runs.
std::string ramp(double t);

// A linear or log mapping of [lo, hi] onto [a, b] (pixels), for axes.
struct scale {
  double lo = 0, hi = 1, a = 0, b = 1;
  bool log = false;
  bool integer = false;  // ticks on whole numbers only
  [[nodiscard]] double operator()(double v) const;
  // About five round tick values within [lo, hi].
  [[nodiscard]] std::vector<double> ticks() const;
  // Ticks on the multiples of `step` within [lo, hi] (a linear scale).
  [[nodiscard]] std::vector<double> ticks_every(double step) const;
  // The round step (1, 2 or 5 times a power of ten) at or above `raw`.
  [[nodiscard]] static double round_step(double raw);
};

// A tick's label: short, whatever the magnitude (1e-04 rather than 0.0001).
std::string tick_label(double v);

// Ticks along a horizontal axis whose labels do not overlap: the step grows (linear) or every
// other decade is kept (log) until the labels, at about 6 px a character and a gap, fit.
std::vector<double> fitted_ticks(const scale& x);

// A byte axis from 0 to `top`: its ticks fall on round MiB (or GiB) values.
struct byte_axis {
  scale s;      // in bytes
  double unit;  // bytes per tick unit
  explicit byte_axis(std::uint64_t top, double a, double b);
  [[nodiscard]] double operator()(double bytes) const { return s(bytes); }
  [[nodiscard]] std::vector<double> ticks() const;
};

// A scale for values from `lo` to `hi` with a margin, so that no mark sits on the frame (a
// single value: a range around it).
scale padded(double lo, double hi, double a, double b, bool log, bool integer = false);

// The ticks of a byte axis at the left, with grid lines across to `right`.
void byte_ticks(std::ostringstream& o, const byte_axis& y, double left, double right);

// The cap as a dashed line across, labelled at the right.
void cap_line(std::ostringstream& o, const byte_axis& y, std::uint64_t cap, double left, double right);

// Axes frame: y ticks on the left, x ticks (numeric or given labels) at the bottom.
void axes(std::ostringstream& o, const scale& x, const scale& y, double top, double bottom, double left, double right,
          const std::string& xlabel, const std::string& ylabel);

}  // namespace isorun::html::svg
