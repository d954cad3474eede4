// The parts of a spec that are not YAML: flags, locations, parameter words.
#include "isorun/sweep/spec.hpp"

#include <algorithm>

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

std::string subject(const sweep_spec& s) {
  if (!s.python.empty()) return "python:" + s.python;
  if (s.command.empty()) return s.task;
  std::string text;
  for (const auto& w : s.command) text += (text.empty() ? "" : " ") + w;
  return text;
}

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
