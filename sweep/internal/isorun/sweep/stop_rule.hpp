#pragma once
/// @file stop_rule.hpp
/// Early stopping's rules as the sweep knows them: a registry, one row per rule, from which the
/// spec's parsers, its checks, sweep.json and the report all work. What a rule is, and why it is
/// pure logic, is in stop_rule_base.hpp.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "isorun/sweep/stop_rule_base.hpp"

namespace isorun::sweep {

struct early_stopping_spec;

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
