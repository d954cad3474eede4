// A sweep of a C++ task (`task: NAME`): each trial is the task in a fresh isorun worker (this
// program, or --tasks libraries), its parameters checked against the task's up front.
#include <algorithm>

#include "isorun/runner/errors.hpp"
#include "isorun/runner/suggest.hpp"
#include "isorun/runner/task_arguments.hpp"
#include "isorun/worker/task.hpp"
#include "trials/trial_program.hpp"

namespace isorun::sweep {
namespace {

class task_trials final : public trial_program {
 public:
  using trial_program::trial_program;

  std::string subject() const override { return s_.task; }
  std::string short_name() const override { return s_.task; }

  void check() const override {
    if (!find()) {
      std::vector<std::string> names;
      for (auto* t : worker::registry::instance().all()) names.push_back(t->name);
      throw located(s_, 0,
                    "unknown task '" + s_.task + "'" + did_you_mean(s_.task, names) +
                        " (load its library with --tasks LIB.so; isorun tasks lists them)");
    }
    for (const auto& params : s_.trials) (void)request(params);
  }

  std::string request(const nlohmann::json& params) const override {
    const worker::task_info* task = find();
    if (!task) throw located(s_, 0, "unknown task '" + s_.task + "'");
    try {
      return runner::arguments::build_task_args(*task, param_words(params)).dump();
    } catch (const runner::arguments::param_error& e) {
      const auto line = s_.param_lines.find(e.key());
      throw located(s_, line == s_.param_lines.end() ? 0 : line->second, e.what());
    } catch (const usage_error& e) {
      throw located(s_, 0, e.what());
    }
  }

  std::optional<nlohmann::json> result_shape() const override {
    const worker::task_info* task = find();
    if (!task || !task->default_result_json) return std::nullopt;
    return nlohmann::json::parse(task->default_result_json())["result"];
  }

  bool uses_isorun_allocator() const override { return true; }
  std::string worker_task() const override { return s_.task; }

 private:
  const worker::task_info* find() const { return worker::registry::instance().find(s_.task); }
};

}  // namespace

std::unique_ptr<trial_program> task_program(const sweep_spec& s) { return std::make_unique<task_trials>(s); }

}  // namespace isorun::sweep
