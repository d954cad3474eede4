#include "task_params.hpp"

#include <charconv>
#include <set>

#include "isorun/errors.hpp"

namespace isorun::cli {
namespace {

std::string type_word(const nlohmann::json& v) {
  if (v.is_boolean()) return "bool";
  if (v.is_number_integer()) return "integer";
  if (v.is_number()) return "number";
  if (v.is_string()) return "string";
  if (v.is_array()) return "JSON array";
  if (v.is_object()) return "JSON object";
  return "JSON";
}

std::string describe_parameters(const nlohmann::json& params) {
  if (params.empty()) return "it takes no parameters";
  std::string s = "its parameters: ";
  bool first = true;
  for (auto it = params.begin(); it != params.end(); ++it) {
    if (!first) s += ", ";
    first = false;
    s += it.key() + " (" + type_word(it.value()) + ", default " + it.value().dump() + ")";
  }
  return s;
}

}  // namespace

bool addressed_by_field(const nlohmann::json& defaults) {
  return defaults.size() == 1 && defaults.contains("arg0") && defaults["arg0"].is_object();
}

nlohmann::json task_parameters(const worker::task_info& task) {
  if (!task.default_args_json) return nlohmann::json::object();
  nlohmann::json defaults = nlohmann::json::parse(task.default_args_json());
  return addressed_by_field(defaults) ? defaults["arg0"] : defaults;
}

nlohmann::json coerce_value(const std::string& key, const std::string& text, const nlohmann::json& like) {
  auto bad = [&](const std::string& expected) {
    return usage_error("parameter " + key + "='" + text + "': expected " + expected);
  };
  if (like.is_string()) return text;
  if (like.is_boolean()) {
    if (text == "true" || text == "1" || text == "yes" || text == "on") return true;
    if (text == "false" || text == "0" || text == "no" || text == "off") return false;
    throw bad("true or false");
  }
  if (like.is_number_integer()) {
    // JSON does not tell int from unsigned (nlohmann reads every non-negative literal as
    // unsigned), so accept any integer; cereal range-checks it against the field's type.
    std::int64_t v{};
    auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec == std::errc{} && p == text.data() + text.size()) return v;
    std::uint64_t u{};
    auto [p2, ec2] = std::from_chars(text.data(), text.data() + text.size(), u);
    if (ec2 == std::errc{} && p2 == text.data() + text.size()) return u;
    throw bad("an integer");
  }
  if (like.is_number()) {
    double v{};
    auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc{} || p != text.data() + text.size()) throw bad("a number");
    return v;
  }
  nlohmann::json parsed = nlohmann::json::parse(text, nullptr, false);
  if (parsed.is_discarded()) throw bad("valid JSON (" + type_word(like) + ")");
  if (!like.is_null() && parsed.type() != like.type()) throw bad(type_word(like));
  return parsed;
}

nlohmann::json build_task_args(const worker::task_info& task, const std::vector<std::string>& words) {
  if (!task.default_args_json)
    throw usage_error("task '" + task.name +
                      "' cannot be called from the command line: its argument types are not default-constructible");
  nlohmann::json defaults = nlohmann::json::parse(task.default_args_json());
  const bool by_field = addressed_by_field(defaults);
  nlohmann::json& params = by_field ? defaults["arg0"] : defaults;
  std::set<std::string> seen;
  for (const auto& word : words) {
    const auto eq = word.find('=');
    if (eq == std::string::npos || eq == 0)
      throw usage_error("argument '" + word + "' is not key=value; " + describe_parameters(params));
    const std::string key = word.substr(0, eq), text = word.substr(eq + 1);
    if (!params.contains(key))
      throw usage_error("task '" + task.name + "' has no parameter '" + key + "'; " + describe_parameters(params));
    if (!seen.insert(key).second) throw usage_error("parameter '" + key + "' is given twice");
    params[key] = coerce_value(key, text, params[key]);
  }
  return defaults;
}

}  // namespace isorun::cli
