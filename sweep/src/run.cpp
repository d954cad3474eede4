// Running a sweep: slot threads (runner::run_on_slots) take trials from one queue, each trial
// runs in a fresh capped worker, every final outcome is appended to the journal and fsync'ed
// before it counts. Re-running resumes from the journal.
#include "isorun/sweep/run.hpp"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "isorun/alloc/config.hpp"
#include "isorun/runner/errors.hpp"
#include "isorun/runner/command.hpp"
#include "isorun/runner/job.hpp"
#include "isorun/runner/process.hpp"
#include "isorun/runner/printable.hpp"
#include "isorun/runner/gpu_packer.hpp"
#include "isorun/runner/standby.hpp"
#include "isorun/runner/suggest.hpp"
#include "isorun/runner/task_arguments.hpp"
#include "isorun/runner/unique_fd.hpp"
#include "isorun/runner/units.hpp"
#include "isorun/runner/worker_env.hpp"
#include "folder.hpp"
#include "isorun/sweep/html_report.hpp"
#include "isorun/sweep/report.hpp"
#include "isorun/sweep/slurm.hpp"
#include "isorun/worker/task.hpp"

namespace isorun::sweep {

namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using clock = std::chrono::steady_clock;

std::atomic<int> stop_count{0};
std::atomic<int> stop_fd{-1};

// Which sweep a folder holds: the task or command and every trial id.
std::string fingerprint(const sweep_spec& s) {
  const std::string what = subject(s);
  std::string all = what;
  for (const auto& t : s.trials) all += "\n" + trial_id(what, t);
  return trial_id(what, json(all));
}

// The default output folder's last word: the task, or the command's script (python3 train.py:
// train), or its program.
std::string short_name(const sweep_spec& s) {
  if (s.command.empty()) return s.task;
  for (std::size_t i = 1; i < s.command.size(); ++i) {
    std::error_code ec;
    if (s.command[i].find('{') == std::string::npos && fs::is_regular_file(s.command[i], ec))
      return fs::path(s.command[i]).stem().string();
  }
  return fs::path(s.command[0]).filename().string();
}

// Everything wrong with a command sweep that can be known before it starts: placeholders and
// parameters that do not match, a program that cannot be found.
void check_command(const sweep_spec& s) {
  std::vector<std::string> params;
  for (const auto& t : s.trials)
    for (auto it = t.begin(); it != t.end(); ++it)
      if (std::find(params.begin(), params.end(), it.key()) == params.end()) params.push_back(it.key());
  const std::vector<std::string> used = placeholders(s.command);
  for (const auto& name : used)
    if (std::find(params.begin(), params.end(), name) == params.end())
      throw located(s, s.command_line,
                    "command placeholder {" + name + "} names no parameter" + did_you_mean(name, params) +
                        "; parameters: " + name_list(params));
  for (const auto& name : params)
    if (std::find(used.begin(), used.end(), name) == used.end()) {
      const auto line = s.param_lines.find(name);
      throw located(s, line == s.param_lines.end() ? 0 : line->second,
                    "parameter '" + name + "' is not used by the command; put {" + name +
                        "} where the program takes it (e.g. --" + name + " {" + name + "})");
    }
  std::set<std::string> programs;
  for (const auto& t : s.trials) programs.insert(command_for(s.command, t).front());
  for (const auto& program : programs)
    if (!runner::find_executable(program))
      throw located(s, s.command_line,
                    "command not found: '" + program + "' (not an executable file, nor found in PATH)");
}

// A command's result: the JSON object it wrote to $ISORUN_RESULT (`id`.result.json in `logs`,
// shown as `shown`), else the last line of its stdout (`id`.out) that is a JSON object; null if
// neither. Read as the folder's other files are: by name, not through links, bounded.
// @throws std::runtime_error if the result file is there but not a JSON object; usage_error if a
//         link or anything but a regular file is there.
json read_command_result(int logs, const std::string& id, const fs::path& shown) {
  const std::string result_name = id + ".result.json";
  if (const unique_fd result = detail::open_file(logs, result_name, O_RDONLY, shown / result_name)) {
    json j = json::parse(detail::read_all(result.get(), journal::max_line, shown / result_name), nullptr, false);
    if (!j.is_object()) throw std::runtime_error("the file it wrote to $ISORUN_RESULT is not a JSON object");
    return j;
  }
  // A result line is at the end of what a program prints: its last MiB is enough.
  const unique_fd log = detail::open_file(logs, id + ".out", O_RDONLY, shown / (id + ".out"));
  if (!log) return nullptr;
  const off_t size = ::lseek(log.get(), 0, SEEK_END);
  const off_t from = std::max<off_t>(0, size - (1 << 20));
  if (size < 0 || ::lseek(log.get(), from, SEEK_SET) != from) return nullptr;
  const std::string text = detail::read_all(log.get(), 1 << 20, shown / (id + ".out"));
  std::size_t end = text.size();
  while (end > 0) {
    const std::size_t begin = text.rfind('\n', end - 1);
    const std::size_t first = begin == std::string::npos ? 0 : begin + 1;
    std::string_view line(text.data() + first, end - first);
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.remove_suffix(1);
    while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
    if (!line.empty() && line.front() == '{') {
      json j = json::parse(line, nullptr, false);
      if (j.is_object()) return j;
    }
    if (begin == std::string::npos) break;
    end = begin;
  }
  return nullptr;
}

std::string duration(double seconds) {
  char buf[32];
  if (seconds < 60) std::snprintf(buf, sizeof buf, "%.0fs", seconds);
  else std::snprintf(buf, sizeof buf, "%dm%02ds", static_cast<int>(seconds) / 60, static_cast<int>(seconds) % 60);
  return buf;
}

// Slots sharing a GPU (or all the CPU slots) share standby workers: the GPU's index, -1 for none.
int group_of(const std::vector<gpu_info>& gpus) { return gpus.empty() ? -1 : gpus.front().index; }

// Each trial's GPU count (spans_gpus(s)), checked: a whole number from 1 to the GPUs the sweep
// has. gpus_per_trial: "{name}" takes it from parameter `name`.
std::vector<std::size_t> gpus_per_trial(const sweep_spec& s, const std::vector<slot>& slots) {
  const std::size_t have = runner::gpu_packer(slots).gpus();
  const int line = s.gpus_per_trial_line;
  if (have == 0)
    throw located(s, line, "gpus_per_trial needs GPUs, and the sweep has none; list them (resources: gpus: [0, 1], "
                           "or --gpus 0,1)");
  const std::string& name = s.gpus_per_trial_param;
  if (!name.empty() && !s.trials.empty() && !s.trials.front().contains(name)) {
    std::vector<std::string> names;
    for (const auto& [k, v] : s.trials.front().items()) names.push_back(k);
    throw located(s, line, "gpus_per_trial takes parameter '" + name + "', which the sweep does not have" +
                               did_you_mean(name, names) + "; its parameters: " + name_list(names));
  }
  std::vector<std::size_t> counts;
  counts.reserve(s.trials.size());
  for (const auto& t : s.trials) {
    int k = s.gpus_per_trial;
    if (!name.empty()) {
      const json& v = t[name];
      if (!v.is_number_integer() || v.get<long long>() < 1 || v.get<long long>() > 1024)
        throw located(s, line, "gpus_per_trial takes parameter '" + name + "', whose value " + v.dump() +
                                   " is not a number of GPUs (1 or more)");
      k = v.get<int>();
    }
    if (static_cast<std::size_t>(k) > have)
      throw located(s, line, "a trial asks for " + std::to_string(k) + " GPUs (gpus_per_trial), but the sweep has " +
                                 std::to_string(have) + "; list more GPUs or ask for fewer");
    counts.push_back(static_cast<std::size_t>(k));
  }
  return counts;
}

}  // namespace

standby_plan plan_standby(const sweep_spec& s, const std::vector<slot>& slots) {
  standby_plan plan;
  if (!s.command.empty()) {
    plan.how = "each trial a fresh process";
    return plan;
  }
  if (s.standby <= 0) {
    plan.how = "no standby workers";
    return plan;
  }
  if (spans_gpus(s)) {  // a standby worker would have to wait for GPUs it cannot know yet
    plan.how = "no standby workers (trials span GPUs)";
    return plan;
  }
  std::map<int, std::size_t> per_group;  // group_of(GPU) -> its slots
  std::map<int, std::optional<gpu_info>> gpu_of;
  for (const auto& sl : slots) {
    const int key = group_of(sl.gpus);
    ++per_group[key];
    if (!sl.gpus.empty()) gpu_of[key] = sl.gpus.front();
  }
  std::string warm_on, cold_on;
  for (const auto& [key, n] : per_group) {
    standby_group g{gpu_of[key], n * static_cast<std::size_t>(s.standby), false};
    if (g.gpu) {
      g.warm = s.warm_context && runner::warm_standby_fits(*g.gpu, n, s.mem_limit, g.waiting);
      std::string& list = g.warm ? warm_on : cold_on;
      list += (list.empty() ? "" : ",") + std::to_string(key);
    }
    plan.groups.push_back(std::move(g));
  }
  plan.how = "standby: " + std::to_string(s.standby) + " per slot";
  if (!warm_on.empty()) plan.how += ", warm CUDA contexts on GPU " + warm_on;
  if (!cold_on.empty())
    plan.how += s.warm_context ? ", cold on GPU " + cold_on + " (no room beside the caps for a context each)"
                               : ", cold (warm_context: false)";
  return plan;
}

void request_stop() noexcept {
  stop_count.fetch_add(1);
  if (int fd = stop_fd.load(); fd >= 0) {
    [[maybe_unused]] auto n = ::write(fd, "x", 1);
  }
}

struct sweep_run::state {
  sweep_spec s;
  std::string subject;  // subject(s): what trial ids are derived from
  std::vector<slot> slots;
  sweep_options opt;
  std::vector<std::string> args;  // each trial's JSON arguments, checked
  fs::path out;
  std::string out_text;
  unique_fd logs;  // OUT/logs, where each trial's files are created by name
  std::optional<folder_lock> lock;
  std::optional<sweep::journal> journal;
  std::vector<std::size_t> queue;  // indices into s.trials
  std::vector<std::size_t> gpu_counts;  // spans_gpus(s): each trial's GPUs (by s.trials index)
  bool timelines = false;  // the allocator keeps a history: each trial's memory timeline is kept
  std::size_t skipped = 0;
  bool metric_known = false;  // checked against the result type up front
  bool ran = false;
};

sweep_run::sweep_run(sweep_run&&) noexcept = default;
sweep_run& sweep_run::operator=(sweep_run&&) noexcept = default;
sweep_run::~sweep_run() = default;

std::size_t sweep_run::pending() const noexcept { return state_->queue.size(); }
const std::string& sweep_run::out() const noexcept { return state_->out_text; }
const std::vector<std::string>& sweep_run::warnings() const noexcept {
  static const std::vector<std::string> none;
  return state_->journal ? state_->journal->warnings() : none;
}

sweep_run::sweep_run(const sweep_spec& sp, std::vector<slot> slots, sweep_options options) : state_{std::make_unique<state>()} {
  state& st = *state_;
  st.s = sp;
  st.slots = std::move(slots);
  st.opt = std::move(options);
  const sweep_spec& s = st.s;
  st.subject = subject(s);
  if (st.slots.empty()) throw usage_error("a sweep needs at least one slot");

  // Everything is checked before anything is created or started.
  const worker::task_info* task = s.command.empty() ? worker::registry::instance().find(s.task) : nullptr;
  if (!s.command.empty()) {
    check_command(s);
  } else if (!task) {
    std::vector<std::string> names;
    for (auto* t : worker::registry::instance().all()) names.push_back(t->name);
    throw located(s, 0, "unknown task '" + s.task + "'" + did_you_mean(s.task, names) +
                            " (load its library with --tasks LIB.so; isorun tasks lists them)");
  }
  st.args.resize(s.trials.size());
  for (std::size_t i = 0; task && i < s.trials.size(); ++i) {
    try {
      st.args[i] = cli::build_task_args(*task, param_words(s.trials[i])).dump();
    } catch (const cli::param_error& e) {
      const auto line = s.param_lines.find(e.key());
      throw located(s, line == s.param_lines.end() ? 0 : line->second, e.what());
    } catch (const usage_error& e) {
      throw located(s, 0, e.what());
    }
  }
  if (!s.metric.name.empty() && task && task->default_result_json) {
    const json shape = json::parse(task->default_result_json())["result"];
    if (auto problem = metric_problem(s, shape, "task '" + s.task + "'"); !problem.empty())
      throw located(s, s.metric.line, problem);
    st.metric_known = true;
  }
  const bool submitter = s.slurm && st.opt.node.empty();  // its slots are on the nodes
  if (spans_gpus(s) && !submitter) st.gpu_counts = gpus_per_trial(s, st.slots);
  try {
    st.timelines = s.command.empty() && alloc::alloc_config::parse(s.alloc_conf).history > 0;
  } catch (const alloc::config_error&) {
  }  // (check_job_spec below says what is wrong with it)
  for (const auto& sl : st.slots) {
    runner::job_spec probe;
    probe.gpus = sl.gpus;
    probe.mem_limit = s.mem_limit;
    probe.alloc_conf = s.alloc_conf;
    runner::check_job_spec(probe);
  }

  st.out = s.out.empty() ? fs::path("isorun-sweep-" + short_name(s)) : fs::path(s.out);
  st.out_text = st.out.string();
  std::error_code ec;
  fs::create_directories(st.out / "logs", ec);
  if (ec) throw internal_error("cannot create " + (st.out / "logs").string() + ": " + ec.message());
  const unique_fd out_dir = detail::open_folder(st.out);
  if (!out_dir) throw internal_error("cannot open " + st.out_text + ": not a folder");
  st.logs = detail::open_subfolder(out_dir.get(), "logs", true, st.out / "logs");
  if (!st.opt.node.empty()) {
    // An array task of a Slurm submission: the submitter holds the folder and its journal; this
    // runs its listed trials whose records are not already waiting to be journaled.
    for (std::size_t i : slurm::node_trials(st.opt.node)) {
      if (i >= s.trials.size()) throw usage_error("--node " + st.opt.node + " lists trial " + std::to_string(i) +
                                                  ", but the sweep has " + std::to_string(s.trials.size()));
      if (!fs::exists(st.out / "slurm" / "results" / (trial_id(st.subject, s.trials[i]) + ".json"))) st.queue.push_back(i);
    }
    return;
  }
  st.lock.emplace(st.out, st.opt.wait_for_lock);

  const json identity = {{"task", st.subject}, {"trials", s.trials.size()}, {"fingerprint", fingerprint(s)}};
  if (fs::exists(st.out / "sweep.json")) {
    std::ifstream in(st.out / "sweep.json");
    json old = json::parse(in, nullptr, false);
    if (old.is_discarded() || old.value("fingerprint", "") != identity["fingerprint"])
      throw usage_error("output folder " + st.out_text + " holds a different sweep (task " +
                        (old.is_discarded() ? std::string("?") : old.value("task", "?")) + ", " +
                        (old.is_discarded() ? std::string("?") : std::to_string(old.value("trials", 0))) +
                        " trials); choose another --out, or remove it");
  } else {
    write_file_durably(st.out / "sweep.json", identity.dump(2) + "\n");
  }

  st.journal.emplace(st.out);
  std::set<std::string> queued;
  for (std::size_t i = 0; i < s.trials.size(); ++i) {
    const std::string id = trial_id(st.subject, s.trials[i]);
    auto it = st.journal->latest().find(id);
    const bool done = it != st.journal->latest().end() && (it->second.kind == outcome_kind::success || !st.opt.rerun_failed);
    if (done || !queued.insert(id).second) ++st.skipped;
    else st.queue.push_back(i);
  }
}

sweep_summary sweep_run::run() {
  state& st = *state_;
  if (st.ran) throw std::logic_error("sweep_run::run() called twice");
  st.ran = true;
  const sweep_spec& s = st.s;
  const sweep_options& opt = st.opt;
  const auto& slots = st.slots;
  const auto& queue = st.queue;
  const fs::path& out = st.out;

  sweep_summary summary;
  summary.total = s.trials.size();
  summary.skipped = st.skipped;
  const bool node = !opt.node.empty();

  // This run, in sweep.json: what the report says about where and how the trials ran.
  json identity;
  {
    std::ifstream in(out / "sweep.json");
    identity = json::parse(in, nullptr, false);
    if (!identity.is_object()) identity = json::object();
  }
  if (!identity.contains("runs") || !identity["runs"].is_array()) identity["runs"] = json::array();
  const int run_number = static_cast<int>(identity["runs"].size()) + 1;  // (not on a Slurm node: it is not a run)
  {
    json slot_list = json::array();
    for (const auto& sl : slots)
      slot_list.push_back({{"index", sl.index}, {"device", sl.gpus.empty() ? "cpu" : runner::visible_devices_for(sl.gpus)}});
    identity["subject"] = st.subject;
    identity["metric"] = s.metric.name.empty() ? json() : json{{"name", s.metric.name}, {"maximize", s.metric.maximize}};
    identity["runs"].push_back({{"run", run_number}, {"slots", slot_list}, {"mem_limit", s.mem_limit},
                                {"gpus_per_trial", gpus_per_trial_text(s)},
                                {"trials", queue.size()}});
    if (!node) write_file_durably(out / "sweep.json", identity.dump(2) + "\n");
  }
  const auto run_start = clock::now();

  std::mutex mutex;  // queue, journal, progress, running
  std::size_t finished = 0, running_count = 0, failed = 0;
  // What runs on each slot now, for cancelling: a worker's job, or a command.
  struct running_trial {
    std::shared_ptr<runner::job> job;
    runner::command* command = nullptr;
    void cancel() const noexcept {
      if (job) job->cancel();
      if (command) command->cancel();
    }
  };
  std::vector<running_trial> running(slots.size());
  std::optional<double> best;
  double busy_seconds = 0;
  const bool tty = opt.progress && ::isatty(STDERR_FILENO);
  std::atomic<bool> halted{false};  // fail-fast, or a metric the results do not have
  std::string metric_error;
  bool metric_checked = st.metric_known;
  std::mutex journal_mutex;
  std::condition_variable journal_cv;
  std::vector<trial_record> unwritten;
  bool writer_done = false;
  std::exception_ptr writer_error;
  stop_count = 0;

  auto progress = [&](const trial_record* r) {
    if (!opt.progress) return;
    const std::size_t todo = queue.size();
    const double avg = finished ? busy_seconds / double(finished) : 0;
    const double eta = avg * double(todo - std::min(todo, finished)) / double(std::max<std::size_t>(1, slots.size()));
    char best_text[64] = "";
    if (best) std::snprintf(best_text, sizeof best_text, " | best %s %.4g", printable(s.metric.name).c_str(), *best);
    if (tty) {
      std::fprintf(stderr, "\r\033[K[%zu/%zu done | %zu running | %zu failed | ETA %s%s]", finished, todo, running_count,
                   failed, finished ? duration(eta).c_str() : "?", best_text);
    } else if (r) {
      auto m = metric_of(s, *r);
      std::fprintf(stderr, "[%zu/%zu] %s %s%s (%.2f s on %s, attempt %d)\n", finished, todo, r->id.c_str(),
                   std::string(to_string(r->kind)).c_str(),
                   m ? printable(" " + s.metric.name + "=" + std::to_string(*m)).c_str() : "", r->wall_s,
                   printable(r->device).c_str(), r->attempts);
    }
    std::fflush(stderr);
  };

  std::optional<runner::gpu_packer> packer;  // spans_gpus(s): who gets which GPUs
  if (spans_gpus(s)) packer.emplace(slots);
  std::vector<std::string> slurm_jobs;  // Slurm arrays in flight (under mutex)
  auto cancel_running = [&] {  // caller holds mutex
    for (const auto& r : running) r.cancel();
    if (packer) packer->close();  // trials waiting for GPUs start no more
    for (const auto& job : slurm_jobs) slurm::cancel(job);
  };

  // Ctrl-C (request_stop) wakes this watcher, which says what happens and cancels what runs:
  // SIGTERM first, SIGKILL on a second request.
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC | O_NONBLOCK) != 0) throw internal_error("pipe2 failed");
  unique_fd stop_read(pipefd[0]), stop_write(pipefd[1]);
  stop_fd = stop_write.get();
  std::atomic<bool> all_done{false};
  std::thread watcher([&] {
    int announced = 0;
    while (!all_done) {
      pollfd p{stop_read.get(), POLLIN, 0};
      if (::poll(&p, 1, -1) <= 0) continue;
      char buf[16];
      while (::read(stop_read.get(), buf, sizeof buf) > 0) {
      }
      if (all_done) break;
      std::lock_guard lock(mutex);
      const int requests = stop_count.load();
      if (requests > announced) {
        if (tty) std::fprintf(stderr, "\n");
        if (announced == 0 && requests == 1)
          std::fprintf(stderr,
                       "isorun: stopping: no new trials; %zu running trial%s SIGTERM, then SIGKILL after %s; "
                       "Ctrl-C again to kill %s now\n",
                       running_count, running_count == 1 ? " gets" : "s get", format_duration(opt.grace).c_str(),
                       running_count == 1 ? "it" : "them");
        else
          std::fprintf(stderr, "isorun: killing %zu running trial%s now\n", running_count, running_count == 1 ? "" : "s");
        announced = requests;
      }
      cancel_running();
    }
  });

  // Standby workers, one pool per GPU (and one for the CPU slots): a pool's workers are
  // interchangeable until assigned, warm ones prepared for their GPU and the sweep's cap. A pool
  // starts empty and grows by a slot's share once that slot's first trial has started: the
  // slots' first workers then start without the standby ones competing for the cores, and the
  // standby ones start while the first trials run.
  struct standby_group_state {
    bool warm = false;
    std::unique_ptr<runner::standby_pool> pool;  // none without standby
    std::atomic<std::size_t> wanted{0};
  };
  std::map<int, standby_group_state> groups;  // by group_of(the slot's GPU)
  auto trial_spec = [&](const slot& sl, std::size_t index) {
    runner::job_spec spec = runner::job_spec_for(
        s.task, serialization::encoding::json, blob(st.args[index].data(), st.args[index].size()), sl.gpus,
        {.mem_limit = s.mem_limit, .timeout = s.timeout, .grace = opt.grace, .alloc_conf = s.alloc_conf});
    spec.task_libraries = opt.task_libraries;
    spec.executable = opt.executable;
    const auto g = groups.find(group_of(sl.gpus));
    spec.warm_context = g != groups.end() && g->second.warm;
    return spec;
  };
  if (!queue.empty() && s.command.empty())
    for (const auto& g : plan_standby(s, slots).groups) {
      const std::vector<gpu_info> on = g.gpu ? std::vector<gpu_info>{*g.gpu} : std::vector<gpu_info>{};
      auto& state = groups[group_of(on)];
      state.warm = g.warm;
      if (g.waiting)
        state.pool = std::make_unique<runner::standby_pool>(runner::launch_spec_for(trial_spec({.gpus = on}, queue.front())), 0);
    }
  std::vector<char> slot_started(slots.size(), 0);  // each written by its own slot's thread only

  auto stopping = [&] { return stop_count.load() > 0 || halted.load(); };
  // A trial has ended, wherever it ran: the stop policy sees it, then the journal writer gets it
  // (a cancelled trial is not journaled: a resume runs it again).
  auto finish_trial = [&](trial_record rec) {
    // An array task being stopped (scancel signals its every process): a trial that did not
    // succeed ended with the stop, whichever signal came first.
    if (node && stop_count.load() > 0 && rec.kind != outcome_kind::success) rec.kind = outcome_kind::cancelled;
    {
      std::lock_guard lock(mutex);
      if (running_count) --running_count;
      if (rec.kind == outcome_kind::cancelled) {
        ++summary.cancelled;
        return;
      }
      if (rec.kind != outcome_kind::success && s.fail_fast) {
        halted = true;
        cancel_running();
      }
      if (rec.kind == outcome_kind::success && !metric_checked && !s.metric.name.empty()) {
        // The result type was not known up front: the first result decides, here, before this
        // slot can take another trial.
        metric_checked = true;
        metric_error = metric_problem(s, rec.result, "trial " + rec.id);
        if (!metric_error.empty()) {
          halted = true;
          cancel_running();
        }
      }
    }
    // Hand the record to the journal writer and take the next trial at once.
    std::lock_guard lock(journal_mutex);
    unwritten.push_back(std::move(rec));
    journal_cv.notify_one();
  };
  // Waits for what runs a trial's attempt on slot `sl` (a job or a command: `what` says which,
  // so that Ctrl-C can reach it), and records how it ended in `rec`.
  auto await = [&](const slot& sl, running_trial what, auto& runs, trial_record& rec) -> const auto& {
    {
      std::lock_guard lock(mutex);
      running[static_cast<std::size_t>(sl.index)] = what;
    }
    if (stopping()) runs.cancel();
    const auto& r = runs.wait();
    {
      std::lock_guard lock(mutex);
      running[static_cast<std::size_t>(sl.index)] = {};
    }
    rec.kind = r.status.kind;
    rec.peak_reserved = r.status.peak_reserved;
    rec.peak_allocated = r.status.peak_allocated;
    rec.error = r.status.ok() ? "" : r.status.describe();
    return r;
  };
  // One trial on slot `sl`, its retries included; runner::run_on_slots hands them out.
  auto run_trial = [&](const slot& sl, std::size_t queued) {
    std::size_t index;
    {
      std::lock_guard lock(mutex);
      if (stopping()) return;
      index = queue[queued];
      ++running_count;
      progress(nullptr);
    }
    const json& params = s.trials[index];
    trial_record rec;
    rec.id = trial_id(st.subject, params);
    rec.params = params;
    rec.slot = sl.index;
    rec.device = sl.gpus.empty() ? "cpu" : runner::visible_devices_for(sl.gpus);
    rec.mem_limit = s.mem_limit;
    rec.run = node ? 0 : run_number;  // a node's slots and clock are its own
    const auto t0 = clock::now();
    rec.start_s = std::chrono::duration<double>(t0 - run_start).count();
    // A trial's log file, created (or emptied) in OUT/logs by name; an empty descriptor, and
    // `problem` saying why, if something there is not a file isorun may write (a link, a FIFO).
    auto log_file = [&](const std::string& suffix, std::string& problem) {
      try {
        return detail::open_file(st.logs.get(), rec.id + suffix, O_WRONLY | O_CREAT | O_TRUNC, out / "logs" / (rec.id + suffix));
      } catch (const std::exception& e) {
        problem = e.what();
        return unique_fd();
      }
    };
    for (int attempt = 1;; ++attempt) {
      const fs::path log = out / "logs" / rec.id;
      std::string log_problem;
      unique_fd err = log_file(".err", log_problem);
      rec.attempts = attempt;
      rec.result = nullptr;
      if (!log_problem.empty()) {
        rec.kind = outcome_kind::internal_error;
        rec.error = log_problem;
        break;
      }
      if (s.command.empty()) {
        if (!log_file(".out", log_problem)) {  // (checked here, opened for the worker when it is assigned)
          rec.kind = outcome_kind::internal_error;
          rec.error = log_problem;
          break;
        }
        runner::job_spec spec = trial_spec(sl, index);
        spec.stdout_to = runner::stdout_mode::file;
        spec.stdout_path = log.string() + ".out";
        if (st.timelines) {
          spec.memory_timeline = log.string() + ".memory.json";
          rec.timeline = "logs/" + rec.id + ".memory.json";
        }
        spec.stderr_echo_fd = err.get();
        std::shared_ptr<runner::job> job;
        try {
          const auto g = groups.find(group_of(sl.gpus));
          if (g == groups.end() || !g->second.pool) {
            job = runner::job::start(std::move(spec));
          } else {
            job = runner::job::start(std::move(spec), *g->second.pool);
            if (!std::exchange(slot_started[static_cast<std::size_t>(sl.index)], 1))
              g->second.pool->reserve(g->second.wanted += static_cast<std::size_t>(s.standby));
          }
        } catch (const std::exception& e) {
          rec.kind = outcome_kind::internal_error;
          rec.error = e.what();
          break;
        }
        const runner::job_result& r = await(sl, {.job = job}, *job, rec);
        if (r.status.ok()) {
          json parsed = json::parse(std::string_view(reinterpret_cast<const char*>(r.payload.data()), r.payload.size()),
                                    nullptr, false);
          if (parsed.is_object() && parsed.contains("result")) {
            rec.result = parsed["result"];
          } else {
            rec.kind = outcome_kind::invalid_result;
            rec.error = "worker result is not valid JSON";
          }
        }
      } else {
        // A command: its stdout to the log, its result from $ISORUN_RESULT or its last JSON line.
        const fs::path result_file = fs::absolute(log.string() + ".result.json");
        std::error_code ec;
        fs::remove(result_file, ec);
        unique_fd stdout_file = log_file(".out", log_problem);
        std::unique_ptr<runner::command> cmd;
        try {
          if (!stdout_file) throw internal_error(log_problem);
          cmd = runner::command::start({.argv = command_for(s.command, params),
                                        .gpus = sl.gpus,
                                        .mem_limit = s.mem_limit,
                                        .timeout = s.timeout,
                                        .grace = opt.grace,
                                        .extra_env = {"ISORUN_RESULT=" + result_file.string(), "ISORUN_TRIAL=" + rec.id},
                                        .stdin_fd = -1,
                                        .stdout_fd = stdout_file.get(),
                                        .stderr_fd = err.get(),
                                        .stderr_tail_lines = 20});
        } catch (const std::exception& e) {
          rec.kind = outcome_kind::internal_error;
          rec.error = e.what();
          break;
        }
        const runner::command_result& r = await(sl, {.command = cmd.get()}, *cmd, rec);
        if (r.status.ok()) {
          try {
            rec.result = read_command_result(st.logs.get(), rec.id, out / "logs");
          } catch (const std::exception& e) {
            rec.kind = outcome_kind::invalid_result;
            rec.error = std::string("invalid_result: ") + e.what();
          }
        }
      }
      const auto allowed = s.retries.find(std::string(to_string(rec.kind)));
      const bool retry = rec.kind != outcome_kind::success && rec.kind != outcome_kind::cancelled &&
                         allowed != s.retries.end() && attempt <= allowed->second && !stopping();
      if (!retry) break;
    }
    rec.wall_s = std::chrono::duration<double>(clock::now() - t0).count();
    if (std::error_code ec; !rec.timeline.empty() && !fs::exists(out / rec.timeline, ec)) rec.timeline.clear();  // it died first

    finish_trial(std::move(rec));
  };

  // The journal writer: appends what the slots hand over, one fsync per batch (group commit).
  // A trial counts as done only once its record is durable.
  std::thread writer([&] {
    std::unique_lock lk(journal_mutex);
    for (;;) {
      journal_cv.wait(lk, [&] { return !unwritten.empty() || writer_done; });
      if (unwritten.empty()) return;
      std::vector<trial_record> batch = std::move(unwritten);
      unwritten.clear();
      lk.unlock();
      bool written = false;
      if (!writer_error) {  // after a failed write nothing more is journaled: those trials rerun
        try {
          if (node) {
            // Array task of a Slurm submission: each record as a file of its own, for the
            // submitter to journal (written whole, then renamed).
            for (const auto& rec : batch)
              write_file_durably(out / "slurm" / "results" / (rec.id + ".json"), rec.to_json().dump() + "\n");
          } else {
            st.journal->append(batch);
          }
          written = true;
        } catch (...) {
          // The sweep cannot record results: it stops (as fail-fast does, not as Ctrl-C), and
          // says why when run() returns.
          writer_error = std::current_exception();
          std::lock_guard lock(mutex);
          halted = true;
          cancel_running();
        }
      }
      if (written) {
        std::lock_guard lock(mutex);
        for (auto& rec : batch) {
          ++finished;
          busy_seconds += rec.wall_s;
          if (rec.kind == outcome_kind::success) {
            ++summary.succeeded;
            if (auto m = metric_of(s, rec); m && (!best || (s.metric.maximize ? *m > *best : *m < *best))) best = m;
          } else {
            ++failed;
            ++summary.failed;
          }
          progress(&rec);
        }
      }
      lk.lock();
    }
  });

  // Slurm: the trials go out as job arrays; each array task's isorun leaves its trials' records
  // in OUT/slurm/results/, which are journaled here, through finish_trial as local trials are.
  // An array task that ended without a trial's record is asked about (scontrol): the trial is
  // classified by how Slurm says it ended, and retried by the same policy, in a new array.
  auto run_on_slurm = [&] {
    const fs::path dir = out / "slurm";
    std::map<std::string, std::size_t> index_of;  // trial id -> index in s.trials
    for (std::size_t i : queue) index_of[trial_id(st.subject, s.trials[i])] = i;
    std::map<std::size_t, int> attempts;          // by trial index
    std::set<std::size_t> done;
    std::map<std::string, slurm::submission> inflight;
    auto save_jobs = [&] {
      json jobs = json::array();
      for (const auto& [job, sub] : inflight) jobs.push_back({{"job", job}, {"batch", sub.batch}});
      write_file_durably(dir / "jobs.json", jobs.dump() + "\n");
      std::lock_guard lock(mutex);
      slurm_jobs.clear();
      running_count = 0;
      for (const auto& [job, sub] : inflight) {
        slurm_jobs.push_back(job);
        for (const auto& t : sub.tasks) running_count += t.size();
      }
    };
    // Arrays a previous run left queued or running (it was killed, or detached): followed, not
    // submitted again.
    {
      std::ifstream in(dir / "jobs.json");
      const json jobs = json::parse(in, nullptr, false);
      if (jobs.is_array())
        for (const auto& j : jobs) {
          const std::string job = j.value("job", "");
          const int batch = j.value("batch", 0);
          std::ifstream b(dir / ("batch-" + std::to_string(batch) + ".json"));
          const json tasks = json::parse(b, nullptr, false);
          if (job.empty() || !tasks.is_object() || slurm::active_tasks(job).empty()) continue;
          inflight[job] = {job, batch, tasks["tasks"].get<std::vector<std::vector<std::size_t>>>()};
        }
    }
    // Journals the records array tasks left.
    auto merge = [&] {
      std::error_code ec;
      for (const auto& e : fs::directory_iterator(dir / "results", ec)) {
        if (e.path().extension() != ".json") continue;  // (".tmp": still being written)
        std::ifstream in(e.path());
        const json j = json::parse(in, nullptr, false);
        trial_record rec;
        try {
          rec = trial_record::from_json(j);
        } catch (const std::exception&) {
          fs::remove(e.path(), ec);  // not a record
          continue;
        }
        // A file is removed once its record is durable in the journal: by the next run, which
        // finds its trial journaled (and so not among this run's trials), or at the end below.
        const auto it = index_of.find(rec.id);
        // After Ctrl-C, a failure may be the stop itself (scancel signals every process of an
        // array task, the trial's worker too): not journaled, so that running again runs it.
        const bool stopped_by_us = stopping() && rec.kind != outcome_kind::success;
        if (it == index_of.end() || stopped_by_us) fs::remove(e.path(), ec);
        if (it == index_of.end() || stopped_by_us || !done.insert(it->second).second) continue;
        rec.attempts = std::max(rec.attempts, attempts[it->second]);
        finish_trial(std::move(rec));
      }
    };
    merge();  // records left by arrays that ended while no one was following (detached, killed)
    std::set<std::size_t> owed;
    for (std::size_t i : queue)
      if (!done.count(i)) owed.insert(i);
    for (const auto& [job, sub] : inflight)
      for (const auto& t : sub.tasks)
        for (std::size_t i : t) owed.erase(i);
    const std::vector<std::string> node_command = opt.node_command;
    auto submit = [&](const std::vector<std::size_t>& trials) {
      if (trials.empty()) return;
      auto sub = slurm::submit(*s.slurm, out, trials, node_command, opt.submit_dir, "isorun-" + short_name(s));
      std::fprintf(stderr, "isorun: submitted %zu trial%s as Slurm job array %s (%zu array task%s)\n", trials.size(),
                   trials.size() == 1 ? "" : "s", sub.job.c_str(), sub.tasks.size(), sub.tasks.size() == 1 ? "" : "s");
      inflight[sub.job] = std::move(sub);
      save_jobs();
    };
    for (std::size_t i : owed) attempts[i] = 1;
    submit(std::vector<std::size_t>(owed.begin(), owed.end()));
    save_jobs();
    if (opt.detach) {
      summary.detached = true;
      for (const auto& [job, sub] : inflight) summary.jobs.push_back(job);
      return;
    }
    while (!inflight.empty() && !stopping()) {
      merge();
      std::vector<std::size_t> again;
      for (auto it = inflight.begin(); it != inflight.end();) {
        const slurm::submission& sub = it->second;
        if (!slurm::active_tasks(sub.job).empty()) {
          ++it;
          continue;
        }
        // Stopping (Ctrl-C) cancels the arrays: what ends now is not lost, and is not classified;
        // the trials are not journaled, so running again runs them. (stopping() is true before
        // the watcher's scancel.)
        if (stopping()) break;
        merge();  // what the last tasks left just before they ended
        const auto states = slurm::task_states(sub.job);
        for (std::size_t k = 0; k < sub.tasks.size(); ++k) {
          const std::string task = sub.job + "_" + std::to_string(k);
          const auto st_it = states.find(static_cast<int>(k));
          const slurm::task_end end = st_it == states.end() ? slurm::task_end{"UNKNOWN"} : st_it->second;
          // The node's isorun refused its trials (a GPU it lacks, say): every array task would
          // say the same, so nothing is retried, and the node's reason is the sweep's.
          if (const auto why = slurm::node_usage_error(end, dir / "logs" / (task + ".out"))) {
            for (const auto& [job, other] : inflight) slurm::cancel(job);
            inflight.clear();
            save_jobs();
            throw usage_error("on Slurm, array task " + task + " refused its trials: " + *why + " (its log: " +
                              (dir / "logs" / (task + ".out")).string() + ")");
          }
          for (std::size_t i : sub.tasks[k]) {
            if (done.count(i)) continue;
            const std::string& state = end.state;
            const outcome_kind kind = slurm::outcome_of(state);
            const auto allowed = s.retries.find(std::string(to_string(kind)));
            if (allowed != s.retries.end() && attempts[i] <= allowed->second) {
              ++attempts[i];
              again.push_back(i);
              continue;
            }
            done.insert(i);
            trial_record rec;
            rec.id = trial_id(st.subject, s.trials[i]);
            rec.params = s.trials[i];
            rec.kind = kind;
            rec.attempts = attempts[i];
            rec.device = "slurm:" + sub.job + "_" + std::to_string(k);
            rec.mem_limit = s.mem_limit;
            rec.error = "Slurm array task " + task + " ended " + state + " without the trial's record (its log: " +
                        (dir / "logs" / (task + ".out")).string() + ")";
            finish_trial(std::move(rec));
          }
        }
        it = inflight.erase(it);
        save_jobs();
      }
      submit(again);
      if (!inflight.empty() && !stopping()) std::this_thread::sleep_for(std::chrono::milliseconds(250));  // polling Slurm
    }
    merge();
    std::lock_guard lock(mutex);
    running_count = 0;
  };
  // Whatever happens where trials run (sbatch refusing an array, say), the writer and the
  // watcher are brought down first; then it is reported.
  std::exception_ptr dispatch_error;
  try {
    if (s.slurm && !node)
      run_on_slurm();
    else if (packer)
      runner::run_on_packed_gpus(
          *packer, slots.size(), queue.size(), [&](std::size_t queued) { return st.gpu_counts[queue[queued]]; },
          run_trial, stopping);
    else
      runner::run_on_slots(slots, queue.size(), run_trial, stopping);
  } catch (...) {
    dispatch_error = std::current_exception();
  }
  {
    std::lock_guard lk(journal_mutex);
    writer_done = true;
    journal_cv.notify_one();
  }
  writer.join();
  all_done = true;
  [[maybe_unused]] auto woken = ::write(stop_write.get(), "", 1);  // wake the watcher now, not at its next poll
  watcher.join();
  stop_fd = -1;
  if (dispatch_error) std::rethrow_exception(dispatch_error);
  if (writer_error) std::rethrow_exception(writer_error);
  if (tty) std::fprintf(stderr, "\n");
  if (!metric_error.empty()) throw located(s, s.metric.line, metric_error + "; the sweep was stopped");
  summary.interrupted = stop_count.load() > 0;
  if (node || summary.detached) return summary;  // the submitter journals and tabulates
  if (s.slurm) {  // the array tasks' records that are now durable in the journal
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(out / "slurm" / "results", ec))
      if (st.journal->latest().count(e.path().stem().string())) fs::remove(e.path(), ec);
  }

  // Results in spec order, then results.csv.
  const auto& latest = st.journal->latest();
  std::set<std::string> listed;
  for (const auto& t : s.trials) {
    auto it = latest.find(trial_id(st.subject, t));
    if (it != latest.end() && listed.insert(it->first).second) summary.records.push_back(it->second);
  }
  write_file_durably(out / "results.csv", results_csv(summary.records));
  identity["runs"].back()["wall_s"] = std::chrono::duration<double>(clock::now() - run_start).count();
  write_file_durably(out / "sweep.json", identity.dump(2) + "\n");
  try {
    write_report(out);
    summary.report = (out / "report.html").string();
  } catch (const std::exception& e) {  // the results are safe; only the page is missing
    std::fprintf(stderr, "isorun: warning: no report: %s\n", printable(e.what()).c_str());
  }
  return summary;
}

}  // namespace isorun::sweep
