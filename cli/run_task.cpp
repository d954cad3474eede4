#include "run_task.hpp"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "gpu_choice.hpp"
#include "interrupt.hpp"
#include "isorun/alloc/config.hpp"
#include "isorun/html/memory_timeline.hpp"
#include "isorun/runner/bounded_json.hpp"
#include "isorun/runner/errors.hpp"
#include "isorun/runner/job.hpp"
#include "isorun/runner/outcome.hpp"
#include "isorun/runner/printable.hpp"
#include "isorun/runner/process.hpp"
#include "isorun/runner/suggest.hpp"
#include "isorun/runner/task_arguments.hpp"
#include "isorun/runner/units.hpp"
#include "isorun/serialization/whole_file.hpp"
#include "isorun/sweep/journal.hpp"
#include "isorun/worker/task.hpp"
#include "memory_timeline.hpp"

namespace isorun::cli {
namespace {
using nlohmann::json;
namespace fs = std::filesystem;

const worker::task_info& find_task(const std::string& name) {
  if (const worker::task_info* task = worker::registry::instance().find(name)) return *task;
  std::string known;
  std::vector<std::string> names;
  for (auto* t : worker::registry::instance().all()) {
    known += (known.empty() ? "" : ", ") + t->name;
    names.push_back(t->name);
  }
  throw usage_error(
      "unknown task '" + name + "'" + did_you_mean(name, names) + "; " +
      (known.empty() ? "no tasks are registered (load a library with --tasks LIB.so)" : "registered tasks: " + known));
}

// --memory-timeline: the worker writes its timeline next to the page, which is drawn from it
// once the task has ended (the allocator keeps a history only when asked to). The timeline's
// name is random, so nothing planted beside the page can stand in for it. Returns its name.
std::string ask_for_timeline(const cli_options& o, runner::job_spec& spec) {
  check_timeline_page(o.memory_timeline);  // said before the task runs
  const std::string timeline_json = serialization::temporary_name(o.memory_timeline + ".json");
  spec.memory_timeline = fs::absolute(timeline_json).string();
  std::string conf = spec.alloc_conf.empty() && std::getenv("ISORUN_ALLOC_CONF") ? std::getenv("ISORUN_ALLOC_CONF")
                                                                                 : spec.alloc_conf;
  if (alloc::alloc_config::parse(conf).history == 0) conf += std::string(conf.empty() ? "" : ",") + "history:100000";
  spec.alloc_conf = conf;
  return timeline_json;
}

void draw_timeline(const cli_options& o, const std::string& timeline_json, const outcome& out) {
  json timeline;
  std::string problem;
  try {
    timeline = html::read_memory_timeline(timeline_json);
  } catch (const std::exception& e) {
    std::error_code ec;
    problem = fs::exists(fs::symlink_status(timeline_json, ec))
                  ? std::string(e.what())
                  : "the worker ended before writing it (" + out.describe() + ")";
  }
  std::error_code ec;
  fs::remove(timeline_json, ec);
  if (!problem.empty()) std::fprintf(stderr, "isorun: no memory timeline: %s\n", printable(problem).c_str());
  else
    write_timeline_page(o.memory_timeline, timeline,
                        o.task + " on " + out.device + ": " + std::string(to_string(out.kind)), o.quiet);
}

// The result on stdout (or the whole record, with --json) and the summary on stderr.
int report(const cli_options& o, const runner::job_result& r) {
  const outcome& out = r.status;
  json result;
  if (out.ok()) {
    std::string_view text_result(reinterpret_cast<const char*>(r.payload.data()), r.payload.size());
    bool too_deep = false;
    json parsed = parse_bounded_json(text_result, &too_deep);
    if (parsed.is_discarded() || !parsed.is_object() || !parsed.contains("result")) {
      if (too_deep)
        std::fprintf(stderr, "isorun: %s: worker result is nested deeper than %d levels\n", o.task.c_str(),
                     max_json_depth);
      else std::fprintf(stderr, "isorun: %s: worker result is not valid JSON\n", o.task.c_str());
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

std::atomic<runner::job*> running{nullptr};  // what interrupt_scope stops

}  // namespace

int run_task(const cli_options& o, const std::vector<std::string>& libs) {
  const worker::task_info& task = find_task(o.task);
  const std::string text = runner::arguments::build_task_args(task, o.params).dump();
  runner::job_spec spec = runner::job_spec_for(task.name, serialization::encoding::json, blob(text.data(), text.size()),
                                               pick_gpus(o),
                                               {.mem_limit = o.mem_limit,
                                                .host_mem_limit = o.host_mem_limit,
                                                .timeout = o.timeout,
                                                .grace = o.grace,
                                                .alloc_conf = o.alloc_conf,
                                                .max_result = o.max_result});
  spec.task_libraries = libs;
  spec.stdout_to = runner::stdout_mode::to_stderr;  // stdout carries the result only
  const std::string timeline_json = o.memory_timeline.empty() ? "" : ask_for_timeline(o, spec);
  // The worker is stopped, not orphaned, and the user told so at once (job::cancel escalates).
  std::shared_ptr<runner::job> job;  // outlives the scope that may stop it
  interrupt_scope stop("\nisorun: stopping " + o.task + " (SIGTERM, then SIGKILL after " + format_duration(o.grace) +
                           "); Ctrl-C again to kill it now\n",
                       "isorun: killing " + o.task + " now\n");
  job = runner::job::start(std::move(spec));
  running = job.get();
  stop.hand_to([](int) noexcept { running.load()->cancel(); });
  const runner::job_result& r = job->wait();
  if (!timeline_json.empty()) draw_timeline(o, timeline_json, r.status);
  return report(o, r);
}

}  // namespace isorun::cli
