#pragma once
// Turning `key=value` words into a task's JSON arguments, checked against the task's signature.

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "isorun/internal_api.hpp"
#include "isorun/runner/errors.hpp"
#include "isorun/worker/task.hpp"

namespace isorun::runner::arguments {

/// A `key=value` argument that does not fit the task; `key()` names the parameter ("" when the
/// word is not key=value at all), so a sweep spec can point at the parameter's line.
class ISORUN_INTERNAL_API param_error : public usage_error {
 public:
  param_error(const std::string& what, std::string key) : usage_error(what), key_{std::move(key)} {}
  [[nodiscard]] const std::string& key() const noexcept { return key_; }

 private:
  std::string key_;
};

/// @brief Builds the JSON arguments (`{"arg0": ...}`) for `task` from `key=value` words. A task
///        taking one struct is addressed by field (`lr=0.1`); otherwise by `arg0=...`. Values
///        are converted to the type of the default value (number, bool, string, JSON).
/// @brief Where `text` stops being well-formed UTF-8 (an overlong form, a surrogate, a code point
///        past U+10FFFF, a cut sequence), or npos if it is. Arguments and specs become JSON text,
///        which must be UTF-8.
ISORUN_INTERNAL_API std::size_t utf8_error_at(std::string_view text);

/// @throws param_error for a word without '=', an unknown (with "did you mean") or repeated key,
///         a value of the wrong type, or one out of range for the task's C++ type (checked by
///         decoding the arguments as the worker would); the message lists the parameters.
ISORUN_INTERNAL_API nlohmann::json build_task_args(const worker::task_info& task,
                                                   const std::vector<std::string>& words);

/// @brief The task's parameters with their defaults, as accepted by build_task_args (an object;
///        empty if the task cannot be called from the CLI).
ISORUN_INTERNAL_API nlohmann::json task_parameters(const worker::task_info& task);

/// @brief True if the task's arguments take the one-struct-by-field form.
bool addressed_by_field(const nlohmann::json& defaults);

/// @brief Converts `text` to the JSON type of `like`. @throws param_error naming `key`.
nlohmann::json coerce_value(const std::string& key, const std::string& text, const nlohmann::json& like);

}  // namespace isorun::runner::arguments
