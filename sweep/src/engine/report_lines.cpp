#include "isorun/sweep/report_lines.hpp"

#include "isorun/runner/bounded_json.hpp"

namespace isorun::sweep {

namespace {
// The JSON object `line` holds (spaces around it aside), and its field `key`, a whole number of 0
// or more; nullopt for any other line. The key is looked for before the line is parsed.
std::optional<std::pair<std::int64_t, nlohmann::json>> object_with(std::string_view line, const std::string& key) {
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.remove_suffix(1);
  while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
  if (line.empty() || line.front() != '{' || line.find('"' + key + '"') == std::string_view::npos) return std::nullopt;
  nlohmann::json j = parse_bounded_json(line);
  if (!j.is_object()) return std::nullopt;
  const auto field = j.find(key);
  if (field == j.end() || !field->is_number_integer() || field->get<std::int64_t>() < 0) return std::nullopt;
  const std::int64_t at = field->get<std::int64_t>();
  return std::make_pair(at, std::move(j));
}
}  // namespace

std::optional<std::pair<std::int64_t, nlohmann::json>> report_line(std::string_view line) {
  auto r = object_with(line, "step");
  if (r) r->second.erase("step");
  return r;
}

std::optional<std::int64_t> checkpoint_line(std::string_view line) {
  const auto r = object_with(line, "checkpoint");
  return r ? std::optional<std::int64_t>(r->first) : std::nullopt;
}

void report_lines::feed(const char* p, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    if (p[i] != '\n') {
      if (!too_long) line += p[i];
      if (line.size() > max_line) {
        too_long = true;
        line.clear();
      }
      continue;
    }
    if (!too_long) {
      // (One line may do both: {"step": 10, "loss": 0.3, "checkpoint": 10}; the checkpoint first,
      // so that a stop the report brings finds it committed.)
      if (on_checkpoint)
        if (auto step = checkpoint_line(line)) on_checkpoint(*step);
      if (auto r = report_line(line)) {
        r->second.erase("checkpoint");
        on_report(r->first, std::move(r->second));
      }
    }
    line.clear();
    too_long = false;
  }
}

}  // namespace isorun::sweep
