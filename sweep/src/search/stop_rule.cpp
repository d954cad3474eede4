// The registry of early-stopping rules (stop_rule.hpp): one row per rule, and what reads it.
#include "isorun/sweep/stop_rule.hpp"

#include <stdexcept>

#include "isorun/sweep/asha.hpp"
#include "isorun/sweep/hyperband.hpp"
#include "isorun/sweep/median_stopping.hpp"
#include "isorun/sweep/spec.hpp"

namespace isorun::sweep {

namespace {

// A rule whose rungs start at its grace period cannot judge anything below max_t otherwise.
std::string max_t_below_grace(const early_stopping_spec& s) {
  const std::int64_t max_t = s.get("max_t"), grace = s.get("grace_period");
  if (max_t >= grace) return "";
  return "max_t (" + std::to_string(max_t) + ") is below grace_period (" + std::to_string(grace) +
         "): no trial could reach a rung; raise max_t or lower grace_period";
}

// ASHA and Hyperband from their common settings.
template <class Rule>
Rule halving(const early_stopping_spec& s) {
  return Rule(s.get("grace_period"), static_cast<int>(s.get("reduction_factor")), s.max_t());
}

const stop_rule_setting max_t{"max_t", 100, 1, "the step a trial is complete at"};
const stop_rule_setting first_rung{"grace_period", 1, 1, "no trial is stopped before this step: the first rung"};
const stop_rule_setting eta{"reduction_factor", 3, 2,
                            "a trial goes on from a rung if it is in the top 1/reduction_factor there"};

}  // namespace

const std::vector<stop_rule_kind>& stop_rule_kinds() {
  static const std::vector<stop_rule_kind> kinds = {
      {"asha",
       "asynchronous successive halving",
       {max_t, first_rung, eta},
       max_t_below_grace,
       [](const early_stopping_spec& s) -> std::unique_ptr<stop_rule> {
         return std::make_unique<asha_rule>(halving<asha_rule>(s));
       },
       [](const early_stopping_spec& s) { return halving<asha_rule>(s).rungs(); }},
      {"median",
       "median stopping rule",
       {{"grace_period", 1, 0, "no trial is stopped before this step"},
        {"min_samples", 3, 1, "other trials that must have reached a step before it judges there"},
        {"max_t", 0, 0, "the step a trial is complete at, for the budget line (0: not counted)"}},
       [](const early_stopping_spec& s) { return s.max_t() ? max_t_below_grace(s) : std::string(); },
       [](const early_stopping_spec& s) -> std::unique_ptr<stop_rule> {
         return std::make_unique<median_stopping_rule>(s.get("grace_period"), static_cast<int>(s.get("min_samples")));
       },
       nullptr},
      {"hyperband",
       "Hyperband: brackets of ASHA",
       {max_t, first_rung, eta},
       max_t_below_grace,
       [](const early_stopping_spec& s) -> std::unique_ptr<stop_rule> {
         return std::make_unique<hyperband_rule>(halving<hyperband_rule>(s));
       },
       [](const early_stopping_spec& s) { return halving<hyperband_rule>(s).rungs(); }},
  };
  return kinds;
}

const stop_rule_kind* find_stop_rule(std::string_view name) {
  for (const auto& k : stop_rule_kinds())
    if (name == k.name) return &k;
  return nullptr;
}

std::string stop_rule_names() {
  std::string names;
  for (const auto& k : stop_rule_kinds()) names += (names.empty() ? "" : ", ") + std::string(k.name);
  return names;
}

early_stopping_spec default_early_stopping(const stop_rule_kind& kind) {
  early_stopping_spec s;
  s.type = kind.name;
  for (const auto& setting : kind.settings) s.settings[setting.name] = setting.default_value;
  return s;
}

std::string set_early_stopping(early_stopping_spec& spec, const std::string& key, std::int64_t value) {
  const stop_rule_kind* kind = find_stop_rule(spec.type);
  if (!kind) return "unknown scheduler '" + spec.type + "'";
  for (const auto& setting : kind->settings) {
    if (key != setting.name) continue;
    if (value < setting.least)
      return key + " must be a whole number, at least " + std::to_string(setting.least) + " (" + setting.means + ")";
    spec.settings[key] = value;
    return "";
  }
  std::string known;
  for (const auto& setting : kind->settings) known += (known.empty() ? "" : ", ") + std::string(setting.name);
  return "unknown setting '" + key + "' for " + spec.type + "; known: " + known;
}

std::string early_stopping_problem(const early_stopping_spec& s) {
  if (!s) return "";
  const stop_rule_kind* kind = find_stop_rule(s.type);
  if (!kind) {
    std::string known;
    for (const auto& k : stop_rule_kinds())
      known += (known.empty() ? "" : ", ") + std::string(k.name) + " (" + k.about + ")";
    return "unknown scheduler '" + s.type + "'; known: " + known;
  }
  for (const auto& setting : kind->settings) {
    const auto it = s.settings.find(setting.name);
    if (it == s.settings.end()) return std::string("no ") + setting.name + " given";
    if (it->second < setting.least)
      return std::string(setting.name) + " must be a whole number, at least " + std::to_string(setting.least) + " (" +
             setting.means + ")";
  }
  return kind->problem ? kind->problem(s) : "";
}

std::unique_ptr<stop_rule> make_stop_rule(const early_stopping_spec& spec) {
  const stop_rule_kind* kind = find_stop_rule(spec.type);
  if (!kind) throw std::invalid_argument("no early-stopping rule named '" + spec.type + "'");
  return kind->make(spec);
}

std::vector<std::int64_t> stop_rule_rungs(const early_stopping_spec& spec) {
  const stop_rule_kind* kind = find_stop_rule(spec.type);
  if (!kind || !kind->rungs || !early_stopping_problem(spec).empty()) return {};
  return kind->rungs(spec);
}

nlohmann::json early_stopping_json(const early_stopping_spec& spec) {
  if (!spec) return nullptr;
  nlohmann::json j = {{"type", spec.type}};
  for (const auto& [key, value] : spec.settings) j[key] = value;
  return j;
}

early_stopping_spec early_stopping_from_json(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) return {};
  const stop_rule_kind* kind = find_stop_rule(j["type"].get<std::string>());
  if (!kind) return {};
  early_stopping_spec s = default_early_stopping(*kind);
  for (auto& [key, value] : s.settings)
    if (const auto it = j.find(key); it != j.end() && it->is_number_integer()) value = it->get<std::int64_t>();
  return s;
}

// The --scheduler flag: the registry's rows are its help and its grammar.
const std::string& scheduler_flag_help() {
  static const std::string help = [] {
    std::string rules;
    for (const auto& k : stop_rule_kinds()) {
      rules += (rules.empty() ? "" : ", ") + std::string(k.name) + " (" + k.about;
      for (std::size_t i = 0; i < k.settings.size(); ++i) rules += (i ? ", " : "; ") + std::string(k.settings[i].name);
      rules += ")";
    }
    return "stop bad trials early on the steps they report: " + rules +
           "; e.g. asha:max_t=81,reduction_factor=3; none turns the spec's off";
  }();
  return help;
}

early_stopping_spec parse_scheduler_flag(const std::string& text) {
  const auto colon = text.find(':');
  const std::string type = text.substr(0, colon);
  if (type == "none") return {};
  auto bad = [&](const std::string& why) {
    return spec_error("--scheduler " + text + ": " + why +
                          " (e.g. --scheduler asha:max_t=81,grace_period=1,reduction_factor=3 or --scheduler "
                          "median:grace_period=5,min_samples=3)",
                      0);
  };
  const stop_rule_kind* kind = find_stop_rule(type);
  if (!kind) throw bad("unknown scheduler '" + type + "'; known: " + stop_rule_names() + ", none");
  early_stopping_spec e = default_early_stopping(*kind);
  for (std::size_t at = colon; at != std::string::npos && at < text.size();) {
    const auto end = text.find(',', at + 1);
    const std::string item = text.substr(at + 1, end == std::string::npos ? std::string::npos : end - at - 1);
    at = end;
    const auto eq = item.find('=');
    const std::string key = item.substr(0, eq), value = eq == std::string::npos ? "" : item.substr(eq + 1);
    long long n = 0;
    std::size_t used = 0;
    try {
      n = std::stoll(value, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (value.empty() || used != value.size() || n < 0 || n > (1LL << 40))
      throw bad("'" + item + "' is not KEY=WHOLE_NUMBER");
    if (const std::string why = set_early_stopping(e, key, n); !why.empty()) throw bad(why);
  }
  if (const std::string why = early_stopping_problem(e); !why.empty()) throw bad(why);
  return e;
}

}  // namespace isorun::sweep
