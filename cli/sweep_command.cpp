#include "sweep_command.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "interrupt.hpp"
#include "isorun/runner/errors.hpp"
#include "isorun/runner/printable.hpp"
#include "isorun/runner/process.hpp"
#include "isorun/sweep/slurm.hpp"
#include "isorun/sweep/sweep.hpp"
#include "report_command.hpp"

namespace isorun::cli {
namespace {

// The sweep itself: a command after --, a spec file, or a TASK with --grid.
sweep::sweep_spec read_spec(const cli_options& o) {
  const std::string& first = o.sweep.target;
  const auto& grid = o.sweep.grid;
  if (!o.command.empty()) {
    if (!first.empty())
      throw usage_error("sweep " + first + " -- CMD: give a spec, a TASK or a command after --, not two");
    if (grid.empty()) throw usage_error("sweep -- CMD: give its parameters with --grid key=v1,v2");
    return sweep::spec_from_grid(o.command, grid);
  }
  if (first.size() > 5 && (first.ends_with(".yaml") || first.ends_with(".yml"))) {
    std::ifstream in(first);
    // What stopped the read is the message: no such file, permission denied, a folder.
    const int err = in ? (std::filesystem::is_directory(first) ? EISDIR : 0) : errno;
    if (err) throw usage_error("cannot read sweep spec " + first + ": " + std::strerror(err));
    std::stringstream text;
    text << in.rdbuf();
    if (!grid.empty()) throw usage_error("--grid goes with a TASK, not with a spec file");
    return sweep::parse_spec(text.str(), first);
  }
  if (grid.empty()) throw usage_error("sweep " + first + ": give a SPEC.yaml, or a TASK with --grid key=v1,v2");
  return sweep::spec_from_grid(first, grid);
}

// The flags override what the spec says.
void apply_flags(const cli_options& o, sweep::sweep_spec& s) {
  const sweep_flags& f = o.sweep;
  if (!f.out.empty()) s.out = f.out;
  if (f.gpus) {
    s.gpus = *f.gpus;
    s.all_gpus = f.all_gpus;
  }
  if (o.mem_limit) s.mem_limit = o.mem_limit;
  if (o.host_mem_limit) s.host_mem_limit = o.host_mem_limit;
  if (f.per_gpu >= 0) s.per_gpu = f.per_gpu;
  if (f.gpus_per_trial) {
    s.gpus_per_trial_line = 0;
    s.gpus_per_trial = f.gpus_per_trial;
    s.gpus_per_trial_param = f.gpus_per_trial_param;
  }
  if (f.cpu_slots >= 0) s.cpu_slots = f.cpu_slots;
  if (o.timeout.count()) s.timeout = o.timeout;
  if (f.standby >= 0) s.standby = f.standby;
  if (f.cold_standby) s.warm_context = false;
  if (!o.alloc_conf.empty()) s.alloc_conf = o.alloc_conf;
  for (const auto& [cls, n] : f.retries) s.retries[cls] = n;
  if (f.oom_retry) s.oom_retry = *f.oom_retry;
  if (f.fail_fast) s.fail_fast = true;
  if (f.metric) s.metric = *f.metric;
  if (f.scheduler) s.early_stopping = *f.scheduler;
  if (!f.backend.empty()) sweep::select_backend(s, f.backend);  // (checked as the flag was read)
  for (const auto& flag : f.track) {
    const std::string &name = flag.first, &uri = flag.second;
    auto it = std::find_if(s.track.begin(), s.track.end(), [&](const auto& t) { return t.name == name; });
    if (it == s.track.end()) {
      if (!sweep::builtin_tracker(name))
        throw usage_error("--track " + name + ": not a tracker isorun has (" + sweep::builtin_tracker_names() +
                          ") nor one the spec's track: names");
      it = s.track.insert(s.track.end(), sweep::track_spec{.name = name});
    }
    if (!uri.empty()) it->settings["uri"] = uri;
  }
  if (const bool wants_gpus = s.all_gpus || !s.gpus.empty(); !f.node.empty() && wants_gpus)
    if (auto given = sweep::slurm::assigned_gpus()) {  // an array task: the GPUs Slurm gave it
      s.gpus = *given;
      s.all_gpus = false;
    }
}

sweep::sweep_options run_options(const cli_options& o, const std::vector<std::string>& libs) {
  sweep::sweep_options ro;
  ro.task_libraries = libs;
  ro.rerun_failed = o.sweep.rerun_failed;
  ro.progress = o.sweep.progress;
  ro.grace = o.grace;
  ro.wait_for_lock = o.sweep.wait;
  ro.node = o.sweep.node;
  ro.detach = o.sweep.detach;
  ro.submit_dir = std::filesystem::current_path().string();
  // What each array task runs: this command line again (same spec, flags and task libraries).
  // (--detach and --attach are the submitter's; past a `--` every word is the command's own.)
  ro.node_command = {runner::self_executable()};
  bool command = false;
  for (std::size_t k = 1; k < o.argv.size(); ++k) {
    command = command || o.argv[k] == "--";
    if (command || (o.argv[k] != "--detach" && o.argv[k] != "--attach")) ro.node_command.push_back(o.argv[k]);
  }
  return ro;
}

int summarize(const cli_options& o, const sweep::sweep_spec& s, const sweep::sweep_summary& summary,
              const std::string& where) {
  if (!o.sweep.node.empty()) return summary.failed || summary.interrupted ? 1 : 0;  // the submitter reports
  if (summary.detached) {
    std::string jobs;
    for (const auto& j : summary.jobs) jobs += (jobs.empty() ? "" : ", ") + j;
    std::fprintf(stderr,
                 "isorun: sweep submitted to Slurm (job array%s %s) and detached; `isorun status %s` shows progress, "
                 "the same command again follows it and journals the results\n",
                 summary.jobs.size() == 1 ? "" : "s", jobs.c_str(), printable(where).c_str());
    return 0;
  }
  std::cout << printable(sweep::top_table(s, summary.records, o.sweep.top));  // parameter values are the spec's
  std::fprintf(stderr,
               "isorun: sweep %s: %zu succeeded, %s%zu failed, %zu already done%s; journal %s/results.jsonl, table "
               "%s/results.csv%s\n",
               summary.interrupted ? "interrupted" : "finished", summary.succeeded,
               !s.early_stopping ? "" : (std::to_string(summary.pruned) + " pruned, ").c_str(), summary.failed,
               summary.skipped,
               summary.cancelled ? (", " + std::to_string(summary.cancelled) + " cancelled").c_str() : "",
               printable(where).c_str(), printable(where).c_str(),
               summary.report.empty() ? "" : printable(", report " + summary.report).c_str());
  if (s.early_stopping && s.early_stopping.max_t() > 0 && !summary.records.empty()) {
    // How much of the full budget (every trial to max_t) early stopping let the sweep use.
    const double full = double(summary.records.size()) * double(s.early_stopping.max_t());
    std::fprintf(stderr, "isorun: %s used %llu steps of %.0f (%zu trials x max_t %lld): %.1f%% of the full budget\n",
                 s.early_stopping.type.c_str(), static_cast<unsigned long long>(summary.steps), full,
                 summary.records.size(), static_cast<long long>(s.early_stopping.max_t()),
                 100.0 * double(summary.steps) / full);
  }
  if (summary.interrupted) return 130;
  std::size_t failed_total = 0;  // pruned trials are done, not failed
  for (const auto& r : summary.records) failed_total += !sweep::done_well(r);
  return failed_total ? 1 : 0;
}

}  // namespace

int run_sweep(const cli_options& o, const std::vector<std::string>& libs) {
  if (o.sweep.target.empty() && o.command.empty()) {
    std::fputs(help_text(mode::sweep).c_str(), stderr);
    return 2;
  }
  try {
    sweep::sweep_spec s = read_spec(o);
    apply_flags(o, s);
    sweep::sweep_options options = run_options(o, libs);
    // A backend whose trials run elsewhere (a cluster's submitter) runs nothing itself: its
    // trials' slots are on its nodes.
    const bool here = sweep::backend_traits_of(s, options).runs_here;
    const auto plan = here ? sweep::plan_slots(s, runner::gpu_inventory::detect())
                           : runner::slot_plan{{runner::slot{}}, "backend " + std::string(sweep::backend_name(s))};
    const bool node = !o.sweep.node.empty();
    served_report page(node ? serve_flags{} : o.serve);         // (the submitter's, not a node's)
    sweep::sweep_run sweep(s, plan.slots, std::move(options));  // checks everything and locks the folder
    const std::string& where = sweep.out();
    for (const auto& w : sweep.warnings()) std::fprintf(stderr, "isorun: warning: %s\n", printable(w).c_str());
    const std::string spans = sweep::spans_gpus(s) ? "; each trial on " + sweep::gpus_per_trial_text(s) + " GPUs" : "";
    const std::string trials = s.search ? "up to " + std::to_string(s.search.trials) + " trials chosen by " +
                                              (s.search.type == "optuna" ? "Optuna's " + s.search.sampler + " sampler"
                                                                         : "the searcher " + s.search.command.front())
                                        : std::to_string(s.trials.size()) + " trials (" +
                                              std::to_string(sweep.pending()) + " to run)";
    std::fprintf(stderr, "isorun: sweep %s: %s on %s%s; %s; results in %s/\n", printable(sweep::subject(s)).c_str(),
                 printable(trials).c_str(), plan.how.c_str(), spans.c_str(),
                 sweep::plan_standby(s, plan.slots).how.c_str(), printable(where).c_str());
    // The sweep says itself what a stop does, once it knows what runs (sweep::request_stop).
    static std::atomic<int> warning{0};
    static std::atomic<bool> warned{false};
    const interrupt_scope stop([](int signal) noexcept {
      if (signal == warning.load()) warned = true;
      sweep::request_stop();
    });
    // An array task of a sweep whose trials keep checkpoints: Slurm warns it ahead of its time
    // limit. It stops as for Ctrl-C (its trials warned in turn, saving), then requeues itself,
    // to go on later from the checkpoints.
    if (node && s.checkpoints) {
      warning = s.checkpoints.signal;
      stop.also_catch(s.checkpoints.signal);
    }
    page.start(where);
    const auto summary = sweep.run();
    page.stop();
    const int code = summarize(o, s, summary, where);
    if (!node || !warned) return code;
    std::string why;
    if (sweep::slurm::requeue_this_task(why)) {
      std::fprintf(stderr,
                   "isorun: warned by Slurm: the trials saved their checkpoints; this array task is requeued\n");
      // Slurm ends this task itself now, and queues it again. Exiting first would end it as a
      // failure the submitter might see before the requeue: it waits to be ended instead.
      std::this_thread::sleep_for(std::chrono::minutes(5));
      return code;
    }
    std::fprintf(stderr,
                 "isorun: warned by Slurm: the trials saved their checkpoints, but this array task could not be "
                 "requeued (%s); the sweep resumes them in a new array\n",
                 printable(why).c_str());
    return sweep::slurm::preempted_exit;
  } catch (const sweep::spec_error& e) {
    throw usage_error(e.what());  // it names the spec file and line itself
  }
}

}  // namespace isorun::cli
