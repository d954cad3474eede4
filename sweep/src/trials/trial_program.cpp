#include "trials/trial_program.hpp"

#include <set>

namespace isorun::sweep {

// The one place a spec's kind of trials is told apart.
std::unique_ptr<trial_program> program_of(const sweep_spec& s) {
  if (!s.python.empty()) return python_program(s);
  if (!s.command.empty()) return command_program(s);
  return task_program(s);
}

std::vector<std::string> parameter_names(const sweep_spec& s) {
  std::vector<std::string> names;
  std::set<std::string> seen;
  for (const auto& trial : s.trials)
    for (const auto& [name, value] : trial.items())
      if (seen.insert(name).second) names.push_back(name);
  return names;
}

// Declared with the spec (spec.hpp): what trial ids derive from is each kind of trial's to say.
std::string subject(const sweep_spec& s) { return program_of(s)->subject(); }

}  // namespace isorun::sweep
