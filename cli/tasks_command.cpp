#include "tasks_command.hpp"

#include <algorithm>
#include <iostream>

#include <nlohmann/json.hpp>

#include "isorun/runner/task_arguments.hpp"
#include "isorun/worker/task.hpp"

namespace isorun::cli {

int list_tasks(const cli_options& o) {
  using nlohmann::json;
  auto tasks = worker::registry::instance().all();
  std::sort(tasks.begin(), tasks.end(), [](auto* a, auto* b) { return a->name < b->name; });
  if (o.json) {
    json out = json::array();
    for (auto* t : tasks)
      out.push_back({{"name", t->name},
                     {"arguments", t->arg_types},
                     {"result", t->result_type},
                     {"parameters", runner::arguments::task_parameters(*t)}});
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  if (tasks.empty()) {
    std::cout << "no tasks registered (load a task library with --tasks LIB.so)\n";
    return 0;
  }
  for (auto* t : tasks) {
    std::string kinds;
    for (std::size_t i = 0; i < t->arg_types.size(); ++i) kinds += (i ? ", " : "") + t->arg_types[i];
    std::cout << t->name << "(" << kinds << ") -> " << t->result_type << "\n";
    const json params = runner::arguments::task_parameters(*t);
    for (auto it = params.begin(); it != params.end(); ++it)
      std::cout << "    " << it.key() << "=" << it.value().dump() << "\n";
  }
  return 0;
}

}  // namespace isorun::cli
