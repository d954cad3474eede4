// Ranking and tabulating a sweep's results.
#include "isorun/sweep/report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <sstream>

#include "isorun/runner/suggest.hpp"
#include "trials/trial_program.hpp"

namespace isorun::sweep {
using nlohmann::json;

namespace {
// One cell. A text that begins with =, +, -, @, a tab or a carriage return gets a leading ' : a
// spreadsheet would take it for a formula (and quoting does not stop that). Numbers are written
// as they are; results.jsonl keeps every value exactly.
std::string csv_field(const json& v) {
  std::string s = v.is_string() ? v.get<std::string>() : v.is_null() ? "" : v.dump();
  if (v.is_string() && !s.empty() && std::string_view("=+-@\t\r").find(s.front()) != std::string_view::npos)
    s.insert(0, 1, '\'');
  if (s.find_first_of(",\"\n\r") != std::string::npos) {
    std::string q = "\"";
    for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
    return q + "\"";
  }
  return s;
}

// Numbers of one column printed with the same decimals, right-aligned.
std::vector<std::string> aligned(const std::vector<double>& values) {
  double most = 0;
  for (double v : values) most = std::max(most, std::abs(v));
  const bool scientific = most != 0 && (most < 1e-3 || most >= 1e9);
  const int decimals = most >= 1 ? std::max(0, 5 - static_cast<int>(std::floor(std::log10(most)))) : 6;
  std::vector<std::string> out;
  std::size_t width = 0;
  for (double v : values) {
    char buf[64];
    if (scientific) std::snprintf(buf, sizeof buf, "%.4e", v);
    else std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
    out.emplace_back(buf);
    width = std::max(width, out.back().size());
  }
  for (auto& t : out) t.insert(0, width - t.size(), ' ');
  return out;
}
}  // namespace

std::optional<double> metric_of(const sweep_spec& s, const trial_record& r) {
  if (r.kind != outcome_kind::success || s.metric.name.empty()) return std::nullopt;
  if (r.result.is_object() && r.result.contains(s.metric.name) && r.result[s.metric.name].is_number())
    return r.result[s.metric.name].get<double>();
  return std::nullopt;
}

std::string metric_problem(const sweep_spec& s, const json& result, const std::string& whose) {
  const std::string& name = s.metric.name;
  if (result.is_null())
    if (std::string hint = program_of(s)->no_result_hint(name, whose); !hint.empty()) return hint;
  if (!result.is_object())
    return "metric '" + name + "': the result of " + whose + " is " + std::string(result.type_name()) +
           ", not an object with fields; drop metric: to rank by wall time";
  std::vector<std::string> numeric, all;
  for (auto it = result.begin(); it != result.end(); ++it) {
    all.push_back(it.key());
    if (it.value().is_number()) numeric.push_back(it.key());
  }
  if (!result.contains(name))
    return "metric '" + name + "' is not a field of the result of " + whose + did_you_mean(name, numeric) +
           "; its numeric fields: " + name_list(numeric);
  if (!result[name].is_number())
    return "metric '" + name + "' is a " + std::string(result[name].type_name()) + " in the result of " + whose +
           ", not a number; numeric fields: " + name_list(numeric);
  return "";
}

std::string top_table(const sweep_spec& s, const std::vector<trial_record>& records, int k) {
  if (k <= 0) return "";  // --top 0: no table
  std::vector<const trial_record*> ok;
  for (const auto& r : records)
    if (r.kind == outcome_kind::success) ok.push_back(&r);
  std::stable_sort(ok.begin(), ok.end(), [&](auto* a, auto* b) {
    auto ma = metric_of(s, *a), mb = metric_of(s, *b);
    if (ma.has_value() != mb.has_value()) return ma.has_value();
    if (!ma) return a->wall_s < b->wall_s;
    return s.metric.maximize ? *ma > *mb : *ma < *mb;
  });
  if (ok.empty()) return "(no successful trials)\n";
  ok.resize(std::min<std::size_t>(static_cast<std::size_t>(k), ok.size()));
  std::vector<double> values;
  for (auto* r : ok) values.push_back(metric_of(s, *r).value_or(r->wall_s));
  auto shown = aligned(values);
  const std::string metric = s.metric.name.empty() ? "wall_s" : s.metric.name;
  const std::size_t width = std::max(metric.size(), shown.empty() ? 0 : shown[0].size());
  std::ostringstream o;
  char line[256];
  std::snprintf(line, sizeof line, "%-4s  %*s  %-16s  %s\n", "rank", static_cast<int>(width), metric.c_str(), "trial",
                "parameters");
  o << line;
  for (std::size_t i = 0; i < ok.size(); ++i) {
    std::string desc;
    for (const auto& w : param_words(ok[i]->params)) desc += (desc.empty() ? "" : " ") + w;
    std::snprintf(line, sizeof line, "%-4zu  %*s  %-16s  ", i + 1, static_cast<int>(width), shown[i].c_str(),
                  ok[i]->id.c_str());
    o << line << desc << "\n";
  }
  return o.str();
}

result_columns columns_of(const std::vector<trial_record>& records) {
  std::set<std::string> param_names, result_names;
  for (const auto& r : records) {
    for (auto it = r.params.begin(); it != r.params.end(); ++it) param_names.insert(it.key());
    if (r.result.is_object())
      for (auto it = r.result.begin(); it != r.result.end(); ++it) result_names.insert(it.key());
  }
  static const std::set<std::string> fixed = {"id",     "outcome",       "attempts", "wall_s",
                                              "device", "peak_reserved", "step",     "error"};
  result_columns c;
  c.params.assign(param_names.begin(), param_names.end());
  c.fields.assign(result_names.begin(), result_names.end());
  c.headers = c.params;
  for (const auto& m : c.fields) c.headers.push_back(param_names.count(m) || fixed.count(m) ? "result_" + m : m);
  if (c.fields.empty()) c.headers.emplace_back("result");
  return c;
}

std::vector<json> result_columns::values(const trial_record& r) const {
  std::vector<json> v;
  v.reserve(headers.size());
  for (const auto& p : params) v.push_back(r.params.value(p, json()));
  for (const auto& m : fields) v.push_back(r.result.is_object() ? r.result.value(m, json()) : json());
  if (fields.empty()) v.push_back(r.result);
  return v;
}

std::string results_csv(const std::vector<trial_record>& records) {
  const result_columns columns = columns_of(records);
  std::ostringstream csv;
  // The step each trial reached, where trials reported steps (early stopping's resource).
  const bool steps = std::any_of(records.begin(), records.end(), [](const trial_record& r) { return r.step >= 0; });
  // mem_limit: the cap of the trial's last attempt, the one it finally needed where it was
  // retried at larger caps after running out of memory.
  // With checkpoints: the step each trial had saved, and the steps its resumes did again.
  const bool saved = std::any_of(records.begin(), records.end(),
                                 [](const trial_record& r) { return r.checkpoint >= 0 || !r.resumes.empty(); });
  csv << "id,outcome,attempts,wall_s,device,peak_reserved,mem_limit" << (steps ? ",step" : "")
      << (saved ? ",checkpoint,steps_redone" : "");
  for (const auto& h : columns.headers) csv << "," << csv_field(json(h));
  csv << ",error\n";
  for (const auto& r : records) {
    csv << r.id << "," << outcome_name(r) << "," << r.attempts << "," << r.wall_s << "," << csv_field(json(r.device))
        << "," << r.peak_reserved << "," << r.mem_limit;
    if (steps) csv << "," << (r.step >= 0 ? std::to_string(r.step) : std::string());
    if (saved)
      csv << "," << (r.checkpoint >= 0 ? std::to_string(r.checkpoint) : std::string()) << "," << r.steps_redone();
    for (const auto& v : columns.values(r)) csv << "," << csv_field(v);
    csv << "," << csv_field(json(r.error)) << "\n";
  }
  return csv.str();
}

}  // namespace isorun::sweep
