// A sweep of any command (`command: [python3, train.py, --lr, "{lr}"]`): each trial runs the
// command with its parameters in place of the placeholders, as a process of its own under the
// trial's cap; its result is the last JSON line of its stdout (or $ISORUN_RESULT).
#include <algorithm>
#include <filesystem>
#include <set>

#include "isorun/runner/process.hpp"
#include "isorun/runner/suggest.hpp"
#include "trials/trial_program.hpp"

namespace isorun::sweep {
namespace {
namespace fs = std::filesystem;

class command_trials final : public trial_program {
 public:
  using trial_program::trial_program;

  std::string subject() const override {
    std::string text;
    for (const auto& w : s_.command) text += (text.empty() ? "" : " ") + w;
    return text;
  }

  // The command's script (python3 train.py: train), or its program.
  std::string short_name() const override {
    for (std::size_t i = 1; i < s_.command.size(); ++i) {
      std::error_code ec;
      if (s_.command[i].find('{') == std::string::npos && fs::is_regular_file(s_.command[i], ec))
        return fs::path(s_.command[i]).stem().string();
    }
    return fs::path(s_.command[0]).filename().string();
  }

  // Placeholders and parameters that do not match, a program that cannot be found.
  void check() const override {
    const std::vector<std::string> params = parameter_names(s_);
    const std::vector<std::string> used = placeholders(s_.command);
    for (const auto& name : used)
      if (std::find(params.begin(), params.end(), name) == params.end())
        throw located(s_, s_.command_line,
                      "command placeholder {" + name + "} names no parameter" + did_you_mean(name, params) +
                          "; parameters: " + name_list(params));
    for (const auto& name : params)
      if (std::find(used.begin(), used.end(), name) == used.end()) {
        const auto line = s_.param_lines.find(name);
        throw located(s_, line == s_.param_lines.end() ? 0 : line->second,
                      "parameter '" + name + "' is not used by the command; put {" + name +
                          "} where the program takes it (e.g. --" + name + " {" + name + "})");
      }
    std::set<std::string> programs;
    for (const auto& t : s_.trials) programs.insert(command_for(s_.command, t).front());
    for (const auto& program : programs)
      if (!runner::find_executable(program))
        throw located(s_, s_.command_line,
                      "command not found: '" + program + "' (not an executable file, nor found in PATH)");
  }

  bool in_worker() const override { return false; }

  std::string no_result_hint(const std::string& metric, const std::string& whose) const override {
    return "metric '" + metric + "': " + whose +
           " printed no JSON object as a line of its stdout and wrote none to $ISORUN_RESULT; a command reports "
           "its result as one line of JSON, e.g. {\"" +
           metric + "\": 0.93}";
  }
};

}  // namespace

std::unique_ptr<trial_program> command_program(const sweep_spec& s) { return std::make_unique<command_trials>(s); }

}  // namespace isorun::sweep
