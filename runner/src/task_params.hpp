#pragma once
// Turning `key=value` words into a task's JSON arguments, checked against the task's signature.

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "isorun/task.hpp"

namespace isorun::cli {

/// @brief Builds the JSON arguments (`{"arg0": ...}`) for `task` from `key=value` words. A task
///        taking one struct is addressed by field (`lr=0.1`); otherwise by `arg0=...`. Values
///        are converted to the type of the default value (number, bool, string, JSON).
/// @throws usage_error for a word without '=', an unknown or repeated key, or a value of the
///         wrong type; the message lists the task's parameters.
nlohmann::json build_task_args(const worker::task_info& task, const std::vector<std::string>& words);

/// @brief The task's parameters with their defaults, as accepted by build_task_args (an object;
///        empty if the task cannot be called from the CLI).
nlohmann::json task_parameters(const worker::task_info& task);

/// @brief True if the task's arguments take the one-struct-by-field form.
bool addressed_by_field(const nlohmann::json& defaults);

/// @brief Converts `text` to the JSON type of `like`. @throws usage_error naming `key`.
nlohmann::json coerce_value(const std::string& key, const std::string& text, const nlohmann::json& like);

}  // namespace isorun::cli
