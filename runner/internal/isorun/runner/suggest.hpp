#pragma once
// "Did you mean ...?" for names a user typed: tasks, parameters, spec keys, flags.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "isorun/internal_api.hpp"

namespace isorun {

/// @brief The candidate `word` most likely meant, if one is close: a small edit distance
///        (typos: `helo` → `hello`), or a candidate that is a prefix of `word` up to a separator
///        (`lr_rate` → `lr`). nullopt if none is close enough to suggest.
std::optional<std::string> closest_name(std::string_view word, const std::vector<std::string>& candidates);

/// @brief " (did you mean 'hello'?)" for closest_name's answer, or "".
ISORUN_INTERNAL_API std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates);

/// @brief The names a message offers instead: "a, b, c", or "none".
ISORUN_INTERNAL_API std::string name_list(const std::vector<std::string>& names);

}  // namespace isorun
