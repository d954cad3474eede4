// A report's data, read from a sweep's output folder as a damaged or crafted one may hold it.
#include "report/report_data.hpp"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <tuple>
#include <unordered_set>

#include "engine/folder.hpp"
#include "isorun/html/memory_timeline.hpp"
#include "isorun/runner/bounded_json.hpp"
#include "isorun/runner/errors.hpp"
#include "isorun/runner/unique_fd.hpp"
#include "isorun/sweep/report_log.hpp"
#include "isorun/sweep/spec.hpp"
#include "isorun/sweep/stop_rule.hpp"

namespace isorun::sweep {
namespace fs = std::filesystem;
using detail::goodness;
using detail::metric_value;
using nlohmann::json;

namespace {

// sweep.json is small; anything near this is not one isorun wrote.
constexpr std::size_t max_identity = std::size_t{64} << 20;
// At most this many memory timelines are shown.
constexpr std::size_t max_timelines = 8;

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
      if (const unique_fd fd = detail::open_file(logs.get(), name, O_RDONLY, logs_shown / name))
        d.timelines.emplace_back(
            i, html::parse_memory_timeline(detail::read_all(fd.get(), html::max_timeline_bytes, logs_shown / name),
                                           logs_shown / name));
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

// sweep.json as a damaged or crafted folder may hold it: what has the wrong type is taken as
// absent.
std::string text(const json& o, const char* key) {
  const auto it = o.find(key);
  return it != o.end() && it->is_string() ? it->get<std::string>() : std::string();
}

double number(const json& o, const char* key) {
  const auto it = o.find(key);
  return it != o.end() && it->is_number() ? it->get<double>() : 0.0;
}

std::int64_t whole(const json& o, const char* key) {  // from 0 to 2^31-1
  const auto it = o.find(key);
  if (it == o.end() || !it->is_number_integer()) return 0;
  if (it->is_number_unsigned()) return std::min<std::uint64_t>(it->get<std::uint64_t>(), INT32_MAX);
  return std::clamp<std::int64_t>(it->get<std::int64_t>(), 0, INT32_MAX);
}

// One of sweep.json's runs.
run_info run_of(const json& r) {
  const auto limit = r.find("mem_limit");
  run_info run{.run = static_cast<int>(whole(r, "run")),
               .slots = {},
               .mem_limit = limit != r.end() && limit->is_number_unsigned() ? limit->get<std::uint64_t>() : 0,
               .wall_s = number(r, "wall_s")};
  if (const auto slots = r.find("slots"); slots != r.end() && slots->is_array())
    for (const auto& s : *slots)
      if (s.is_object()) run.slots.emplace_back(static_cast<int>(whole(s, "index")), text(s, "device"));
  return run;
}

// What sweep.json says of the sweep: its subject, its metric and its runs.
void read_identity(report_data& d, const json& identity) {
  d.subject = text(identity, "subject").empty() ? text(identity, "task") : text(identity, "subject");
  if (const auto m = identity.find("metric"); m != identity.end() && m->is_object()) {
    d.metric = text(*m, "name");
    if (const auto max = m->find("maximize"); max != m->end() && max->is_boolean()) d.maximize = max->get<bool>();
  }
  if (const auto o = identity.find("objectives"); o != identity.end() && o->is_array())
    for (const auto& m : *o)
      if (m.is_object() && m.contains("name") && m["name"].is_string())
        d.objectives.emplace_back(m["name"].get<std::string>(), m.value("maximize", false));
  if (const auto runs = identity.find("runs"); runs != identity.end() && runs->is_array())
    for (const auto& r : *runs)
      if (r.is_object()) d.runs.push_back(run_of(r));
}

// Early stopping, from sweep.json's scheduler.
void read_scheduler(report_data& d, const json& identity) {
  if (const auto e = identity.find("scheduler"); e != identity.end() && e->is_object()) {
    d.scheduler = text(*e, "type");
    d.max_t = whole(*e, "max_t");
    d.rungs = stop_rule_rungs(early_stopping_from_json(*e));  // the rule's own (an unknown one: none)
    if (d.rungs.size() > 64) d.rungs.resize(64);
  }
}

// Read only, never repaired: a sweep may be writing to it now. A line that is not a record
// (one being written, or cut short) is left out; a trial's last record counts.
void read_journal(report_data& d, int fd, const fs::path& file) {
  std::map<std::string, std::size_t> at;
  detail::for_each_line(fd, journal::max_line, file, [&](std::string_view line, int, bool too_long) {
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
}

// The parameters the trials differ in, in first-seen order, each with its axis.
void find_params(report_data& d) {
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
}

}  // namespace

std::optional<double> detail::metric_value(const report_data& d, const trial_record& r) {
  if (r.kind != outcome_kind::success) return std::nullopt;
  if (d.metric.empty()) return r.wall_s;
  if (r.result.is_object() && r.result.contains(d.metric) && r.result[d.metric].is_number())
    return r.result[d.metric].get<double>();
  return std::nullopt;
}

double detail::goodness(const report_data& d, double m) { return !d.metric.empty() && d.maximize ? m : -m; }

param_axis axis_for(const std::string& name, const std::vector<json>& values) {
  param_axis ax;
  ax.name = name;
  ax.numeric = !values.empty() &&
               std::all_of(values.begin(), values.end(), [](const json& v) { return v.is_number(); });
  if (ax.numeric) {
    ax.lo = ax.hi = values.front().get<double>();
    for (const auto& v : values) ax.lo = std::min(ax.lo, v.get<double>()), ax.hi = std::max(ax.hi, v.get<double>());
    ax.integer = std::all_of(values.begin(), values.end(), [](const json& v) {
      return v.is_number_integer() || (v.is_number_float() && v.get<double>() == std::floor(v.get<double>()));
    });
    ax.log = ax.lo > 0 && ax.hi / ax.lo >= 10 && spaced_by_ratio(values);  // (one value: hi == lo, no log)
    return ax;
  }
  std::unordered_set<std::string> seen;  // (a sweep of 100,000 distinct words: no search per value)
  for (const auto& v : values)
    if (std::string w = value_text(v); seen.insert(w).second) ax.categories.push_back(std::move(w));
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

report_data load_report_data(const fs::path& out) {
  const fs::path identity_file = out / "sweep.json", journal_file = out / "results.jsonl";
  const unique_fd dir = detail::open_folder(out);
  const unique_fd identity_fd = dir ? detail::open_file(dir.get(), "sweep.json", O_RDONLY, identity_file) : unique_fd();
  const unique_fd journal_fd = dir ? detail::open_file(dir.get(), "results.jsonl", O_RDONLY, journal_file)
                                   : unique_fd();
  const json identity = identity_fd
                            ? parse_bounded_json(detail::read_all(identity_fd.get(), max_identity, identity_file))
                            : json();
  if (!identity.is_object() || !journal_fd)
    throw usage_error(out.string() +
                      " is not a sweep's output folder (it has no sweep.json and results.jsonl); "
                      "give the folder a sweep wrote (its --out)");
  report_data d;
  d.out = out.string();
  read_identity(d, identity);
  read_journal(d, journal_fd.get(), journal_file);
  for (const auto& r : d.records) ++d.outcomes[std::string(outcome_name(r))];
  find_params(d);
  read_scheduler(d, identity);
  load_curves(d, out);
  load_timelines(d, dir.get());
  return d;
}

}  // namespace isorun::sweep
