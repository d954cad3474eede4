// The parts of a spec that are not YAML: flags, locations, parameter words.
#include "isorun/sweep/spec.hpp"

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

std::vector<std::string> param_words(const nlohmann::json& params) {
  std::vector<std::string> words;
  for (auto it = params.begin(); it != params.end(); ++it)
    words.push_back(it.key() + "=" + (it.value().is_string() ? it.value().get<std::string>() : it.value().dump()));
  return words;
}

}  // namespace isorun::sweep
