// `isorun sweep SPEC.yaml | TASK --grid k=v1,v2 ... [flags]`.
#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli_args.hpp"
#include "isorun/runner/errors.hpp"
#include "isorun/runner/printable.hpp"
#include "isorun/runner/process.hpp"
#include "isorun/sweep/slurm.hpp"
#include "isorun/sweep/sweep.hpp"
#include "isorun/runner/units.hpp"
#include "isorun/runner/suggest.hpp"

namespace isorun::cli {
namespace {

const char* sweep_usage = R"(usage: isorun [--tasks LIB.so] sweep SPEC.yaml [FLAGS]
       isorun [--tasks LIB.so] sweep TASK --grid key=v1,v2 [--grid ...] [FLAGS]
       isorun sweep --grid key=v1,v2 [--grid ...] [FLAGS] -- PROGRAM ARGS...

A command (spec `command: [python3, train.py, --lr, "{lr}"]`, or after --) gets each trial's
parameters where its arguments say {name}, runs under the trial's GPU and cap (the cap enforced
on the CUDA driver API, as for isorun -- CMD), and reports its result as the last line of its
stdout that is a JSON object, or as a JSON object written to the file $ISORUN_RESULT names.

flags (override the spec):
  --out DIR          output folder (results.jsonl, results.csv, logs/); default isorun-sweep-TASK
  --gpus LIST        GPU indices (0,1) or all; without it, trials use CPU slots
  --mem-limit SIZE   cap per trial; on GPUs, slots per GPU = floor(free memory / SIZE)
  --per-gpu N        trials per GPU instead (default: as many caps as fit, at most the cores per GPU)
  --gpus-per-trial N GPUs each trial runs on at once (one of its places on each; the cap is per
                     GPU), or {name}: as many as parameter name says, so 1-, 2- and 4-GPU
                     trials mix; served in order, a waiting wide trial holding the GPUs it waits for
  --cpu-slots N      parallel CPU trials (default: the cores isorun may run on)
  --timeout DUR      per-trial timeout
  --standby N        workers launched ahead per slot, each used for one trial (default 1; 0: none)
  --no-warm-context  standby workers on GPUs do not create their CUDA context ahead
  --retry CLASS=N    retries for crashed, timeout, invalid_result or task_error (OOM never)
  --rerun-failed     rerun trials whose journaled outcome is a failure
  --fail-fast        stop at the first failed trial
  --metric NAME[:min|max]  rank by this numeric field of the result (max if no goal given)
  --top K            rows in the final table (default 5)
  --wait             if another sweep uses the output folder, wait for it instead of failing
  --backend B        local (this machine; the default) or slurm (job arrays through sbatch; the
                     spec's resources give partition, time, gpus_per_node, trials_per_task, ...)
  --detach           with slurm: submit and return; the same command again (or --attach)
                     follows the arrays, journals their results and resubmits lost trials
  --attach           the same as running the command again: follow what was submitted
  --no-progress      no progress output
Results: OUT/results.jsonl (the journal), OUT/results.csv, OUT/logs/, and OUT/report.html, a page
with charts and the table (isorun report OUT writes it again; memory timelines need
alloc_conf history:N). Re-running the same command resumes: finished trials are skipped. Ctrl-C stops launching and
cancels running trials (a second Ctrl-C kills them at once); the journal stays consistent.
)";

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string part; std::getline(in, part, sep);) out.push_back(part);
  return out;
}

int whole(const std::string& flag, const std::string& v) {
  try {
    std::size_t pos = 0;
    int n = std::stoi(v, &pos);
    if (pos == v.size() && n >= 0) return n;
  } catch (...) {
  }
  throw usage_error(flag + " " + v + ": expected a whole number");
}

}  // namespace

int run_sweep(const cli_options& o, const std::vector<std::string>& libraries) {
  // Everything after `--` is the command to sweep.
  std::vector<std::string> a = o.rest, command;
  if (const auto dashes = std::find(a.begin(), a.end(), "--"); dashes != a.end()) {
    command.assign(dashes + 1, a.end());
    a.erase(dashes, a.end());
    if (command.empty()) throw usage_error("'--' must be followed by the command to sweep");
    if (a.empty() || a[0].starts_with("--")) a.insert(a.begin(), "");  // no SPEC or TASK: flags start at a[1]
  }
  if (a.empty() || a[0] == "--help" || a[0] == "-h") {
    std::cout << sweep_usage;
    return a.empty() ? 2 : 0;
  }
  std::vector<std::pair<std::string, std::vector<std::string>>> grid;
  std::string out, gpus, gpus_per_trial, backend, node;
  bool detach = false;
  int per_gpu = -1, cpu_slots = -1, top = 5, standby = -1;
  bool cold_standby = false;
  bool rerun = false, fail_fast = false, progress = true, wait = false;
  std::optional<sweep::metric_spec> metric;
  std::map<std::string, int> retries;
  std::uint64_t mem_limit = o.mem_limit;
  auto timeout = o.timeout;
  for (std::size_t i = 1; i < a.size(); ++i) {
    const std::string& f = a[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= a.size()) throw usage_error(f + " needs a value; see isorun sweep --help");
      return a[++i];
    };
    try {
      if (f == "--grid") {
        const std::string g = value();
        const auto eq = g.find('=');
        if (eq == std::string::npos || eq == 0) throw usage_error("--grid " + g + ": expected key=v1,v2,...");
        grid.emplace_back(g.substr(0, eq), split(g.substr(eq + 1), ','));
      } else if (f == "--out") out = value();
      else if (f == "--gpus") gpus = value();
      else if (f == "--mem-limit") mem_limit = parse_size(value());
      else if (f == "--per-gpu") per_gpu = whole(f, value());
      else if (f == "--gpus-per-trial") gpus_per_trial = value();
      else if (f == "--backend") {
        backend = value();
        if (backend != "local" && backend != "slurm") throw usage_error("--backend " + backend + ": expected local or slurm");
      } else if (f == "--detach") detach = true;
      else if (f == "--attach") {  // following is what running again does
      } else if (f == "--node") node = value();  // (an array task of a Slurm submission; isorun passes it)
      else if (f == "--cpu-slots") cpu_slots = whole(f, value());
      else if (f == "--timeout") timeout = parse_duration(value());
      else if (f == "--top") top = whole(f, value());
      else if (f == "--standby") standby = whole(f, value());
      else if (f == "--no-warm-context") cold_standby = true;
      else if (f == "--rerun-failed") rerun = true;
      else if (f == "--fail-fast") fail_fast = true;
      else if (f == "--no-progress") progress = false;
      else if (f == "--wait") wait = true;
      else if (f == "--metric") metric = sweep::parse_metric_flag(value());
      else if (f == "--retry") {
        const std::string r = value();
        const auto eq = r.find('=');
        if (eq == std::string::npos) throw usage_error("--retry " + r + ": expected CLASS=N");
        retries[r.substr(0, eq)] = whole("--retry", r.substr(eq + 1));
      } else {
        static const std::vector<std::string> known = {"--grid",      "--out",          "--gpus",     "--mem-limit",
                                                       "--per-gpu",   "--cpu-slots",    "--timeout",  "--retry",
                                                       "--rerun-failed", "--fail-fast", "--metric",   "--top",
                                                       "--wait",      "--no-progress",  "--standby",  "--no-warm-context",
                                                       "--gpus-per-trial", "--backend", "--detach", "--attach"};
        throw usage_error("unknown sweep flag '" + f + "'" + did_you_mean(f, known) + "; see isorun sweep --help");
      }
    } catch (const parse_error& e) {
      throw usage_error(f + ": " + e.what());
    } catch (const sweep::spec_error& e) {
      throw usage_error(e.what());
    }
  }

  sweep::sweep_spec s;
  try {
    const std::string& first = a[0];
    if (!command.empty()) {
      if (!first.empty()) throw usage_error("sweep " + first + " -- CMD: give a spec, a TASK or a command after --, not two");
      if (grid.empty()) throw usage_error("sweep -- CMD: give its parameters with --grid key=v1,v2");
      s = sweep::spec_from_grid(command, grid);
    } else if (first.size() > 5 && (first.ends_with(".yaml") || first.ends_with(".yml"))) {
      std::ifstream in(first);
      // What stopped the read is the message: no such file, permission denied, a folder.
      const int err = in ? (std::filesystem::is_directory(first) ? EISDIR : 0) : errno;
      if (err) throw usage_error("cannot read sweep spec " + first + ": " + std::strerror(err));
      std::stringstream text;
      text << in.rdbuf();
      if (!grid.empty()) throw usage_error("--grid goes with a TASK, not with a spec file");
      s = sweep::parse_spec(text.str(), first);
    } else {
      if (grid.empty()) throw usage_error("sweep " + first + ": give a SPEC.yaml, or a TASK with --grid key=v1,v2");
      s = sweep::spec_from_grid(first, grid);
    }
    if (!out.empty()) s.out = out;
    if (!gpus.empty()) {
      s.gpus.clear();
      s.all_gpus = gpus == "all";
      if (!s.all_gpus)
        for (const auto& g : split(gpus, ',')) s.gpus.push_back(whole("--gpus", g));
    }
    if (mem_limit) s.mem_limit = mem_limit;
    if (per_gpu >= 0) s.per_gpu = per_gpu;
    if (!gpus_per_trial.empty()) {
      s.gpus_per_trial_line = 0;
      s.gpus_per_trial_param.clear();
      s.gpus_per_trial = 1;
      if (gpus_per_trial.size() > 2 && gpus_per_trial.front() == '{' && gpus_per_trial.back() == '}')
        s.gpus_per_trial_param = gpus_per_trial.substr(1, gpus_per_trial.size() - 2);
      else if ((s.gpus_per_trial = whole("--gpus-per-trial", gpus_per_trial)) < 1)
        throw usage_error("--gpus-per-trial must be at least 1, or {name} for parameter name's value");
    }
    if (cpu_slots >= 0) s.cpu_slots = cpu_slots;
    if (timeout.count()) s.timeout = timeout;
    if (standby >= 0) s.standby = standby;
    if (cold_standby) s.warm_context = false;
    if (!o.alloc_conf.empty()) s.alloc_conf = o.alloc_conf;
    for (const auto& [cls, n] : retries) {
      if (cls == "out_of_memory") throw usage_error("--retry out_of_memory: OOM is never retried at the same cap");
      if (cls != "crashed" && cls != "timeout" && cls != "invalid_result" && cls != "task_error")
        throw usage_error("--retry " + cls + ": unknown outcome class (crashed, timeout, invalid_result, task_error)");
      s.retries[cls] = n;
    }
    if (fail_fast) s.fail_fast = true;
    if (metric) s.metric = *metric;
    if (backend == "slurm" && !s.slurm) s.slurm.emplace();
    if (backend == "local") s.slurm.reset();
    if (detach && !s.slurm) throw usage_error("--detach goes with the Slurm backend (--backend slurm)");
    if (const bool wants_gpus = s.all_gpus || !s.gpus.empty(); !node.empty() && wants_gpus)
      if (auto given = sweep::slurm::assigned_gpus()) {  // an array task: the GPUs Slurm gave it
        s.gpus = *given;
        s.all_gpus = false;
      }
    // A Slurm submitter runs nothing itself: its trials' slots are on the nodes.
    const bool submitter = s.slurm && node.empty();
    const auto plan = submitter ? runner::slot_plan{{runner::slot{}}, "Slurm job arrays"}
                                : sweep::plan_slots(s, runner::gpu_inventory::detect());

    sweep::sweep_options ro;
    ro.task_libraries = libraries;
    ro.rerun_failed = rerun;
    ro.progress = progress;
    ro.grace = o.grace;
    ro.wait_for_lock = wait;
    ro.node = node;
    ro.detach = detach;
    ro.submit_dir = std::filesystem::current_path().string();
    // What each array task runs: this command line again (same spec, flags and task libraries).
    ro.node_command = {runner::self_executable()};
    for (std::size_t k = 1; k < o.argv.size(); ++k)
      if (o.argv[k] != "--detach" && o.argv[k] != "--attach") ro.node_command.push_back(o.argv[k]);
    sweep::sweep_run sweep(s, plan.slots, ro);  // checks everything and locks the folder
    const std::string& where = sweep.out();
    for (const auto& w : sweep.warnings()) std::fprintf(stderr, "isorun: warning: %s\n", printable(w).c_str());
    const std::string spans = sweep::spans_gpus(s) ? "; each trial on " + sweep::gpus_per_trial_text(s) + " GPUs" : "";
    std::fprintf(stderr, "isorun: sweep %s: %zu trials (%zu to run) on %s%s; %s; results in %s/\n",
                 printable(sweep::subject(s)).c_str(), s.trials.size(), sweep.pending(), plan.how.c_str(), spans.c_str(),
                 sweep::plan_standby(s, plan.slots).how.c_str(), printable(where).c_str());

    struct sigaction sa {};
    sa.sa_handler = [](int) { sweep::request_stop(); };
    ::sigaction(SIGINT, &sa, nullptr);
    ::sigaction(SIGTERM, &sa, nullptr);
    const auto summary = sweep.run();
    if (!node.empty()) return summary.failed || summary.interrupted ? 1 : 0;  // the submitter reports
    if (summary.detached) {
      std::string jobs;
      for (const auto& j : summary.jobs) jobs += (jobs.empty() ? "" : ", ") + j;
      std::fprintf(stderr,
                   "isorun: sweep submitted to Slurm (job array%s %s) and detached; `isorun status %s` shows progress, "
                   "the same command again follows it and journals the results\n",
                   summary.jobs.size() == 1 ? "" : "s", jobs.c_str(), printable(where).c_str());
      return 0;
    }
    std::cout << printable(sweep::top_table(s, summary.records, top));  // parameter values are the spec's
    std::fprintf(stderr,
                 "isorun: sweep %s: %zu succeeded, %zu failed, %zu already done%s; journal %s/results.jsonl, table "
                 "%s/results.csv%s\n",
                 summary.interrupted ? "interrupted" : "finished", summary.succeeded, summary.failed, summary.skipped,
                 summary.cancelled ? (", " + std::to_string(summary.cancelled) + " cancelled").c_str() : "",
                 printable(where).c_str(), printable(where).c_str(),
                 summary.report.empty() ? "" : printable(", report " + summary.report).c_str());
    if (summary.interrupted) return 130;
    std::size_t failed_total = 0;
    for (const auto& r : summary.records) failed_total += r.kind != outcome_kind::success;
    return failed_total ? 1 : 0;
  } catch (const sweep::spec_error& e) {
    throw usage_error(e.what());  // it names the spec file and line itself
  }
}

int show_status(const cli_options& o) {
  const std::filesystem::path out = o.rest.at(0);
  const auto d = sweep::load_report_data(out);  // usage_error if OUT is not a sweep's folder
  std::size_t total = 0;
  {
    std::ifstream in(out / "sweep.json");
    const auto identity = nlohmann::json::parse(in, nullptr, false);
    if (identity.is_object()) total = identity.value("trials", std::size_t{0});
  }
  std::string by_outcome;
  for (const auto& [k, n] : d.outcomes) by_outcome += (by_outcome.empty() ? "" : ", ") + std::to_string(n) + " " + k;
  std::printf("sweep %s in %s: %zu of %zu trials journaled%s%s\n", printable(d.subject).c_str(), printable(out.string()).c_str(),
              d.records.size(), total, by_outcome.empty() ? "" : ": ", by_outcome.c_str());
  std::size_t waiting = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(out / "slurm" / "results", ec)) waiting += e.path().extension() == ".json";
  std::ifstream in(out / "slurm" / "jobs.json");
  const auto jobs = nlohmann::json::parse(in, nullptr, false);
  if (jobs.is_array())
    for (const auto& j : jobs) {
      const std::string job = j.value("job", "");
      const auto active = sweep::slurm::active_tasks(job);
      std::printf("Slurm job array %s: %s\n", printable(job).c_str(),
                  active.empty() ? "done" : (std::to_string(active.size()) + " array tasks queued or running").c_str());
    }
  if (waiting) std::printf("%zu trial results wait to be journaled (run the sweep's command again, or --attach)\n", waiting);
  return 0;
}

}  // namespace isorun::cli
