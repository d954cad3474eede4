#pragma once
/// @file bounded_json.hpp
/// JSON that isorun did not write (a trial's result or report line, $ISORUN_RESULT, a task's
/// result, the files of a sweep's folder), parsed with a bound on its nesting. Copying, dumping
/// and comparing a parsed value recurse once per level, so a line of a few hundred KB nested
/// a hundred thousand deep would overflow the stack of whichever thread touches it next (the
/// sweep's supervisor): such a line is refused when it is parsed, as malformed JSON is.

#include <istream>
#include <iterator>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace isorun {

/// The deepest nesting (objects and arrays inside each other) accepted in JSON from outside:
/// far more than any result, report or record needs, far less than a stack can hold.
inline constexpr int max_json_depth = 64;

/// @brief `text` parsed as JSON, or a discarded value (`is_discarded()`) if it is not JSON or is
///        nested deeper than max_json_depth; `too_deep`, if given, says which of the two.
inline nlohmann::json parse_bounded_json(std::string_view text, bool* too_deep = nullptr) {
  struct nested_too_deep {};
  if (too_deep) *too_deep = false;
  try {
    // The callback is told the depth of each object or array as it opens (0 for the outermost):
    // the parse stops at the first one past the bound, before anything deeper is built.
    return nlohmann::json::parse(
        text,
        [](int depth, nlohmann::json::parse_event_t event, nlohmann::json&) {
          if ((event == nlohmann::json::parse_event_t::object_start ||
               event == nlohmann::json::parse_event_t::array_start) &&
              depth >= max_json_depth)
            throw nested_too_deep{};
          return true;
        },
        false);
  } catch (const nested_too_deep&) {
    if (too_deep) *too_deep = true;
    return nlohmann::json(nlohmann::json::value_t::discarded);
  }
}

/// @brief The same for what `in` holds (a file of a sweep's folder isorun wrote, which others
///        may have changed).
inline nlohmann::json parse_bounded_json(std::istream& in, bool* too_deep = nullptr) {
  return parse_bounded_json(std::string(std::istreambuf_iterator<char>(in), {}), too_deep);
}

}  // namespace isorun
