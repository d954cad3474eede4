#include "isorun/runner/task_arguments.hpp"

#include <algorithm>
#include <charconv>

#include "isorun/runner/bounded_json.hpp"
#include "isorun/runner/errors.hpp"
#include "isorun/runner/suggest.hpp"

namespace isorun::runner::arguments {
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

// cereal reports a JSON number that does not fit the field as a failed RapidJSON assertion
// naming the type flag it wanted; say that in words.
std::string decode_failure(const std::string& what) {
  static const std::pair<const char*, const char*> flags[] = {{"kIntFlag", "a 32-bit integer"},
                                                              {"kUintFlag", "a 32-bit unsigned integer"},
                                                              {"kInt64Flag", "a 64-bit integer"},
                                                              {"kUint64Flag", "a 64-bit unsigned integer"}};
  for (const auto& [flag, type] : flags)
    if (what.find(flag) != std::string::npos) return std::string("out of range for the task's type (") + type + ")";
  return what;
}

}  // namespace

std::size_t utf8_error_at(std::string_view s) {
  const auto* text = reinterpret_cast<const unsigned char*>(s.data());
  for (std::size_t at = 0; at < s.size();) {
    const unsigned c = text[at];
    if (c < 0x80) {
      ++at;
      continue;
    }
    // The lead byte says how many continuation bytes follow and the least code point they may
    // encode (anything less is an overlong form).
    const std::size_t more = (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2 : (c & 0xF8) == 0xF0 ? 3 : 0;
    if (more == 0 || s.size() - at <= more) return at;
    unsigned cp = c & (0x3F >> more);
    for (std::size_t i = 1; i <= more; ++i) {
      if ((text[at + i] & 0xC0) != 0x80) return at;
      cp = (cp << 6) | (text[at + i] & 0x3F);
    }
    const unsigned least = more == 1 ? 0x80 : more == 2 ? 0x800 : 0x10000;
    if (cp < least || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return at;
    at += more + 1;
  }
  return std::string_view::npos;
}

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
    return param_error("parameter " + key + "='" + text + "': expected " + expected, key);
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
    if (ec2 == std::errc::result_out_of_range || ec == std::errc::result_out_of_range)
      throw param_error("parameter " + key + "='" + text + "': out of range for a 64-bit integer", key);
    throw bad("an integer");
  }
  if (like.is_number()) {
    double v{};
    auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec == std::errc::result_out_of_range)
      throw param_error("parameter " + key + "='" + text + "': out of range for a double", key);
    if (ec != std::errc{} || p != text.data() + text.size()) throw bad("a number");
    return v;
  }
  nlohmann::json parsed = parse_bounded_json(text);
  if (parsed.is_discarded()) throw bad("valid JSON (" + type_word(like) + ")");
  if (!like.is_null() && parsed.type() != like.type()) throw bad(type_word(like));
  return parsed;
}

nlohmann::json build_task_args(const worker::task_info& task, const std::vector<std::string>& words) {
  if (!task.default_args_json)
    throw usage_error("task '" + task.name +
                      "' cannot be called from the command line: its argument types are not default-constructible");
  const nlohmann::json pristine = nlohmann::json::parse(task.default_args_json());
  nlohmann::json defaults = pristine;
  const bool by_field = addressed_by_field(defaults);
  nlohmann::json& params = by_field ? defaults["arg0"] : defaults;
  std::vector<std::string> names;
  for (auto it = params.begin(); it != params.end(); ++it) names.push_back(it.key());
  std::vector<std::pair<std::string, nlohmann::json>> given;
  for (std::size_t i = 0; i < words.size(); ++i) {
    const std::string& word = words[i];
    if (utf8_error_at(word) !=
        std::string_view::npos)  // said without the word itself: its bytes cannot be printed as text
      throw param_error("argument " + std::to_string(i + 1) + " of the task is not valid UTF-8 text", "");
    const auto eq = word.find('=');
    if (eq == std::string::npos || eq == 0)
      throw param_error("argument '" + word + "' is not key=value; " + describe_parameters(params), "");
    const std::string key = word.substr(0, eq), text = word.substr(eq + 1);
    if (!params.contains(key))
      throw param_error("task '" + task.name + "' has no parameter '" + key + "'" + did_you_mean(key, names) + "; " +
                            describe_parameters(params),
                        key);
    if (std::any_of(given.begin(), given.end(), [&](auto& g) { return g.first == key; }))
      throw param_error("parameter '" + key + "' is given twice", key);
    params[key] = coerce_value(key, text, params[key]);
    given.emplace_back(key, params[key]);
  }
  if (task.check_json_args) {
    // Decode as the worker will, so a value that fits JSON but not the C++ field (3000000000 for
    // an int) is a usage error now rather than a task error later; then find the culprit.
    try {
      task.check_json_args(defaults.dump());
    } catch (const std::exception& whole) {
      for (const auto& [key, value] : given) {
        nlohmann::json one = pristine;
        (by_field ? one["arg0"] : one)[key] = value;
        try {
          task.check_json_args(one.dump());
        } catch (const std::exception& e) {
          throw param_error("parameter " + key + "=" + value.dump() + ": " + decode_failure(e.what()), key);
        }
      }
      throw usage_error("task '" + task.name +
                        "': the arguments do not fit its types: " + decode_failure(whole.what()));
    }
  }
  return defaults;
}

}  // namespace isorun::runner::arguments
