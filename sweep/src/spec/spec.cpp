// The parts of a spec that are not YAML: flags, locations, parameter words.
#include "isorun/sweep/spec.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "isorun/runner/units.hpp"

namespace isorun::sweep {

metric_spec parse_metric_flag(const std::string& text) {
  metric_spec m;
  const auto colon = text.rfind(':');
  m.name = text.substr(0, colon);
  if (colon != std::string::npos) {
    const std::string goal = text.substr(colon + 1);
    if (goal == "min" || goal == "minimize") m.maximize = false;
    else if (goal != "max" && goal != "maximize")
      throw spec_error("--metric " + text + ": the goal after ':' is min or max", 0);
  }
  if (m.name.empty()) throw spec_error("--metric " + text + ": expected NAME[:min|max], e.g. accuracy:max", 0);
  return m;
}

oom_retry_spec parse_oom_retry_flag(const std::string& text) {
  auto bad = [&](const std::string& why) {
    return spec_error("--oom-retry '" + text + "': " + why +
                          " (expected FACTOR:MAX[:ATTEMPTS], e.g. --oom-retry 2:16G or 1.5:16G:12)",
                      0);
  };
  const auto colon = text.find(':');
  if (colon == std::string::npos) throw bad("no ':' between the factor and the max");
  const std::string factor = text.substr(0, colon);
  std::string max = text.substr(colon + 1);
  oom_retry_spec r;
  if (const auto second = max.find(':'); second != std::string::npos) {
    const std::string attempts = max.substr(second + 1);
    max.resize(second);
    int n = 0;
    const auto [end, ec] = std::from_chars(attempts.data(), attempts.data() + attempts.size(), n);
    if (attempts.empty() || ec != std::errc{} || end != attempts.data() + attempts.size() || n < 2)
      throw bad("the attempts '" + attempts + "' are not a whole number of at least 2");
    r.max_attempts = n;
  }
  std::size_t used = 0;
  try {
    r.factor = std::stod(factor, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (factor.empty() || used != factor.size() || !std::isfinite(r.factor))
    throw bad("the factor '" + factor + "' is not a number");
  if (!(r.factor >= oom_retry_spec::min_factor))
    throw bad("the factor " + factor + " must be at least 1.1 (each retry gets a cap at least 10% larger)");
  if (max.empty()) throw bad("no max after ':'");
  try {
    r.max = parse_size(max);
  } catch (const parse_error& e) {
    throw bad("the max '" + max + "' is not a size: " + e.what());
  }
  if (r.max == 0) throw bad("the max must be above 0");
  return r;
}

std::uint64_t next_cap(const oom_retry_spec& r, std::uint64_t cap) {
  if (!r || cap == 0 || cap >= r.max) return 0;
  const double grown = std::ceil(static_cast<double>(cap) * r.factor);
  // (a double that reaches max is compared before it is converted: no conversion overflows)
  return grown >= static_cast<double>(r.max) ? r.max : std::max(cap + 1, static_cast<std::uint64_t>(grown));
}

spec_error located(const sweep_spec& s, int line, const std::string& what) {
  std::string where = s.source.empty() ? "" : s.source + ": ";
  if (line > 0) where += "line " + std::to_string(line) + ": ";
  return spec_error(where + what, line);
}

std::string value_text(const nlohmann::json& value) {
  return value.is_string() ? value.get<std::string>() : value.dump();
}

std::vector<std::string> param_words(const nlohmann::json& params) {
  std::vector<std::string> words;
  for (auto it = params.begin(); it != params.end(); ++it) words.push_back(it.key() + "=" + value_text(it.value()));
  return words;
}

namespace {

bool name_char(char c, bool first) {
  return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (!first && c >= '0' && c <= '9');
}

// The one reading of a command word: literal text, `{name}` as a placeholder (handed to
// `on_name`, whose return value takes its place), `{{` as a literal `{`; any other brace is
// literal, so JSON in an argument ({"a": {"b": 1}}) needs no escaping.
template <class OnName>
std::string expand(const std::string& word, OnName&& on_name) {
  std::string out;
  for (std::size_t i = 0; i < word.size(); ++i) {
    const char c = word[i];
    if (c == '{' && i + 1 < word.size() && word[i + 1] == '{') {
      out += c;
      ++i;
      continue;
    }
    if (c == '{' && i + 1 < word.size() && name_char(word[i + 1], true)) {
      std::size_t end = i + 1;
      while (end < word.size() && name_char(word[end], false)) ++end;
      if (end < word.size() && word[end] == '}') {
        out += on_name(word.substr(i + 1, end - i - 1));
        i = end;
        continue;
      }
    }
    out += c;
  }
  return out;
}

}  // namespace

std::vector<std::string> placeholders(const std::vector<std::string>& command) {
  std::vector<std::string> names;
  for (const auto& word : command)
    expand(word, [&](const std::string& name) {
      if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
      return std::string();
    });
  return names;
}

std::vector<std::string> command_for(const std::vector<std::string>& command, const nlohmann::json& params) {
  std::vector<std::string> argv;
  for (const auto& word : command)
    argv.push_back(expand(word, [&](const std::string& name) {
      if (!params.contains(name)) throw spec_error("command placeholder {" + name + "} names no parameter", 0);
      return value_text(params[name]);
    }));
  return argv;
}

}  // namespace isorun::sweep
