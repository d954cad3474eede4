// The sweep report page: the charts' SVG drawn in (report_charts.hpp, memory_timeline.hpp), data for the
// table embedded as JSON, no dependencies.
#include "isorun/sweep/html_report.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <set>
#include <sstream>

#include "isorun/html/memory_timeline.hpp"
#include "isorun/html/page.hpp"
#include "isorun/html/svg.hpp"
#include "isorun/runner/printable.hpp"
#include "isorun/sweep/report.hpp"
#include "isorun/sweep/spec.hpp"
#include "report/report_charts.hpp"
#include "report/report_data.hpp"

namespace isorun::sweep {
namespace fs = std::filesystem;
using nlohmann::json;
using namespace html::svg;
using detail::goodness;
using detail::metric_value;

namespace {

// Sorting and paging of the table, whose rows are the JSON in #trials-data. Marks the page
// ready when done, so a headless browser (and its test) can tell the script ran. On a live page
// it runs again with each new page, and keeps the reader's sort and page across them.
const char* script = R"(
(function(){
  var data = JSON.parse(document.getElementById('trials-data').textContent);
  var cols = data.columns, rows = data.rows, page = 0, size = 50, key = -1, dir = 1, kept = window.isorunTable;
  function keep(){ window.isorunTable = {key: key, dir: dir, page: page}; }
  var thead = document.querySelector('#trials thead tr'), tbody = document.querySelector('#trials tbody');
  var info = document.getElementById('page-info');
  cols.forEach(function(c, i){
    var th = document.createElement('th'); th.textContent = c.name;
    th.onclick = function(){ dir = key === i ? -dir : 1; key = i; page = 0; sort(); draw(); keep(); };
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
  document.getElementById('prev').onclick = function(){ page--; draw(); keep(); };
  document.getElementById('next').onclick = function(){ page++; draw(); keep(); };
  if (kept && kept.key < cols.length) { key = kept.key; dir = kept.dir; page = kept.page; }
  else if (data.sort >= 0) { key = data.sort; dir = data.dir; }
  if (key >= 0) sort();
  draw();
  document.body.setAttribute('data-ready', 'yes');
})();
)";

// The table's data: the columns of results.csv (mem_limit: the cap the trial finally needed), plus
// the peak against the cap.
json table_data(const report_data& d) {
  const result_columns columns = columns_of(d.records);
  json cols = json::array({{{"name", "id"}},
                           {{"name", "outcome"}, {"kind", "outcome"}},
                           {{"name", "attempts"}},
                           {{"name", "wall_s"}},
                           {{"name", "device"}},
                           {{"name", "peak_reserved"}, {"kind", "bytes"}},
                           {{"name", "mem_limit"}, {"kind", "bytes"}},
                           {{"name", "peak/cap"}}});
  // With checkpoints, as in results.csv: the step each trial reached and saved, and what its
  // resumes did again.
  const bool saved = std::any_of(d.records.begin(), d.records.end(),
                                 [](const trial_record& r) { return r.checkpoint >= 0 || !r.resumes.empty(); });
  if (saved)
    for (const char* name : {"step", "checkpoint", "steps_redone"}) cols.push_back({{"name", name}});
  for (const auto& h : columns.headers) cols.push_back({{"name", h}});
  cols.push_back({{"name", "error"}, {"kind", "error"}});
  json rows = json::array();
  for (const auto& r : d.records) {
    json row = {r.id,
                std::string(outcome_name(r)),
                r.attempts,
                r.wall_s,
                r.device,
                r.peak_reserved,
                r.mem_limit,
                r.mem_limit ? json(static_cast<double>(r.peak_reserved) / static_cast<double>(r.mem_limit)) : json()};
    if (saved) {
      row.push_back(r.step >= 0 ? json(r.step) : json());
      row.push_back(r.checkpoint >= 0 ? json(r.checkpoint) : json());
      row.push_back(r.steps_redone());
    }
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

// A card of the summary: a title, and a value under it.
void card(std::ostringstream& o, const std::string& title, const std::string& value, const char* colour = nullptr) {
  o << "<div class=\"card\"" << (colour ? std::string(" style=\"border-left:4px solid ") + colour + "\"" : "") << ">"
    << esc(title) << "<b>" << esc(value) << "</b></div>";
}

// The share of the full budget (every trial to max_t) that early stopping let the sweep use.
std::string budget_used(const report_data& d) {
  std::uint64_t steps = 0;
  for (const auto& r : d.records) steps += r.step > 0 ? static_cast<std::uint64_t>(r.step) : 0;
  const double full = static_cast<double>(d.records.size()) * static_cast<double>(d.max_t);
  return num(100.0 * static_cast<double>(steps) / full, 3) + "% (" + std::to_string(steps) + " of " + num(full, 12) +
         " steps)";
}

// The last run's cap per trial, and the trials retried at larger caps after running out of
// memory: how many, and the largest cap.
std::string cap_per_trial(const report_data& d) {
  const std::uint64_t cap = d.runs.back().mem_limit;
  std::size_t larger = 0;
  std::uint64_t largest = cap;
  for (const auto& r : d.records)
    if (r.mem_limit > cap) {
      ++larger;
      largest = std::max(largest, r.mem_limit);
    }
  return bytes(cap) + (larger ? " (" + std::to_string(larger) + " trial" + (larger == 1 ? "" : "s") +
                                    " retried at larger caps, up to " + bytes(largest) + ")"
                              : std::string());
}

// The cards for the whole sweep: its runs' wall time, the most slots a run had, the GPUs they used.
void run_cards(std::ostringstream& o, const report_data& d) {
  double wall = 0;
  std::size_t slots = 0;
  std::set<std::string> gpus;
  for (const auto& r : d.runs) {
    wall += r.wall_s;
    slots = std::max(slots, r.slots.size());
    for (const auto& [i, dev] : r.slots)
      if (dev != "cpu") {
        std::size_t at = 0;
        for (std::size_t comma; (comma = dev.find(',', at)) != std::string::npos; at = comma + 1)
          gpus.insert(dev.substr(at, comma - at));
        gpus.insert(dev.substr(at));
      }
  }
  card(o, "wall time", num(wall, 4) + " s");
  card(o, "slots", std::to_string(slots));
  card(o, "GPUs", gpus.empty() ? "none (CPU)" : std::to_string(gpus.size()));
}

void summary_section(std::ostringstream& o, const report_data& d) {
  o << "<section id=\"summary\"><h1>Sweep: " << esc(d.subject) << "</h1><p class=\"sub\">" << esc(d.out) << " · "
    << d.records.size() << " trials journaled · " << d.runs.size() << " run" << (d.runs.size() == 1 ? "" : "s")
    << "</p>";
  o << "<div class=\"cards\">";
  for (const auto& [k, n] : d.outcomes)
    card(o, k, std::to_string(n),
         k == "pruned" ? pruned_colour : outcome_colour(outcome_kind_named(k).value_or(outcome_kind::internal_error)));
  if (d.max_t > 0 && !d.records.empty()) card(o, "budget used", budget_used(d));
  std::size_t resumes = 0;
  std::int64_t redone = 0;
  for (const auto& r : d.records) {
    resumes += r.resumes.size();
    redone += r.steps_redone();
  }
  if (resumes) card(o, "steps redone", std::to_string(redone) + " over " + std::to_string(resumes) + " resumes");
  run_cards(o, d);
  if (!d.runs.empty() && d.runs.back().mem_limit) card(o, "cap per trial", cap_per_trial(d));
  std::optional<double> best;
  const trial_record* best_trial = nullptr;
  for (const auto& r : d.records)
    if (auto m = metric_value(d, r); m && (!best || goodness(d, *m) > goodness(d, *best))) {
      best = m;
      best_trial = &r;
    }
  if (best)
    card(o, "best " + (d.metric.empty() ? std::string("wall_s") : d.metric),
         num(*best, 5) + " (" + best_trial->id + ")");
  o << "</div></section>";
}

// The charts of the trials' metric and parameters, then the table (filled in by the script).
void trial_sections(std::ostringstream& o, const report_data& d) {
  o << "<section id=\"params\"><h2>" << esc(d.metric.empty() ? "Wall time" : d.metric) << " by parameter</h2>";
  if (d.params.empty()) o << "<p>Every trial has the same parameters.</p>";
  o << "<div class=\"charts\">";
  for (const auto& ax : d.params) o << detail::param_chart(d, ax);
  o << "</div></section>";
  o << "<section id=\"parallel\"><h2>All trials, all parameters</h2><p class=\"sub\">One line per successful trial, coloured by "
    << esc(d.metric.empty() ? "wall time (short is bright)" : d.metric + " (best is bright)") << ".</p>"
    << detail::parallel_chart(d) << "</section>";
  if (!d.curves.empty())
    o << "<section id=\"curves\"><h2>Learning curves</h2><p class=\"sub\">"
      << esc(d.metric.empty() ? "the first metric" : d.metric)
      << " against the step each trial reported, one line per trial"
      << (d.scheduler.empty() ? "" : "; pruned trials faded")
      << (d.rungs.empty() ? "" : "; dashed: the rungs where ASHA decides") << ".</p>" << detail::curves_chart(d)
      << "</section>";
  o << "<section id=\"table\"><h2>Trials</h2><div class=\"pager\"><button id=\"prev\">previous</button><button id=\"next\">next"
       "</button><span id=\"page-info\"></span></div><div class=\"tablewrap\"><table id=\"trials\"><thead><tr></tr></thead><tbody>"
       "</tbody></table></div></section>";
}

// A search with several objectives: the successful trials no other beats on every objective,
// best first by the first objective.
void pareto_section(std::ostringstream& o, const report_data& d) {
  if (d.objectives.size() < 2) return;
  struct point {
    const trial_record* r;
    std::vector<double> v;  // higher is better on each
  };
  std::vector<point> all;
  for (const auto& r : d.records) {
    if (r.kind != outcome_kind::success || r.pruned || !r.result.is_object()) continue;
    point p{&r, {}};
    for (const auto& [name, maximize] : d.objectives) {
      const auto it = r.result.find(name);
      if (it == r.result.end() || !it->is_number()) break;
      p.v.push_back(maximize ? it->get<double>() : -it->get<double>());
    }
    if (p.v.size() == d.objectives.size()) all.push_back(std::move(p));
  }
  auto dominates = [](const point& a, const point& b) {
    bool better = false;
    for (std::size_t k = 0; k < a.v.size(); ++k) {
      if (a.v[k] < b.v[k]) return false;
      better = better || a.v[k] > b.v[k];
    }
    return better;
  };
  std::vector<point> front;
  for (const auto& p : all)
    if (std::none_of(all.begin(), all.end(), [&](const point& q) { return dominates(q, p); })) front.push_back(p);
  std::sort(front.begin(), front.end(), [](const point& a, const point& b) { return a.v[0] > b.v[0]; });
  o << "<section id=\"pareto\"><h2>Pareto front</h2><p class=\"sub\">The " << front.size() << " of " << all.size()
    << " successful trials that no other beats on every objective.</p><div class=\"tablewrap\"><table><thead><tr><th>trial</th>";
  for (const auto& [name, maximize] : d.objectives)
    o << "<th>" << esc(name) << (maximize ? " (max)" : " (min)") << "</th>";
  o << "<th>parameters</th></tr></thead><tbody>";
  for (const auto& p : front) {
    o << "<tr><td>" << esc(p.r->id) << "</td>";
    for (std::size_t k = 0; k < p.v.size(); ++k)
      o << "<td>" << num(d.objectives[k].second ? p.v[k] : -p.v[k], 5) << "</td>";
    std::string params;
    for (const auto& [k, v] : p.r->params.items())
      params += (params.empty() ? "" : " ") + k + "=" + (v.is_string() ? v.get<std::string>() : v.dump());
    o << "<td>" << esc(params) << "</td></tr>";
  }
  o << "</tbody></table></div></section>";
}

// Population-based training: each child, the member whose checkpoint it started from and the
// one it replaced, in the order they were made.
void lineage_section(std::ostringstream& o, const report_data& d) {
  std::vector<const trial_record*> children;
  for (const auto& r : d.records)
    if (r.origin.is_object()) children.push_back(&r);
  if (children.empty()) return;
  o << "<section id=\"lineage\"><h2>Population</h2><p class=\"sub\">" << children.size()
    << " trials made by population-based training: each started from its parent's checkpoint with its parameters "
       "mutated, in place of a member in the bottom quantile (journaled pruned).</p><div class=\"tablewrap\"><table>"
       "<thead><tr><th>trial</th><th>generation</th><th>parent</th><th>from step</th><th>replaced</th><th>"
    << esc(d.metric.empty() ? "outcome" : d.metric) << "</th><th>parameters</th></tr></thead><tbody>";
  for (const auto* r : children) {
    const json& origin = r->origin;
    const auto text = [&](const char* key) {
      const auto it = origin.find(key);
      return it == origin.end() ? std::string() : it->is_string() ? it->get<std::string>() : it->dump();
    };
    const auto m = metric_value(d, *r);
    std::string params;
    for (const auto& [k, v] : r->params.items())
      params += (params.empty() ? "" : " ") + k + "=" + (v.is_string() ? v.get<std::string>() : v.dump());
    o << "<tr><td>" << esc(r->id) << "</td><td>" << esc(text("generation")) << "</td><td>" << esc(text("parent"))
      << "</td><td>" << esc(text("step")) << "</td><td>" << esc(text("replaces")) << "</td><td>"
      << (m ? num(*m, 5) : esc(std::string(outcome_name(*r)))) << "</td><td>" << esc(params) << "</td></tr>";
  }
  o << "</tbody></table></div></section>";
}

// Where the trials ran and what memory they used: slots over time, peaks against the cap, and
// the memory timelines (the trials that ran out of memory first, then the best).
void resource_sections(std::ostringstream& o, const report_data& d) {
  o << "<section id=\"slots\"><h2>Slots over time</h2><p class=\"sub\">Each bar a trial on its slot, coloured by outcome; gaps "
       "are idle slots.</p>"
    << detail::slots_chart(d) << "</section>";
  o << "<section id=\"memory\"><h2>Device memory against the cap</h2>" << detail::memory_chart(d) << "</section>";
  if (d.timelines.empty()) return;
  o << "<section id=\"timelines\"><h2>Memory timelines</h2><p class=\"sub\">" << d.timelines_kept
    << " trials kept a memory timeline (a task's allocator with history:N in alloc_conf; a command, what its cap "
       "saw); "
    << d.timelines.size() << " shown, failures first.</p>";
  for (const auto& [i, timeline] : d.timelines) {
    const trial_record& r = d.records[i];
    std::string desc;
    for (const auto& w : param_words(r.params)) desc += (desc.empty() ? "" : " ") + w;
    o << "<h3>" << esc(r.id) << " · " << outcome_name(r) << " · " << esc(desc) << "</h3>"
      << html::timeline_svg(timeline);
  }
  o << "</section>";
}

}  // namespace

std::string render_report(const report_data& d, const page_options& page) {
  std::ostringstream o;
  html::page_head(o, "isorun sweep: " + d.subject, page.live_generation);
  summary_section(o, d);
  trial_sections(o, d);
  pareto_section(o, d);
  lineage_section(o, d);
  resource_sections(o, d);
  o << "<script type=\"application/json\" id=\"trials-data\">" << script_json(table_data(d))
    << "</script><script id=\"table-script\">" << script << "</script>";
  html::page_tail(o, page.live_generation);
  return o.str();
}

std::string render_waiting_page(const std::string& out, const page_options& page) {
  std::ostringstream o;
  html::page_head(o, "isorun sweep in " + out, page.live_generation);
  o << "<section id=\"summary\"><h1>Sweep in " << esc(out)
    << "</h1><p class=\"sub\">No trial journaled yet: the page fills in as the sweep writes its records.</p>"
       "</section><script>document.body.setAttribute('data-ready', 'yes');</script>";
  html::page_tail(o, page.live_generation);
  return o.str();
}

void write_report(const fs::path& out) {
  const report_data d = load_report_data(out);
  for (const auto& w : d.warnings) std::fprintf(stderr, "isorun: warning: %s\n", printable(w).c_str());
  write_file_durably(out / "report.html", render_report(d));
}

}  // namespace isorun::sweep
