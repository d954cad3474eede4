#include "backends/slurm_backend.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "engine/folder.hpp"
#include "isorun/runner/bounded_json.hpp"
#include "isorun/runner/errors.hpp"
#include "isorun/runner/printable.hpp"
#include "isorun/worker/checkpoint.hpp"

namespace isorun::sweep {

namespace {
namespace fs = std::filesystem;
using nlohmann::json;

// The JSON in the file `name` of `folder`, bounded in size and depth; discarded if it is not
// there or not JSON. @throws usage_error if a link, a FIFO or a file larger than a record is there.
json read_json_file(int folder, const std::string& name, const fs::path& shown) {
  if (folder < 0) return json(json::value_t::discarded);
  const unique_fd fd = detail::open_file(folder, name, O_RDONLY, shown);
  if (!fd) return json(json::value_t::discarded);
  return parse_bounded_json(detail::read_all(fd.get(), journal::max_line, shown));
}
}  // namespace

slurm_backend::slurm_backend(slurm_setup setup)
    : setup_{std::move(setup)}, dir_{setup_.out / "slurm"}, folder_{setup_.out, "slurm"} {
  for (std::size_t i : setup_.queue) index_of_[trial_id(setup_.subject, setup_.spec->trials[i])] = i;
}

slurm_backend::~slurm_backend() { finish(); }

std::int64_t slurm_backend::latest_checkpoint(const std::string& id) const {
  if (!setup_.spec->checkpoints) return -1;
  try {
    const auto latest = checkpoint_folder(setup_.out / "checkpoints" / id, setup_.spec->checkpoints.keep).latest();
    return latest ? latest->step : -1;
  } catch (const std::exception&) {
    return -1;
  }
}

std::size_t slurm_backend::lanes() const {
  if (!setup_.spec->search) return std::numeric_limits<std::size_t>::max();
  // (Each searched trial goes to Slurm as the searcher answers: an array task of its own.)
  return static_cast<std::size_t>(std::max(1, setup_.spec->slurm->max_running));
}

void slurm_backend::learn(const slurm::made_trial& made) {
  index_of_[made.id] = made.index;
  made_[made.index] = {.index = made.index, .id = made.id, .attempt = 1, .params = made.params, .origin = made.origin};
}

bool slurm_backend::knows(std::size_t index) const {
  return made_.count(index) > 0 || index < setup_.spec->trials.size();
}

trial slurm_backend::make_trial(std::size_t index) {
  if (const auto it = made_.find(index); it != made_.end()) {
    trial t = it->second;
    t.attempt = 1;
    return t;
  }
  if (!knows(index))
    throw internal_error("the Slurm backend was told of trial " + std::to_string(index) + ", which it does not know");
  const nlohmann::json& params = setup_.spec->trials[index];
  return {.index = index, .id = trial_id(setup_.subject, params), .attempt = 1, .params = params};
}

void slurm_backend::save_jobs() {
  json jobs = json::array();
  for (const auto& [job, sub] : inflight_) jobs.push_back({{"job", job}, {"batch", sub.batch}});
  write_file_durably(dir_ / "jobs.json", jobs.dump() + "\n");
}

std::vector<trial> slurm_backend::begin(trial_sink& sink) {
  sink_ = &sink;
  std::vector<trial> adopted;
  {
    std::lock_guard lock(mutex_);
    const unique_fd slurm = detail::open_subfolders(dir_.parent_path(), {"slurm"}, false);
    // The trials a source made, from every submission, but those journaled already: the
    // records of those whose arrays ended while no one followed are theirs too.
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir_, ec)) {
      const std::string batch_file = entry.path().filename().string();
      if (batch_file.rfind("batch-", 0) != 0 || entry.path().extension() != ".json") continue;
      const json submitted = read_json_file(slurm.get(), batch_file, dir_ / batch_file);
      for (const slurm::made_trial& m : slurm::made_trials(submitted))
        if (!setup_.journaled.count(m.id)) learn(m);
    }
    const json jobs = read_json_file(slurm.get(), "jobs.json", dir_ / "jobs.json");
    if (jobs.is_array())
      for (const auto& j : jobs) {
        if (!j.is_object()) continue;
        const std::string job = j.value("job", "");
        const int batch = j.value("batch", 0);
        const std::string batch_file = "batch-" + std::to_string(batch) + ".json";
        const json tasks = read_json_file(slurm.get(), batch_file, dir_ / batch_file);
        if (job.empty() || !tasks.is_object()) continue;
        // (Followed again unless Slurm says it ended: the next poll tells.)
        if (slurm::ended_states(job)) continue;
        inflight_[job] = {job, batch, tasks["tasks"].get<std::vector<std::vector<std::size_t>>>()};
        for (const auto& t : inflight_[job].tasks)
          for (std::size_t i : t)
            if (attempt_.emplace(i, 1).second && knows(i)) adopted.push_back(make_trial(i));
      }
    if (fs::is_directory(dir_, ec)) save_jobs();  // without the arrays no longer in Slurm's queue
  }
  // Trials whose records arrays left while no one was following (detached, killed) are
  // followed too: the first look delivers their reports, then their records.
  for (const auto& found : folder_.records()) {
    std::lock_guard lock(mutex_);
    const auto it = index_of_.find(found.record.id);
    if (it != index_of_.end() && attempt_.emplace(it->second, 1).second && knows(it->second))
      adopted.push_back(make_trial(it->second));
  }
  poller_ = std::thread([this] { poll(); });
  return adopted;
}

void slurm_backend::start(std::vector<trial> batch) {
  if (batch.empty()) return;
  std::vector<std::size_t> trials;
  std::vector<slurm::made_trial> made;  // those not in the spec's list: the array tasks learn them from the batch file
  for (const auto& t : batch) {
    trials.push_back(t.index);
    if (t.index >= setup_.spec->trials.size() || t.id != trial_id(setup_.subject, setup_.spec->trials[t.index]))
      made.push_back({t.index, t.id, t.params, t.origin});
  }
  {
    // Before the array exists: its tasks may write records while sbatch is still answering, and
    // the poller must take each once. A retry's earlier record was delivered; its file goes.
    std::lock_guard lock(mutex_);
    for (const auto& m : made) learn(m);
    for (const auto& t : batch) {
      attempt_[t.index] = t.attempt;
      checkpoint_at_start_[t.index] = latest_checkpoint(t.id);
      done_trials_.erase(t.index);
      folder_.start_afresh(t.id);  // no record, verdict or reports of an earlier attempt
      report_offset_.erase(t.index);
    }
  }
  auto sub = slurm::submit(*setup_.spec->slurm, setup_.out, trials, setup_.options->node_command,
                           setup_.options->submit_dir, setup_.job_name, made);
  std::fprintf(stderr, "isorun: submitted %zu trial%s as Slurm job array %s (%zu array task%s)\n", trials.size(),
               trials.size() == 1 ? "" : "s", sub.job.c_str(), sub.tasks.size(), sub.tasks.size() == 1 ? "" : "s");
  std::vector<finished_trial> too_late;
  {
    std::lock_guard lock(mutex_);
    if (cancelled_) {  // cancel_all() came while sbatch ran: this array goes too
      slurm::cancel(sub.job);
      for (auto& t : batch) {
        if (!done_trials_.insert(t.index).second) continue;  // its record came while sbatch ran
        trial_record rec;
        rec.id = t.id;
        rec.params = t.params;
        rec.kind = outcome_kind::cancelled;
        too_late.push_back({std::move(t), std::move(rec)});
      }
    } else {
      inflight_[sub.job] = std::move(sub);
    }
    save_jobs();
  }
  forget_delivered();  // every record may have come while sbatch ran
  if (!too_late.empty()) sink_->on_finished(std::move(too_late));
}

void slurm_backend::stop(const trial& t) {
  folder_.stop(t.id);  // only that trial: its array task's other trials go on
}

// Reports the nodes appended since the last look, to the scheduler: a look at each running
// trial's file. (A trial's last ones, once its record is taken: deliver_rest.)
void slurm_backend::deliver_reports() {
  std::vector<trial> running;
  {
    std::lock_guard lock(mutex_);
    for (const auto& [i, attempt] : attempt_)
      if (!done_trials_.count(i) && knows(i)) {
        running.push_back(make_trial(i));
        running.back().attempt = attempt;
      }
  }
  for (const trial& t : running) read_reports(t, 1);
}

// A node appends a trial's last reports before it writes its record, so once the record is
// taken the file holds them all: they are delivered to the end (look after look) before the
// record is, however close to its end they came, or however much was left behind, up to 16 looks
// (64 MiB: a file that holds more than any trial reports, a sparse one say, holds up no record).
void slurm_backend::deliver_rest(const std::vector<finished_trial>& ended) {
  for (const auto& f : ended) read_reports(f.t, 16);
}

// Up to `looks` looks at trial `t`'s report file from where the last one stopped: its reports to
// the scheduler, in the file's order, then the checkpoints committed (for the trackers); a line
// still being written waits for the next look.
void slurm_backend::read_reports(const trial& t, int looks) {
  std::uint64_t at = 0;
  {
    std::lock_guard lock(mutex_);
    at = report_offset_[t.index];
  }
  for (std::uint64_t before = at + 1; at != before && looks-- > 0;) {
    before = at;
    remote_folder::reports_read read;
    try {
      read = folder_.reports_since(t.id, at);
    } catch (const usage_error& e) {  // a link or a FIFO planted there: not the node's reports
      if (warned_.insert(t.id).second)
        std::fprintf(stderr, "isorun: warning: %s; its reports are ignored\n", printable(e.what()).c_str());
      break;
    }
    if (!read.skipped.empty() && warned_.insert(t.id).second)
      std::fprintf(stderr, "isorun: warning: %s\n", printable(read.skipped).c_str());
    for (auto& [step, metrics] : read.reports) sink_->on_report(t, step, metrics);
    for (std::int64_t step : read.checkpoints) sink_->on_checkpoint(t, step);
  }
  std::lock_guard lock(mutex_);
  report_offset_[t.index] = at;
}

void slurm_backend::cancel_all() {
  std::lock_guard lock(mutex_);
  cancelled_ = true;
  for (const auto& [job, sub] : inflight_) slurm::cancel(job);
  wake_.notify_all();
}

void slurm_backend::finish() {
  {
    std::lock_guard lock(mutex_);
    done_ = true;
    wake_.notify_all();
  }
  if (poller_.joinable()) poller_.join();
}

std::vector<std::string> slurm_backend::jobs() {
  std::lock_guard lock(mutex_);
  std::vector<std::string> out;
  for (const auto& [job, sub] : inflight_) out.push_back(job);
  return out;
}

void slurm_backend::journaled(const journal& j) {
  for (const auto& found : folder_.records())
    if (j.latest().count(found.record.id)) folder_.remove_record(found.file);
}

// Follows the arrays until finish(): their records, and the trials of those that ended.
void slurm_backend::poll() {
  for (;;) {
    bool cancelled;
    {
      std::unique_lock lock(mutex_);
      // Slurm is asked again after a while (it has no way to wake a follower).
      wake_.wait_for(lock, std::chrono::milliseconds(250), [&] { return done_ || cancelled_; });
      if (done_) return;
      cancelled = cancelled_;
    }
    std::vector<finished_trial> ended;
    try {
      if (!cancelled) deliver_reports();
      ended = merge();
    } catch (...) {  // a link planted for OUT/slurm/results or a stop file, say: the sweep stops, saying so
      sink_->on_error(std::current_exception());
      cancelled = true;
    }
    if (cancelled) {
      // The arrays are being cancelled: what ends now is not lost, and is not classified; the
      // trials are not journaled, so running again runs them.
      auto rest = cancelled_rest();
      ended.insert(ended.end(), std::make_move_iterator(rest.begin()), std::make_move_iterator(rest.end()));
    } else {
      auto gone = check_ended();
      ended.insert(ended.end(), std::make_move_iterator(gone.begin()), std::make_move_iterator(gone.end()));
      forget_delivered();
      deliver_rest(ended);
    }
    if (!ended.empty()) sink_->on_finished(std::move(ended));
    if (cancelled) {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return done_; });
      return;
    }
  }
}

// Arrays whose every trial has been delivered are no longer followed, though Slurm may still be
// ending their tasks: the sweep's last records can arrive before Slurm says their array ended,
// and a finished sweep leaves no array in jobs.json for a later run to follow.
void slurm_backend::forget_delivered() {
  std::lock_guard lock(mutex_);
  const auto erased = std::erase_if(inflight_, [&](const auto& entry) {
    for (const auto& task : entry.second.tasks)
      for (std::size_t i : task)
        if (!done_trials_.count(i)) return false;
    return true;
  });
  if (erased > 0) save_jobs();
}

// The records array tasks left in OUT/slurm/results/, for trials not yet delivered.
std::vector<finished_trial> slurm_backend::merge() {
  std::vector<finished_trial> out;
  bool stopping;
  {
    std::lock_guard lock(mutex_);
    stopping = cancelled_;
  }
  for (auto& [file, rec] : folder_.records()) {
    // A file is removed once its record is durable in the journal: by the next run, which
    // finds its trial journaled (and so not among this run's trials), or at the run's end.
    // After a stop, a failure may be the stop itself (scancel signals every process of an
    // array task, the trial's worker too): not journaled, so that running again runs it.
    const bool stopped_by_us = stopping && rec.kind != outcome_kind::success;
    std::unique_lock lock(mutex_);
    const auto it = index_of_.find(rec.id);
    if (it == index_of_.end() || stopped_by_us) {
      lock.unlock();
      folder_.remove_record(file);
      continue;
    }
    if (!done_trials_.insert(it->second).second) continue;
    trial t = make_trial(it->second);
    t.attempt = attempt_.count(it->second) ? attempt_[it->second] : 1;
    lock.unlock();
    out.push_back({std::move(t), std::move(rec)});
  }
  return out;
}

// Arrays Slurm no longer runs: each of their trials without a record ends as Slurm says its
// array task ended. A node's usage error stops the sweep instead.
std::vector<finished_trial> slurm_backend::check_ended() {
  std::vector<slurm::submission> subs;
  {
    std::lock_guard lock(mutex_);
    for (const auto& [job, sub] : inflight_) subs.push_back(sub);
  }
  std::vector<finished_trial> out;
  for (const auto& sub : subs) {
    const auto states = slurm::ended_states(sub.job);  // (a Slurm that does not answer says nothing)
    if (!states) continue;
    auto left = merge();  // what the last tasks left just before they ended
    out.insert(out.end(), std::make_move_iterator(left.begin()), std::make_move_iterator(left.end()));
    try {
      auto gone = lost(sub, *states);
      out.insert(out.end(), std::make_move_iterator(gone.begin()), std::make_move_iterator(gone.end()));
    } catch (const usage_error&) {
      // Nothing is retried: every array is cancelled and forgotten, its trials end cancelled.
      const std::exception_ptr error = std::current_exception();
      {
        std::lock_guard lock(mutex_);
        for (const auto& [job, other] : inflight_) slurm::cancel(job);
      }
      auto rest = cancelled_rest();
      out.insert(out.end(), std::make_move_iterator(rest.begin()), std::make_move_iterator(rest.end()));
      {
        std::lock_guard lock(mutex_);
        inflight_.clear();
        save_jobs();
      }
      sink_->on_error(error);  // first: the sweep stops before anything could be retried
      if (!out.empty()) sink_->on_finished(std::move(out));
      return {};
    }
    std::lock_guard lock(mutex_);
    inflight_.erase(sub.job);
    save_jobs();
  }
  return out;
}

// The trials of ended array `sub` that left no record, each ended as Slurm says its task did
// (`states`, by task index).
// @throws usage_error if an array task's isorun refused its trials (a GPU the node lacks, say):
//         every array task would say the same, so nothing is retried, and the node's reason is
//         the sweep's.
std::vector<finished_trial> slurm_backend::lost(const slurm::submission& sub,
                                                const std::map<int, slurm::task_end>& states) {
  std::vector<finished_trial> out;
  std::vector<slurm::task_end> ends;
  for (std::size_t k = 0; k < sub.tasks.size(); ++k) {
    const std::string task = sub.job + "_" + std::to_string(k);
    const fs::path log = dir_ / "logs" / (task + ".out");
    const auto st = states.find(static_cast<int>(k));
    ends.push_back(st == states.end() ? slurm::task_end{"UNKNOWN"} : st->second);
    if (const auto why = slurm::node_usage_error(ends.back(), folder_.error_record(sub.job, k)))
      throw usage_error("on Slurm, array task " + task + " refused its trials: " + *why + " (its log: " + log.string() +
                        ")");
  }
  for (std::size_t k = 0; k < sub.tasks.size(); ++k) {
    const std::string task = sub.job + "_" + std::to_string(k);
    const fs::path log = dir_ / "logs" / (task + ".out");
    const slurm::task_end& end = ends[k];
    for (std::size_t i : sub.tasks[k]) {
      finished_trial f;
      {
        std::lock_guard lock(mutex_);
        if (!done_trials_.insert(i).second) continue;
        f.t = make_trial(i);
        f.t.attempt = attempt_.count(i) ? attempt_[i] : 1;
      }
      trial_record& rec = f.record;
      rec.id = f.t.id;
      rec.params = f.t.params;
      rec.origin = f.t.origin;
      rec.kind = slurm::outcome_of(end.state);
      rec.attempts = f.t.attempt;
      rec.device = "slurm:" + task;
      rec.mem_limit = setup_.spec->mem_limit;
      rec.error = "Slurm array task " + task + " ended " + end.state +
                  " without the trial's record (its log: " + log.string() + ")";
      // Stopped on purpose (its time limit, a preemption; or its isorun, warned, could not
      // requeue it), after its trial saved a checkpoint further on: preempted, resumed at once.
      const bool planned = end.state == "TIMEOUT" || end.state == "PREEMPTED" || end.exit_code == slurm::preempted_exit;
      std::int64_t before = -1;
      {
        std::lock_guard lock(mutex_);
        if (const auto it = checkpoint_at_start_.find(i); it != checkpoint_at_start_.end()) before = it->second;
      }
      if (const std::int64_t now = latest_checkpoint(rec.id); planned && now > before) {
        rec.kind = outcome_kind::cancelled;
        rec.preempted = true;
        rec.checkpoint = now;
        rec.error.clear();
      }
      out.push_back(std::move(f));
    }
  }
  return out;
}

// After cancel_all: every trial in flight that has not ended ends cancelled.
std::vector<finished_trial> slurm_backend::cancelled_rest() {
  std::vector<finished_trial> out;
  std::lock_guard lock(mutex_);
  for (const auto& [job, sub] : inflight_)
    for (const auto& task : sub.tasks)
      for (std::size_t i : task) {
        if (!done_trials_.insert(i).second) continue;
        finished_trial f{make_trial(i), {}};
        f.t.attempt = attempt_.count(i) ? attempt_[i] : 1;
        f.record.id = f.t.id;
        f.record.params = f.t.params;
        f.record.origin = f.t.origin;
        f.record.kind = outcome_kind::cancelled;
        out.push_back(std::move(f));
      }
  return out;
}

}  // namespace isorun::sweep
