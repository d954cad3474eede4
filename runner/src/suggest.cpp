#include "isorun/runner/suggest.hpp"

#include <algorithm>

namespace isorun {
namespace {

// Edits (insert, delete, substitute, swap two neighbours) between a and b: `stpe` is one from
// `step`, as a typist would count it.
std::size_t edit_distance(std::string_view a, std::string_view b) {
  const std::size_t w = b.size() + 1;
  std::vector<std::size_t> d((a.size() + 1) * w);
  for (std::size_t i = 0; i <= a.size(); ++i) d[i * w] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i)
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t& here = d[i * w + j];
      here = std::min(
          {d[(i - 1) * w + j] + 1, d[i * w + j - 1] + 1, d[(i - 1) * w + j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        here = std::min(here, d[(i - 2) * w + j - 2] + 1);
    }
  return d[a.size() * w + b.size()];
}

bool is_separator(char c) { return c == '_' || c == '-' || c == '.'; }

}  // namespace

std::optional<std::string> closest_name(std::string_view word, const std::vector<std::string>& candidates) {
  std::optional<std::string> best;
  std::size_t best_distance = 0;
  for (const auto& c : candidates) {
    if (c.empty() || c == word) continue;
    const std::size_t d = edit_distance(word, c);
    // Typos: up to one edit per three characters (at least one, at most three).
    const std::size_t allowed = std::clamp<std::size_t>(std::max(word.size(), c.size()) / 3, 1, 3);
    const bool prefix = (word.size() > c.size() && word.substr(0, c.size()) == c && is_separator(word[c.size()])) ||
                        (c.size() > word.size() && std::string_view(c).substr(0, word.size()) == word &&
                         is_separator(c[word.size()]));
    if (d > allowed && !prefix) continue;
    if (!best || d < best_distance) {
      best = c;
      best_distance = d;
    }
  }
  return best;
}

std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates) {
  auto c = closest_name(word, candidates);
  return c ? " (did you mean '" + *c + "'?)" : "";
}

std::string name_list(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? std::string("none") : out;
}

}  // namespace isorun
