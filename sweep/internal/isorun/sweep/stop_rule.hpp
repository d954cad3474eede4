#pragma once
/// @file stop_rule.hpp
/// Early stopping's decision, as the sweep sees it: trials report a metric at steps, and a rule
/// says after each report whether that trial goes on. Pure logic: no clock, no files, no
/// threads, so that replaying the reports a sweep journaled, in their order, rebuilds exactly
/// the state the rule had (what makes a resumed sweep decide as an uninterrupted one would).

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace isorun::sweep {

struct early_stopping_spec;

class stop_rule {
 public:
  virtual ~stop_rule() = default;
  /// @brief Trial `id` reported `value` at `step`; lower is better (the caller negates a metric
  ///        to maximize). NaN counts as the worst value.
  /// @return true if the trial should stop now. A trial that repeats a step it already reported
  ///         (a resumed sweep runs an interrupted trial again from its start) is judged as it
  ///         was the first time where the rule keeps that judgement (ASHA's rungs).
  virtual bool report(const std::string& id, std::int64_t step, double value) = 0;
};

// The registry: every rule a sweep can name, one row each. The spec's parsers (YAML and
// --scheduler), its checks, sweep.json and the report all work from these rows, so a new rule
// is its own file and one row in stop_rule.cpp.

/// One setting of a rule: a whole number, at least `least`.
struct stop_rule_setting {
  const char* name;
  std::int64_t default_value;
  std::int64_t least;
  const char* means;  ///< what it is, for messages: "the first rung", "η: a trial goes on ..."
};

/// A rule as the sweep knows it.
struct stop_rule_kind {
  const char* name;   ///< as specs name it: "asha"
  const char* about;  ///< "asynchronous successive halving"
  std::vector<stop_rule_setting> settings;
  /// What is wrong across its settings ("" if nothing); each is in its range already.
  std::string (*problem)(const early_stopping_spec&);
  std::unique_ptr<stop_rule> (*make)(const early_stopping_spec&);
  /// The steps where it compares trials, for the report to mark (none: the rule has no rungs).
  std::vector<std::int64_t> (*rungs)(const early_stopping_spec&);
};

/// Every rule, in the order messages list them.
const std::vector<stop_rule_kind>& stop_rule_kinds();
/// The rule named `name`; nullptr if there is none.
const stop_rule_kind* find_stop_rule(std::string_view name);
/// "asha, median, hyperband": the rules' names, for messages.
std::string stop_rule_names();

/// @brief `type` with every setting at its default (`type` a rule's name).
early_stopping_spec default_early_stopping(const stop_rule_kind& kind);
/// @brief Sets `key` of `spec` to `value`; "" if done, else what is wrong (an unknown setting,
///        with the known ones, or a value below the setting's least).
std::string set_early_stopping(early_stopping_spec& spec, const std::string& key, std::int64_t value);

/// @brief The rule `spec` names. @throws std::invalid_argument for an unknown name.
std::unique_ptr<stop_rule> make_stop_rule(const early_stopping_spec& spec);
/// @brief The steps the rule compares trials at (the report's rung lines); none for no rule.
std::vector<std::int64_t> stop_rule_rungs(const early_stopping_spec& spec);

/// @brief As sweep.json keeps it: {"type": NAME, SETTING: VALUE, ...}; null for none.
nlohmann::json early_stopping_json(const early_stopping_spec& spec);
/// @brief Back from sweep.json: a known rule's settings (missing ones at their defaults);
///        type "" for null, an unknown rule or anything else.
early_stopping_spec early_stopping_from_json(const nlohmann::json& j);

}  // namespace isorun::sweep
