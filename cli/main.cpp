// isorun: the command-line supervisor. Also serves as its own worker and shim when re-executed.
#include <dirent.h>
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_args.hpp"
#include "isorun/runner/containment.hpp"
#include "run_command.hpp"
#include "isorun/runner/errors.hpp"
#include "isorun/runner/gpu_inventory.hpp"
#include "isorun/serialization/whole_file.hpp"
#include "isorun/sweep/html_report.hpp"
#include "isorun/sweep/journal.hpp"
#include "isorun/alloc/config.hpp"
#include "isorun/worker/init.hpp"
#include "isorun/runner/job.hpp"
#include "isorun/runner/placement.hpp"
#include "isorun/runner/printable.hpp"
#include "isorun/runner/outcome.hpp"
#include "isorun/runner/process.hpp"
#include "isorun/worker/task.hpp"
#include "isorun/runner/units.hpp"
#include "isorun/runner/suggest.hpp"
#include "isorun/runner/task_arguments.hpp"

#ifndef ISORUN_TASK_DIR
#define ISORUN_TASK_DIR "lib/isorun/tasks"
#endif

namespace isorun::cli {
int run_sweep(const cli_options& opts, const std::vector<std::string>& libraries);
/// isorun status OUT: a sweep's progress, from its folder (and squeue for Slurm arrays).
int show_status(const cli_options& opts);
}

namespace {
using namespace isorun;
using nlohmann::json;
namespace fs = std::filesystem;

// Task libraries: --tasks, then ISORUN_TASKS, then every .so in <exe>/../lib/isorun/tasks.
std::vector<std::string> task_libraries(const cli::cli_options& o) {
  std::vector<std::string> libs;
  for (const auto& l : o.task_libraries) {
    std::error_code ec;
    if (!fs::exists(l, ec)) throw usage_error("--tasks " + l + ": no such file");
    libs.push_back(fs::absolute(l).string());
  }
  if (const char* env = std::getenv("ISORUN_TASKS"); env && *env) {
    std::string s = env;
    for (std::size_t start = 0; start <= s.size();) {
      auto end = s.find(':', start);
      if (end == std::string::npos) end = s.size();
      if (end > start) {
        std::string l = s.substr(start, end - start);
        std::error_code ec;
        if (!fs::exists(l, ec)) throw usage_error("ISORUN_TASKS entry " + l + ": no such file");
        libs.push_back(fs::absolute(l).string());
      }
      start = end + 1;
    }
  }
  const fs::path dir = fs::path(runner::self_executable()).parent_path().parent_path() / ISORUN_TASK_DIR;
  std::error_code ec;
  std::vector<std::string> found;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.path().extension() == ".so") found.push_back(entry.path().string());
  std::sort(found.begin(), found.end());
  for (auto& f : found)
    if (std::find(libs.begin(), libs.end(), f) == libs.end()) libs.push_back(std::move(f));
  return libs;
}

void load_libraries(const std::vector<std::string>& libs) {
  for (const auto& l : libs) {
    try {
      if (!::dlopen(l.c_str(), RTLD_NOW | RTLD_GLOBAL))
        throw usage_error(std::string("cannot load task library: ") + ::dlerror());
    } catch (const std::logic_error& e) {  // duplicate task names
      throw usage_error(e.what());
    }
  }
}

std::string json_kind(const std::vector<std::string>& types) {
  std::string s;
  for (std::size_t i = 0; i < types.size(); ++i) s += (i ? ", " : "") + types[i];
  return s;
}

int list_tasks(const cli::cli_options& o) {
  auto tasks = worker::registry::instance().all();
  std::sort(tasks.begin(), tasks.end(), [](auto* a, auto* b) { return a->name < b->name; });
  if (o.json) {
    json out = json::array();
    for (auto* t : tasks)
      out.push_back({{"name", t->name},
                     {"arguments", t->arg_types},
                     {"result", t->result_type},
                     {"parameters", cli::task_parameters(*t)}});
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  if (tasks.empty()) {
    std::cout << "no tasks registered (load a task library with --tasks LIB.so)\n";
    return 0;
  }
  for (auto* t : tasks) {
    std::cout << t->name << "(" << json_kind(t->arg_types) << ") -> " << t->result_type << "\n";
    json params = cli::task_parameters(*t);
    for (auto it = params.begin(); it != params.end(); ++it)
      std::cout << "    " << it.key() << "=" << it.value().dump() << "\n";
  }
  return 0;
}

int list_gpus(const cli::cli_options& o) {
  const auto inv = runner::gpu_inventory::detect();
  const auto& contained = runner::containment();
  if (o.json) {
    json out = {{"source", inv.describe_source()}, {"gpus", json::array()}};
    for (const auto& g : inv.gpus)
      out["gpus"].push_back({{"index", g.index}, {"uuid", g.uuid}, {"name", g.name},
                             {"total_memory", g.total_memory}, {"free_memory", g.free_memory}});
    out["containment"] = contained.cgroup
                             ? json{{"mode", "cgroup"}, {"where", contained.where}, {"memory_peak", contained.memory_peak}}
                             : json{{"mode", "process_group"}, {"reason", contained.why_not}};
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  std::cout << "GPU inventory: " << inv.describe_source() << "\n";
  if (inv.gpus.empty()) std::cout << "no GPUs; tasks run with --cpu (or set ISORUN_SIMULATE_GPUS=2x16G to simulate)\n";
  for (const auto& g : inv.gpus)
    std::cout << "  " << g.index << "  " << g.uuid << "  " << g.name << "  " << format_size(g.total_memory) << " total, "
              << format_size(g.free_memory) << " free\n";
  if (contained.cgroup)
    std::cout << "containment: a cgroup v2 per worker (under " << std::filesystem::path(contained.where).parent_path().string()
              << "), killed whole at its end" << (contained.memory_peak ? "; memory.peak reported" : "") << "\n";
  else
    std::cout << "containment: the process group alone (" << contained.why_not
              << "); a descendant that calls setsid() escapes it\n";
  return 0;
}

// The CLI runs on the first GPU unless told otherwise (--gpu N, --gpus, --cpu). One explicit
// GPU is looked up alone (from the inventory cache where it is current, else from NVML); the
// whole inventory is read only to choose, or to name the GPUs there are when one asked for is
// not.
std::vector<runner::gpu_info> pick_gpus(const cli::cli_options& o) {
  if (o.cpu) return {};
  const runner::gpu_request request{.indices = o.gpu ? std::vector<int>{*o.gpu} : o.gpus, .count = o.gpu_count};
  if (request.indices.size() == 1 && !request.count)
    if (auto g = runner::gpu_inventory::lookup(request.indices.front())) {
      runner::check_fits(*g, o.mem_limit);
      return {*g};
    }
  return runner::place_job(runner::gpu_inventory::detect(), request, true, o.mem_limit);
}

int run_task(const cli::cli_options& o, const std::vector<std::string>& libs) {
  const worker::task_info* task = worker::registry::instance().find(o.task);
  if (!task) {
    std::string known;
    std::vector<std::string> names;
    for (auto* t : worker::registry::instance().all()) {
      known += (known.empty() ? "" : ", ") + t->name;
      names.push_back(t->name);
    }
    throw usage_error("unknown task '" + o.task + "'" + did_you_mean(o.task, names) + "; " +
                      (known.empty() ? "no tasks are registered (load a library with --tasks LIB.so)"
                                     : "registered tasks: " + known));
  }
  const json args = cli::build_task_args(*task, o.params);
  auto gpus = pick_gpus(o);

  const std::string text = args.dump();
  runner::job_spec spec = runner::job_spec_for(task->name, serialization::encoding::json, blob(text.data(), text.size()), std::move(gpus),
                                               {.mem_limit = o.mem_limit,
                                                .timeout = o.timeout,
                                                .grace = o.grace,
                                                .alloc_conf = o.alloc_conf,
                                                .max_result = o.max_result});
  spec.task_libraries = libs;
  spec.stdout_to = runner::stdout_mode::to_stderr;  // stdout carries the result only
  // --memory-timeline: the worker writes its timeline next to the page, which is drawn from it
  // once the task has ended (the allocator keeps a history only when asked to). The timeline's
  // name is random, so nothing planted beside the page can stand in for it.
  const std::string timeline_json =
      o.memory_timeline.empty() ? "" : serialization::temporary_name(o.memory_timeline + ".json");
  if (!timeline_json.empty()) {
    spec.memory_timeline = std::filesystem::absolute(timeline_json).string();
    std::string conf = spec.alloc_conf.empty() && std::getenv("ISORUN_ALLOC_CONF") ? std::getenv("ISORUN_ALLOC_CONF") : spec.alloc_conf;
    if (alloc::alloc_config::parse(conf).history == 0) conf += std::string(conf.empty() ? "" : ",") + "history:100000";
    spec.alloc_conf = conf;
    // Can it be written? Said before the task runs. (The page replaces whatever is at its name.)
    const fs::path folder = fs::path(o.memory_timeline).has_parent_path() ? fs::path(o.memory_timeline).parent_path() : ".";
    if (::access(folder.c_str(), W_OK | X_OK) != 0)
      throw usage_error("--memory-timeline " + o.memory_timeline + ": cannot write there (" + folder.string() +
                        ": " + std::strerror(errno) + ")");
  }
  auto job = runner::job::start(std::move(spec));

  // Ctrl-C / SIGTERM cancel the worker (SIGTERM, grace, SIGKILL) instead of orphaning it, and
  // say so at once; a second one kills it now.
  static runner::job* raw = job.get();
  static std::string first_notice, second_notice;
  static std::atomic<int> interrupts{0};
  first_notice = "\nisorun: stopping " + o.task + " (SIGTERM, then SIGKILL after " + format_duration(o.grace) +
                 "); Ctrl-C again to kill it now\n";
  second_notice = "isorun: killing " + o.task + " now\n";
  struct sigaction sa {};
  sa.sa_handler = [](int) {
    const std::string& notice = interrupts.fetch_add(1) == 0 ? first_notice : second_notice;
    [[maybe_unused]] auto n = ::write(STDERR_FILENO, notice.data(), notice.size());  // async-signal-safe
    raw->cancel();
  };
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGHUP, &sa, nullptr);

  const runner::job_result& r = job->wait();
  const outcome& out = r.status;
  if (!timeline_json.empty()) {
    std::string problem;
    try {
      const json timeline = sweep::read_memory_timeline(timeline_json);
      sweep::write_file_durably(o.memory_timeline, sweep::render_memory_timeline(
                                                       timeline, o.task + " on " + out.device + ": " + std::string(to_string(out.kind))));
    } catch (const std::exception& e) {
      std::error_code ec;
      problem = fs::exists(fs::symlink_status(timeline_json, ec)) ? std::string(e.what())
                                                                  : "the worker ended before writing it (" + out.describe() + ")";
    }
    std::error_code ec;
    std::filesystem::remove(timeline_json, ec);
    if (!problem.empty()) std::fprintf(stderr, "isorun: no memory timeline: %s\n", printable(problem).c_str());
    else if (!o.quiet) std::fprintf(stderr, "isorun: memory timeline in %s\n", o.memory_timeline.c_str());
  }
  json result;
  if (out.ok()) {
    std::string_view text_result(reinterpret_cast<const char*>(r.payload.data()), r.payload.size());
    json parsed = json::parse(text_result, nullptr, false);
    if (parsed.is_discarded() || !parsed.is_object() || !parsed.contains("result")) {
      std::fprintf(stderr, "isorun: %s: worker result is not valid JSON\n", o.task.c_str());
      return exit_code(outcome_kind::invalid_result);
    }
    result = parsed["result"];
  }
  if (o.json) {
    json record = {{"task", o.task},
                   {"outcome", to_string(out.kind)},
                   {"exit_code", exit_code(out.kind)},
                   {"device", out.device},
                   {"wall_ms", out.wall.count() / 1e6},
                   {"run_ms", out.run.count() / 1e6},
                   {"peak_allocated", out.peak_allocated},
                   {"peak_reserved", out.peak_reserved}};
    if (out.host_memory_peak) record["host_memory_peak"] = out.host_memory_peak;
    if (out.ok()) record["result"] = result;
    else {
      record["error_type"] = out.error_type;
      record["message"] = out.message;
      if (out.exit.signal) record["signal"] = runner::signal_name(out.exit.signal);
    }
    std::cout << record.dump() << std::endl;
  } else if (out.ok()) {
    std::cout << result.dump(2) << std::endl;
  }
  if (!o.quiet) {
    if (out.ok())
      std::fprintf(stderr, "isorun: %s succeeded on %s in %s (task %s)\n", o.task.c_str(), out.device.c_str(),
                   format_duration(out.wall).c_str(), format_duration(out.run).c_str());
    else
      std::fprintf(stderr, "isorun: %s failed on %s: %s\n", o.task.c_str(), out.device.c_str(),
                   printable(out.describe()).c_str());  // the task's own message
  }
  return exit_code(out.kind);
}

int real_main(int argc, char** argv) {
  const cli::cli_options o = cli::parse_command_line(argc, argv);
  if (const std::string bad = runner::containment_setting_error(); !bad.empty()) throw usage_error(bad);
  switch (o.what) {
    case cli::mode::help: std::cout << cli::usage_text(); return 0;
    case cli::mode::nothing: std::fputs(cli::usage_text(), stderr); return 2;
    case cli::mode::version: std::cout << "isorun 0.1.0\n"; return 0;
    case cli::mode::list_gpus: return list_gpus(o);
    case cli::mode::status: return cli::show_status(o);
    case cli::mode::report:
      sweep::write_report(o.rest[0]);
      std::fprintf(stderr, "isorun: report in %s\n", (std::filesystem::path(o.rest[0]) / "report.html").c_str());
      return 0;
    case cli::mode::run_command: return cli::run_command(o, pick_gpus(o));
    default: break;
  }
  const auto libs = task_libraries(o);
  load_libraries(libs);
  switch (o.what) {
    case cli::mode::list_tasks: return list_tasks(o);
    case cli::mode::sweep: return cli::run_sweep(o, libs);
    default: return run_task(o, libs);
  }
}

}  // namespace

// A failure before or outside the task: on stderr, and as a record on stdout under --json.
int report_failure(bool as_json, const char* outcome, int code, const std::string& what) {
  // The message may quote what others wrote: a spec, a folder's files, a task's words.
  std::fprintf(stderr, "isorun: %s: %s\n", code == 2 ? "error" : "internal error", printable(what).c_str());
  if (as_json) std::cout << json{{"outcome", outcome}, {"exit_code", code}, {"message", what}}.dump() << std::endl;
  return code;
}

int main(int argc, char** argv) {
  isorun::init(argc, argv);
  const bool as_json = cli::wants_json(argc, argv);
  try {
    return real_main(argc, argv);
  } catch (const usage_error& e) {
    return report_failure(as_json, "usage", 2, e.what());
  } catch (const parse_error& e) {
    return report_failure(as_json, "usage", 2, e.what());
  } catch (const std::exception& e) {
    return report_failure(as_json, "internal_error", 125, e.what());
  }
}
