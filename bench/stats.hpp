#pragma once
// Median and spread of repeated measurements.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace isorun::bench {

struct summary {
  double median, p10, p90;
  std::size_t n;
};

inline summary summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  auto at = [&](double q) { return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5)]; };
  return {at(0.5), at(0.1), at(0.9), v.size()};
}

inline std::string show(const summary& s, const char* unit, double scale = 1.0) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "median %8.3f %s  (p10 %.3f, p90 %.3f, n=%zu)", s.median * scale, unit, s.p10 * scale,
                s.p90 * scale, s.n);
  return buf;
}

// A figure the performance guard (tools/bench-check.sh) checks: its value, against its goal
// (`op` "<=" or ">="), as one line the guard reads. The guard fails a figure only past twice
// its goal, so that a machine's noise does not fail it and a regression of several times does.
inline void guard(const char* name, double value, const char* op, double goal) {
  std::printf("guard: %s %.4f %s %g\n", name, value, op, goal);
}

}  // namespace isorun::bench
