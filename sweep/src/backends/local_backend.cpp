// The local backend: lane threads take attempts from one queue and run each in a fresh capped
// worker (or the sweep's command) on their slot, or on GPUs the packer gives them.
#include "backends/local_backend.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <limits>
#include <utility>

#include "engine/folder.hpp"
#include "isorun/runner/bounded_json.hpp"
#include "isorun/runner/command.hpp"
#include "isorun/runner/driver_cap.hpp"
#include "isorun/runner/errors.hpp"
#include "isorun/runner/placement.hpp"
#include "isorun/runner/worker_env.hpp"
#include "isorun/serialization/machine.hpp"
#include "isorun/sweep/report_lines.hpp"
#include "trials/trial_program.hpp"

namespace isorun::sweep {

namespace {
namespace fs = std::filesystem;
using nlohmann::json;

// The changes of what a command trial holds that its memory timeline keeps (the cap's ledger
// keeps them in a ring): a quarter of what `isorun --memory-timeline` keeps for one command, as
// a sweep keeps a timeline per trial.
constexpr std::size_t command_memory_events = 1 << 16;

// Slots sharing a GPU (or all the CPU slots) share standby workers: the GPU's index, -1 for none.
int group_of(const std::vector<gpu_info>& gpus) { return gpus.empty() ? -1 : gpus.front().index; }

// The last line of `text` that is a JSON object, or null.
// @throws std::runtime_error if that line is nested too deep (parse_bounded_json): the result the
//         command meant, refused, not an earlier line taken for it.
json last_json_line(const std::string& text) {
  std::size_t end = text.size();
  while (end > 0) {
    const std::size_t begin = text.rfind('\n', end - 1);
    const std::size_t first = begin == std::string::npos ? 0 : begin + 1;
    std::string_view line(text.data() + first, end - first);
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.remove_suffix(1);
    while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
    if (!line.empty() && line.front() == '{') {
      bool too_deep = false;
      json j = parse_bounded_json(line, &too_deep);
      if (j.is_object()) return j;
      if (too_deep)
        throw std::runtime_error("its last JSON line is nested deeper than " + std::to_string(max_json_depth) +
                                 " levels");
    }
    if (begin == std::string::npos) break;
    end = begin;
  }
  return nullptr;
}

// A command's result: the JSON object it wrote to $ISORUN_RESULT (`id`.result.json in `logs`,
// shown as `shown`), else the last line of its stdout (`id`.out) that is a JSON object; null if
// neither. Read as the folder's other files are: by name, not through links, bounded.
// @throws std::runtime_error if the result file is there but not a JSON object; usage_error if a
//         link or anything but a regular file is there.
json read_command_result(int logs, const std::string& id, const fs::path& shown) {
  const std::string result_name = id + ".result.json";
  if (const unique_fd result = detail::open_file(logs, result_name, O_RDONLY, shown / result_name)) {
    bool too_deep = false;
    json j = parse_bounded_json(detail::read_all(result.get(), journal::max_line, shown / result_name), &too_deep);
    if (too_deep)
      throw std::runtime_error("the file it wrote to $ISORUN_RESULT is nested deeper than " +
                               std::to_string(max_json_depth) + " levels");
    if (!j.is_object()) throw std::runtime_error("the file it wrote to $ISORUN_RESULT is not a JSON object");
    return j;
  }
  // A result line is at the end of what a program prints: its last MiB is enough.
  const unique_fd log = detail::open_file(logs, id + ".out", O_RDONLY, shown / (id + ".out"));
  if (!log) return nullptr;
  const off_t size = ::lseek(log.get(), 0, SEEK_END);
  const off_t from = std::max<off_t>(0, size - (1 << 20));
  if (size < 0 || ::lseek(log.get(), from, SEEK_SET) != from) return nullptr;
  return last_json_line(detail::read_all(log.get(), 1 << 20, shown / (id + ".out")));
}

// Commits the checkpoints a command announces, in order, on a thread of the trial's: the log
// follower's thread, which reads every trial's log, must not wait for a commit's fsyncs.
class checkpoint_committer {
 public:
  explicit checkpoint_committer(std::function<void(std::int64_t)> commit) : commit_{std::move(commit)} {
    thread_ = std::thread([this] { run(); });
  }
  checkpoint_committer(const checkpoint_committer&) = delete;
  checkpoint_committer& operator=(const checkpoint_committer&) = delete;
  ~checkpoint_committer() { finish(); }

  void announce(std::int64_t step) {
    {
      std::lock_guard lock(mutex_);
      pending_.push_back(step);
    }
    changed_.notify_one();
  }

  /// Commits what was announced, then stops: at the trial's end, or on any way out.
  void finish() noexcept {
    if (!thread_.joinable()) return;
    {
      std::lock_guard lock(mutex_);
      finishing_ = true;
    }
    changed_.notify_one();
    thread_.join();
  }

 private:
  void run() {
    std::unique_lock lock(mutex_);
    for (;;) {
      changed_.wait(lock, [&] { return finishing_ || !pending_.empty(); });
      if (pending_.empty()) return;  // finishing, and all committed
      const std::int64_t step = pending_.front();
      pending_.pop_front();
      lock.unlock();
      commit_(step);
      lock.lock();
    }
  }

  std::function<void(std::int64_t)> commit_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::int64_t> pending_;  // announced, not yet committed
  bool finishing_ = false;
  std::thread thread_;
};

// A trial's log file, created (or emptied) in OUT/logs by name; an empty descriptor, and
// `problem` saying why, if something there is not a file isorun may write (a link, a FIFO).
unique_fd log_file(int logs, const fs::path& out, const std::string& name, std::string& problem, int flags = 0) {
  try {
    return detail::open_file(logs, name, O_WRONLY | O_CREAT | O_TRUNC | flags, out / "logs" / name);
  } catch (const std::exception& e) {
    problem = e.what();
    return unique_fd();
  }
}
constexpr const char* resumes_file = "resumes.jsonl";

// What the last attempt's log says it reached, from its last 64 KiB: its last report's step, and
// the last checkpoint it announced (-1: none).
struct log_tail {
  std::int64_t reported = -1;
  std::int64_t announced = -1;
};

log_tail last_steps(int logs, const std::string& name) {
  log_tail last;
  try {
    const unique_fd log = detail::open_file(logs, name, O_RDONLY, name);
    if (!log) return last;
    const off_t size = ::lseek(log.get(), 0, SEEK_END);
    constexpr off_t tail = 64 << 10;
    if (size < 0 || ::lseek(log.get(), std::max<off_t>(0, size - tail), SEEK_SET) < 0) return last;
    report_lines lines{[&](std::int64_t step, const json&) { last.reported = std::max(last.reported, step); },
                       {},
                       false,
                       [&](std::int64_t step) { last.announced = std::max(last.announced, step); }};
    char buf[1 << 16];
    for (ssize_t n; (n = ::read(log.get(), buf, sizeof buf)) > 0;) lines.feed(buf, static_cast<std::size_t>(n));
  } catch (const std::exception&) {  // no log, or not one isorun may read: nothing known
  }
  return last;
}

void append_resume(const fs::path& folder, const json& resume) {
  const unique_fd dir = detail::open_folder(folder);
  const unique_fd file = detail::open_file(dir.get(), resumes_file, O_RDWR | O_CREAT | O_APPEND, folder / resumes_file);
  // (A line a killed supervisor left half written goes first.)
  detail::drop_cut_line(file.get(),
                        detail::for_each_line(file.get(), 4096, folder / resumes_file, [](auto, int, bool) {}),
                        folder / resumes_file);
  if (detail::write_all(file.get(), resume.dump() + "\n") != 0)
    throw internal_error("cannot write " + (folder / resumes_file).string());
}

// The folder's resumes, oldest first; lines that are not resumes are skipped (the folder is the
// trial's to write into too).
json read_resumes(const fs::path& folder) {
  json all = json::array();
  try {
    const unique_fd dir = detail::open_folder(folder);
    const unique_fd file = detail::open_file(dir.get(), resumes_file, O_RDONLY, folder / resumes_file);
    detail::for_each_line(file.get(), 4096, folder / resumes_file, [&](std::string_view line, int, bool too_long) {
      if (too_long) return;
      json r = parse_bounded_json(line);
      if (r.is_object() && r.value("from", json()).is_number_integer() && r.value("redone", json()).is_number_integer())
        all.push_back(std::move(r));
    });
  } catch (const std::exception&) {
  }
  return all;
}

}  // namespace

standby_plan plan_standby(const sweep_spec& s, const std::vector<slot>& slots) {
  standby_plan plan;
  if (!program_of(s)->in_worker()) {
    plan.how = "each trial a fresh process";
    return plan;
  }
  if (s.standby <= 0 && !s.zygote) {
    plan.how = "no standby workers";
    return plan;
  }
  if (spans_gpus(s)) {  // a standby worker would have to wait for GPUs it cannot know yet
    plan.how = s.zygote ? "each trial's interpreter exec'd (trials span GPUs; start: zygote forks for one GPU)"
                        : "no standby workers (trials span GPUs)";
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
    if (g.gpu && !s.zygote) {  // (a zygote's children create their contexts when they run)
      g.warm = s.warm_context && runner::warm_standby_fits(*g.gpu, n, s.mem_limit, g.waiting);
      std::string& list = g.warm ? warm_on : cold_on;
      list += (list.empty() ? "" : ",") + std::to_string(key);
    }
    plan.groups.push_back(std::move(g));
  }
  plan.how = s.zygote ? "forked from a zygote, " + std::to_string(s.standby) + " waiting per slot"
                      : "standby: " + std::to_string(s.standby) + " per slot";
  if (!warm_on.empty()) plan.how += ", warm CUDA contexts on GPU " + warm_on;
  if (!cold_on.empty())
    plan.how += s.warm_context ? ", cold on GPU " + cold_on + " (no room beside the caps for a context each)"
                               : ", cold (warm_context: false)";
  return plan;
}

std::map<int, std::uint64_t> trial_memory(const sweep_spec& s, const std::vector<slot>& slots) {
  std::map<int, std::uint64_t> memory;
  for (const auto& sl : slots)
    if (sl.gpus.size() == 1) memory[sl.gpus.front().index] = sl.gpus.front().free_memory;
  for (const auto& g : plan_standby(s, slots).groups)
    if (g.gpu && g.warm) {
      std::uint64_t& bytes = memory[g.gpu->index];
      bytes -= std::min<std::uint64_t>(bytes, g.waiting * runner::warm_context_room);
    }
  return memory;
}

void local_backend::running_trial::cancel(int first_signal) const noexcept {
  if (waiting) waiting->cancel();
  if (job) job->cancel(first_signal);
  if (command) command->cancel(first_signal);
}

int local_backend::planned_stop_signal() const noexcept {
  return setup_.spec->checkpoints ? setup_.spec->checkpoints.signal : SIGTERM;
}

local_backend::local_backend(local_setup setup)
    : setup_{std::move(setup)},
      admission_{setup_.options->admission ? setup_.options->admission : &runner::admission::process()},
      slot_started_(setup_.slots.size(), 0),
      running_(setup_.slots.size()) {
  const sweep_spec& s = *setup_.spec;
  std::size_t cpu_slots = 0;
  for (const auto& sl : setup_.slots) {
    if (sl.gpus.empty()) ++cpu_slots;
    for (const auto& g : sl.gpus) ++slots_on_[g.index];
  }
  // A sweep's CPU slots beyond the cores were asked for: they are its in the admission too.
  if (cpu_slots) widened_ = admission_->widen_cpu_slots(cpu_slots);
  // Trials whose caps differ (out-of-memory retries) are packed by memory, on any GPU where the
  // cap fits; trials spanning GPUs take places on several. Otherwise each lane keeps its slot.
  const bool on_gpus = std::any_of(setup_.slots.begin(), setup_.slots.end(),
                                   [](const slot& sl) { return !sl.gpus.empty(); });
  if (spans_gpus(s) || (s.oom_retry && on_gpus))
    packer_.emplace(setup_.slots, s.oom_retry ? trial_memory(s, setup_.slots) : std::map<int, std::uint64_t>{});
}

local_backend::~local_backend() { finish(); }

runner::job_spec local_backend::trial_spec(const slot& sl, const nlohmann::json& params,
                                           std::uint64_t mem_limit) const {
  const sweep_spec& s = *setup_.spec;
  const std::string args = setup_.program->request(params);
  runner::job_spec spec = runner::job_spec_for(
      setup_.program->worker_task(), serialization::encoding::json, blob(args.data(), args.size()), sl.gpus,
      {.mem_limit = mem_limit,
       .host_mem_limit = s.host_mem_limit,
       // Each trial's share of the cores, as its thread limits: they share them with the other slots.
       .cpus_per_call = static_cast<unsigned>(
           std::max<std::size_t>(1, serialization::usable_cores() / std::max<std::size_t>(1, setup_.slots.size()))),
       .timeout = s.timeout,
       .grace = setup_.options->grace,
       .alloc_conf = s.alloc_conf});
  spec.task_libraries = setup_.options->task_libraries;
  spec.executable = setup_.options->executable;
  setup_.program->launch(spec);
  const auto g = groups_.find(group_of(sl.gpus));
  spec.warm_context = g != groups_.end() && g->second.warm;
  return spec;
}

// Standby workers, one pool per GPU (and one for the CPU slots): a pool's workers are
// interchangeable until assigned, warm ones prepared for their GPU and the sweep's cap. A pool
// starts empty and grows by a slot's share once that slot's first trial has started: the
// slots' first workers then start without the standby ones competing for the cores, and the
// standby ones start while the first trials run.
// With start: zygote, the trials wait for the zygote's imports (or its failure): each trial is
// then forked from it, rather than the first ones exec'd beside those imports on the same cores.
void local_backend::make_standby_pools() {
  if (!setup_.first || !setup_.program->in_worker()) return;
  std::vector<runner::standby_pool*> zygotes;
  {
    std::lock_guard lock(mutex_);  // (cancel_all() may come meanwhile, from another thread)
    for (const auto& g : plan_standby(*setup_.spec, setup_.slots).groups) {
      const std::vector<gpu_info> on = g.gpu ? std::vector<gpu_info>{*g.gpu} : std::vector<gpu_info>{};
      auto& state = groups_[group_of(on)];
      state.warm = g.warm;
      state.planned = g.waiting;
      if (!g.waiting && !setup_.spec->zygote) continue;
      runner::launch_spec launch = runner::launch_spec_for(
          trial_spec({.gpus = on}, *setup_.first, setup_.spec->mem_limit));
      launch.zygote = setup_.spec->zygote;
      state.pool = std::make_unique<runner::standby_pool>(std::move(launch), 0);
      if (setup_.spec->zygote) zygotes.push_back(state.pool.get());
      if (cancelled_) state.pool->interrupt();
    }
  }
  for (auto* pool : zygotes) pool->fill();  // (its target is 0 yet: the zygote alone)
}

std::vector<trial> local_backend::begin(trial_sink& sink) {
  sink_ = &sink;
  make_standby_pools();
  for (std::size_t k = 0; k < setup_.slots.size(); ++k) lanes_.emplace_back([this, k] { lane(k); });
  return {};
}

void local_backend::start(std::vector<trial> batch) {
  std::lock_guard lock(mutex_);
  for (auto& t : batch) pending_.push_back(std::move(t));
  work_.notify_all();
}

void local_backend::stop(const trial& t) {
  std::lock_guard lock(mutex_);
  stop_wanted_.insert(t.index);
  for (const auto& r : running_)
    if ((r.waiting || r.job || r.command) && r.index == t.index) r.cancel(SIGTERM);  // pruned: no warning
}

void local_backend::cancel_all() {
  std::lock_guard lock(mutex_);
  cancelled_ = true;
  for (const auto& r : running_) r.cancel(planned_stop_signal());
  for (auto& [key, g] : groups_)
    if (g.pool) g.pool->interrupt();  // a zygote still importing is not waited for
  if (packer_) packer_->close();      // attempts waiting for GPUs start no more
  work_.notify_all();
}

void local_backend::finish() {
  {
    std::lock_guard lock(mutex_);
    done_ = true;
    work_.notify_all();
  }
  for (auto& t : lanes_)
    if (t.joinable()) t.join();
}

// Lane `k`: takes the next attempt and runs it on slot k (or on GPUs the packer gives it).
void local_backend::lane(std::size_t k) {
  for (;;) {
    trial t;
    bool skip = false;
    {
      std::unique_lock lock(mutex_);
      work_.wait(lock, [&] { return !pending_.empty() || done_; });
      if (pending_.empty()) return;
      t = std::move(pending_.front());
      pending_.pop_front();
      skip = cancelled_ || stop_wanted_.count(t.index);
    }
    slot sl = setup_.slots[k];
    std::optional<std::vector<gpu_info>> taken;
    const std::uint64_t cap = cap_of(t, *setup_.spec);
    std::string refused;  // GPUs a trial a source made cannot have (the spec's are checked up front)
    if (packer_ && !skip) {
      try {
        taken = packer_->acquire(gpus_of_trial(*setup_.spec, t.params), cap);
      } catch (const std::exception& e) {
        refused = e.what();
      }
      if (taken) sl = slot{*taken, static_cast<int>(k)};
    }
    std::shared_ptr<runner::admission::ticket> ticket;
    if (refused.empty() && !skip && (!packer_ || taken)) ticket = admit(k, sl, t, cap, refused, skip);
    trial_record rec;
    if (!refused.empty() || skip || (packer_ && !taken)) {  // refused, or stopped before it could start
      rec.id = t.id;
      rec.params = t.params;
      rec.origin = t.origin;
      rec.attempts = t.attempt;
      rec.kind = refused.empty() ? outcome_kind::cancelled : outcome_kind::task_error;
      if (!refused.empty()) rec.error = "task_error: " + refused;
    } else {
      rec = attempt(sl, t, ticket);
    }
    ticket.reset();  // (a worker holds its own until it is reaped)
    if (taken) packer_->release(*taken, cap);
    {
      std::lock_guard lock(mutex_);
      stop_wanted_.erase(t.index);
    }
    sink_->on_finished({{std::move(t), std::move(rec)}});
  }
}

// The trial asks for its cap on each of its GPUs the admission has (no cap: its slot's share of
// the GPU), or for a CPU slot; the lane waits in the queue where a stop can reach it.
std::shared_ptr<runner::admission::ticket> local_backend::admit(std::size_t lane, const slot& sl, const trial& t,
                                                                std::uint64_t cap, std::string& refused,
                                                                bool& stopped) {
  runner::admission_request request;
  std::uint64_t share = std::numeric_limits<std::uint64_t>::max();
  for (const auto& g : sl.gpus)
    for (const auto& known : admission_->shares().gpus)
      if (known.uuid == g.uuid) {
        request.gpus.push_back(known.index);
        share = std::min(share, known.free_memory / std::max<std::size_t>(1, slots_on_[g.index]));
      }
  if (!sl.gpus.empty() && request.gpus.empty()) return nullptr;  // GPUs of another inventory (a test's)
  if (!request.gpus.empty()) request.mem_limit = cap ? cap : share;
  std::shared_ptr<runner::admission::waiter> place;
  try {
    place = admission_->enqueue(std::move(request));
  } catch (const usage_error& e) {
    refused = e.what();
    return nullptr;
  }
  {
    std::lock_guard lock(mutex_);
    running_[lane] = {.index = t.index, .waiting = place};
    if (cancelled_ || stop_wanted_.count(t.index)) place->cancel();
  }
  std::shared_ptr<runner::admission::ticket> ticket;
  try {
    ticket = place->get();
  } catch (const cancelled&) {
    stopped = true;
  }
  std::lock_guard lock(mutex_);
  running_[lane] = {};
  return ticket;
}

// Waits for what runs an attempt on slot `sl` (a job or a command: `what` says which, so that a
// stop can reach it), and records how it ended in `rec`.
template <class Runs>
auto local_backend::await(const slot& sl, const trial& t, running_trial what, Runs& runs, trial_record& rec)
    -> decltype(runs.wait()) {
  const auto lane = static_cast<std::size_t>(sl.index);
  what.index = t.index;
  int stop_now = 0;  // the signal of a stop that came before it started
  {
    std::lock_guard lock(mutex_);
    running_[lane] = what;
    if (stop_wanted_.count(t.index)) stop_now = SIGTERM;
    else if (cancelled_) stop_now = planned_stop_signal();
  }
  if (stop_now) runs.cancel(stop_now);
  const auto& r = runs.wait();
  {
    std::lock_guard lock(mutex_);
    running_[lane] = {};
  }
  rec.kind = r.status.kind;
  // isorun's own stops end an attempt cancelled or timed out. A SIGTERM from elsewhere is how a
  // batch system or service manager stops every process of a job it ends, requeues or preempts,
  // the trial's as well as isorun's, in an order of its own: a trial that keeps checkpoints was
  // preempted, whether or not isorun has been told yet (if it saved since it started: attempt).
  rec.preempted = setup_.spec->checkpoints && r.status.kind == outcome_kind::crashed && r.status.exit.signal == SIGTERM;
  rec.peak_reserved = r.status.peak_reserved;
  rec.peak_allocated = r.status.peak_allocated;
  rec.error = r.status.ok() ? "" : r.status.describe();
  return r;
}

// The trial's checkpoint folder, cleared of what an attempt stopped half-way left; the latest
// checkpoint the attempt resumes from, and the steps the attempt before it had reported past that
// (the last report in its log, which this attempt's log replaces), appended to the folder's
// resumes.jsonl: the trial's resumes over every run, which its record carries.
local_backend::attempt_checkpoints local_backend::prepare_checkpoints(const trial& t, trial_record& rec) const {
  attempt_checkpoints saved;
  const checkpoint_spec& c = setup_.spec->checkpoints;
  if (!c) return saved;
  saved.folder.emplace(setup_.out / "checkpoints" / t.id, c.keep);
  const log_tail reached = last_steps(setup_.logs, rec.id + ".out");
  // A checkpoint the command announced that a supervisor killed before reading the line never
  // committed. Staged as `tmp-STEP`, it is whole (a command writes it before it says so, and
  // writes the next elsewhere): committed now, not thrown away with the rest of the staging.
  if (const auto before = saved.folder->latest(); reached.announced > (before ? before->step : -1)) {
    const fs::path staged = saved.folder->command_staged(reached.announced);
    std::error_code ec;
    if (staged.filename() != checkpoint_folder::command_staging && fs::is_directory(staged, ec)) try {
        saved.folder->commit(staged, reached.announced);
      } catch (const std::exception&) {  // (not committable: the attempt resumes from the one before)
      }
  }
  saved.folder->clear_staging();
  const auto latest = saved.folder->latest();
  saved.variables = {std::string(checkpoint_env::dir) + "=" + saved.folder->dir().string(),
                     std::string(checkpoint_env::keep) + "=" + std::to_string(c.keep),
                     std::string(checkpoint_env::signal) + "=" + std::to_string(c.signal)};
  if (!latest) return saved;
  saved.from = latest->step;
  saved.variables.push_back(std::string(checkpoint_env::resume_from) + "=" + latest->path.string());
  saved.variables.push_back(std::string(checkpoint_env::resume_step) + "=" + std::to_string(latest->step));
  const json resume = {{"run", rec.run},
                       {"attempt", rec.attempts},
                       {"from", latest->step},
                       {"redone", std::max<std::int64_t>(0, reached.reported - latest->step)}};
  append_resume(saved.folder->dir(), resume);
  return saved;
}

// One attempt of trial `t` on slot `sl`.
trial_record local_backend::attempt(const slot& sl, const trial& t, std::shared_ptr<const void> admitted) {
  trial_record rec;
  rec.id = t.id;
  rec.params = t.params;
  rec.origin = t.origin;
  rec.slot = sl.index;
  rec.device = sl.gpus.empty() ? "cpu" : runner::visible_devices_for(sl.gpus);
  rec.mem_limit = cap_of(t, *setup_.spec);
  rec.run = setup_.run;
  rec.attempts = t.attempt;
  const auto t0 = std::chrono::steady_clock::now();
  rec.start_s = std::chrono::duration<double>(t0 - setup_.run_start).count();
  attempt_checkpoints saved;
  std::string log_problem;
  try {
    saved = prepare_checkpoints(t, rec);  // (before the logs are emptied: it reads where the last attempt got)
  } catch (const std::exception& e) {
    log_problem = e.what();
  }
  const unique_fd err = log_problem.empty() ? log_file(setup_.logs, setup_.out, rec.id + ".err", log_problem)
                                            : unique_fd();
  if (!log_problem.empty()) {
    rec.kind = outcome_kind::internal_error;
    rec.error = log_problem;
  } else if (setup_.program->in_worker()) {
    run_worker(sl, t, rec, err.get(), std::move(admitted), saved);
  } else {
    run_command(sl, t, rec, err.get(), saved);
  }
  if (saved.folder) {
    try {
      if (const auto last = saved.folder->latest()) rec.checkpoint = last->step;
    } catch (const std::exception&) {
    }
    rec.resumes = read_resumes(saved.folder->dir());
    // Stopped from outside (await): preempted only once it saved since it started. (One that
    // stops itself with SIGTERM would otherwise be resumed where it was, again and again.)
    rec.preempted = rec.preempted && rec.checkpoint > saved.from;
  }
  rec.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (std::error_code ec; !rec.timeline.empty() && !fs::exists(setup_.out / rec.timeline, ec))
    rec.timeline.clear();  // it died first
  return rec;
}

// A task's attempt in a fresh worker (a standby one where the slot's group keeps them).
// A trial's worker: a standby one of its GPU's pool where there is one for this cap (the pool
// grows to its planned size at the first trial), else launched for it.
std::shared_ptr<runner::job> local_backend::start_job(const slot& sl, runner::job_spec spec) {
  const auto g = groups_.find(group_of(sl.gpus));
  // Standby workers are prepared for the spec's cap: an attempt at a larger one starts afresh.
  if (g == groups_.end() || !g->second.pool || spec.mem_limit != setup_.spec->mem_limit)
    return runner::job::start(std::move(spec));
  auto job = runner::job::start(std::move(spec), *g->second.pool);
  std::size_t wanted = 0;
  {
    std::lock_guard lock(mutex_);
    if (packer_) {
      // Lanes move between GPUs: a GPU's pool grows to its planned size at its first trial,
      // so the room trial_memory() keeps for warm contexts is never exceeded.
      if (!std::exchange(g->second.started, true)) wanted = g->second.wanted = g->second.planned;
    } else if (!std::exchange(slot_started_[static_cast<std::size_t>(sl.index)], 1)) {
      wanted = g->second.wanted += static_cast<std::size_t>(setup_.spec->standby);
    }
  }
  if (wanted) g->second.pool->reserve(wanted);
  return job;
}

void local_backend::run_worker(const slot& sl, const trial& t, trial_record& rec, int err,
                               std::shared_ptr<const void> admitted, const attempt_checkpoints& saved) {
  const fs::path log = setup_.out / "logs" / rec.id;
  std::string log_problem;
  if (!log_file(setup_.logs, setup_.out, rec.id + ".out",
                log_problem)) {  // (checked here, opened for the worker when it is assigned)
    rec.kind = outcome_kind::internal_error;
    rec.error = log_problem;
    return;
  }
  runner::job_spec spec;
  std::unique_ptr<runner::driver_cap> cap;
  bool fresh_worker = false;
  try {
    spec = trial_spec(sl, t.params, cap_of(t, *setup_.spec));
    cap = setup_.program->bring_cap(spec);
    if (saved.folder) {
      // Only a worker launched for the attempt gets them, unless its request carries them.
      fresh_worker = !setup_.program->carry_variables(spec, saved.variables);
      spec.stop_signal = setup_.spec->checkpoints.signal;  // a timeout warns first
    }
  } catch (const usage_error& e) {  // parameters a source made that the program refuses
    rec.kind = outcome_kind::task_error;
    rec.error = std::string("task_error: ") + e.what();
    return;
  } catch (const std::exception& e) {
    rec.kind = outcome_kind::internal_error;
    rec.error = e.what();
    return;
  }
  const std::size_t gpu_count = spec.gpus.size();
  spec.stdout_to = runner::stdout_mode::file;
  spec.stdout_path = log.string() + ".out";
  if (setup_.timelines) {
    const std::string name = detail::timeline_file(t.id, t.attempt);
    spec.memory_timeline = (setup_.out / "logs" / name).string();
    rec.timeline = "logs/" + name;
  }
  spec.stderr_echo_fd = err;
  spec.stderr_echo_limit = detail::max_log;
  spec.admitted = std::move(admitted);  // until the worker is reaped
  std::shared_ptr<runner::job> job;
  try {
    job = fresh_worker ? runner::job::start(std::move(spec)) : start_job(sl, std::move(spec));
  } catch (const std::exception& e) {
    rec.kind = outcome_kind::internal_error;
    rec.error = e.what();
    return;
  }
  // Its reports (this_worker().report(), isorun.report()) are lines of its stdout log, read as
  // the worker writes them; so are its checkpoints' {"checkpoint": STEP}, said once committed.
  log_follower::following follow;
  try {
    if (unique_fd log_in = detail::open_file(setup_.logs, rec.id + ".out", O_RDONLY, log.string() + ".out"))
      follow = follower_.follow(
          std::move(log_in), [&](std::int64_t step, const json& metrics) { sink_->on_report(t, step, metrics); },
          [&](std::int64_t step) { sink_->on_checkpoint(t, step); });
  } catch (const std::exception&) {
  }  // (no reports then; the log itself was checked above)
  const runner::job_result& r = await(sl, t, {.job = job}, *job, rec);
  follow.end();
  if (cap && cap->refused() && rec.kind == outcome_kind::task_error) {
    // The framework's own out-of-memory error, after the cap refused it an allocation.
    rec.kind = outcome_kind::out_of_memory;
    rec.error = cap->report("the trial", "mem_limit", gpu_count) + "; the function raised: " + rec.error;
  }
  if (!r.status.ok()) return;
  bool too_deep = false;
  json parsed = parse_bounded_json(std::string_view(reinterpret_cast<const char*>(r.payload.data()), r.payload.size()),
                                   &too_deep);
  if (parsed.is_object() && parsed.contains("result")) {
    rec.result = parsed["result"];
  } else {
    rec.kind = outcome_kind::invalid_result;
    rec.error = too_deep ? "worker result is nested deeper than " + std::to_string(max_json_depth) + " levels"
                         : "worker result is not valid JSON";
  }
}

// A command's attempt: its stdout to the log, its result from $ISORUN_RESULT or its last JSON line.
// A command trial's stdout is its log, written by the command itself (appended: its children
// share it), so that a line it printed outlives this process (a checkpoint announced just before a
// kill -9 is committed by the next attempt), and read as it comes into `log_in`: each report line
// reaches the scheduler while the trial runs. Null where it could not start (`rec` says why).
std::unique_ptr<runner::command> local_backend::start_command(const slot& sl, const trial& t, trial_record& rec,
                                                              int err, const attempt_checkpoints& saved,
                                                              unique_fd& log_in) {
  const sweep_spec& s = *setup_.spec;
  const fs::path log = setup_.out / "logs" / rec.id;
  const fs::path result_file = fs::absolute(log.string() + ".result.json");
  std::error_code ec;
  fs::remove(result_file, ec);
  std::string log_problem;
  const unique_fd stdout_file = log_file(setup_.logs, setup_.out, rec.id + ".out", log_problem, O_APPEND);
  if (stdout_file) {
    try {
      log_in = detail::open_file(setup_.logs, rec.id + ".out", O_RDONLY, log.string() + ".out");
    } catch (const std::exception& e) {
      log_problem = e.what();
    }
  }
  // Under a cap on GPUs the cap sees every allocation of the command's processes: it keeps them
  // for the trial's memory timeline, as it does for `isorun --memory-timeline ... -- CMD`.
  const std::uint64_t cap = cap_of(t, *setup_.spec);
  const bool timeline = cap && !sl.gpus.empty();
  try {
    if (!log_in) throw internal_error(log_problem);
    std::vector<std::string> env = {"ISORUN_RESULT=" + result_file.string(), "ISORUN_TRIAL=" + rec.id};
    env.insert(env.end(), saved.variables.begin(), saved.variables.end());
    return runner::command::start({.argv = command_for(s.command, rec.params),
                                   .gpus = sl.gpus,
                                   .mem_limit = cap,
                                   .host_mem_limit = s.host_mem_limit,
                                   .timeout = s.timeout,
                                   .grace = setup_.options->grace,
                                   .timeout_signal = planned_stop_signal(),
                                   .extra_env = std::move(env),
                                   .stdin_fd = -1,
                                   .stdout_fd = stdout_file.get(),
                                   .stderr_fd = err,
                                   .stderr_tail_lines = 20,
                                   .stderr_limit = detail::max_log,
                                   .memory_events = timeline ? command_memory_events : 0});
  } catch (const std::exception& e) {
    rec.kind = outcome_kind::internal_error;
    rec.error = e.what();
    return nullptr;
  }
}

namespace {

// What a command's `{"checkpoint": STEP}` line does: commits what it staged in
// $ISORUN_CHECKPOINT_DIR/tmp (or tmp-STEP), then tells `committed`. One that cannot be committed
// is said in the trial's stderr log `err`, the folder left as it was.
std::function<void(std::int64_t)> commit_staged(checkpoint_folder& folder, int err,
                                                std::function<void(std::int64_t)> committed) {
  return [&folder, err, committed = std::move(committed)](std::int64_t step) {
    try {
      if (const auto latest = folder.latest(); latest && latest->step == step) {
        committed(step);  // committed by the command itself (isorun.checkpoint() in a Python script)
        return;
      }
      const fs::path staged = folder.command_staged(step);
      folder.commit(staged, step);
      if (staged.filename() == checkpoint_folder::command_staging)  // a new, empty tmp for the next
        if (::mkdir(staged.c_str(), 0755) != 0 && errno != EEXIST)
          throw internal_error("cannot create " + staged.string() + ": " + std::strerror(errno));
      committed(step);
    } catch (const std::exception& e) {
      detail::write_all(
          err, std::string("isorun: checkpoint ") + std::to_string(step) + " not committed: " + e.what() + "\n");
    }
  };
}

}  // namespace

// The memory timeline the cap kept for a command trial, written where a task's worker writes its
// own (run_worker), by name in OUT/logs; one that cannot be written is left out, as a task's is
// when its worker dies first.
void local_backend::keep_timeline(const trial& t, trial_record& rec, const std::string& timeline) {
  const std::string name = detail::timeline_file(t.id, t.attempt);
  std::string problem;
  if (const unique_fd file = log_file(setup_.logs, setup_.out, name, problem)) {
    if (detail::write_all(file.get(), timeline) == 0) rec.timeline = "logs/" + name;
    else ::unlinkat(setup_.logs, name.c_str(), 0);  // not half a timeline
  }
}

void local_backend::run_command(const slot& sl, const trial& t, trial_record& rec, int err,
                                attempt_checkpoints& saved) {
  unique_fd log_in;
  const std::unique_ptr<runner::command> cmd = start_command(sl, t, rec, err, saved, log_in);
  if (!cmd) return;
  // Its lines are read by the backend's follower as they are written; checkpoint lines are
  // committed, in order, on a thread of the trial's.
  std::optional<checkpoint_committer> committer;
  if (saved.folder)
    committer.emplace(commit_staged(*saved.folder, err, [&](std::int64_t step) { sink_->on_checkpoint(t, step); }));
  log_follower::following follow;
  try {
    follow = follower_.follow(
        std::move(log_in), [&](std::int64_t step, const json& metrics) { sink_->on_report(t, step, metrics); },
        committer ? log_follower::on_checkpoint_fn([&](std::int64_t step) { committer->announce(step); })
                  : log_follower::on_checkpoint_fn());
  } catch (const std::exception&) {
  }  // (no reports then, nor commits but the next attempt's; the log itself was checked above)
  const runner::command_result& r = await(sl, t, {.command = cmd.get()}, *cmd, rec);
  follow.end();                        // every line it printed is handed on before its result is read,
  if (committer) committer->finish();  // and every checkpoint it announced committed
  if (!r.memory_timeline.empty()) keep_timeline(t, rec, r.memory_timeline);
  if (!r.status.ok()) return;
  try {
    rec.result = read_command_result(setup_.logs, rec.id, setup_.out / "logs");
  } catch (const std::exception& e) {
    rec.kind = outcome_kind::invalid_result;
    rec.error = std::string("invalid_result: ") + e.what();
  }
}

}  // namespace isorun::sweep
