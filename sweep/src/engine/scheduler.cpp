// The scheduler: one loop on the caller's thread starts trials; the backend's threads report
// their ends, which are settled under the scheduler's lock and wake the loop. The backend is
// only ever called without that lock held, so it may call back at any time.
#include "isorun/sweep/scheduler.hpp"

#include <algorithm>
#include <utility>

#include "isorun/sweep/report.hpp"

namespace isorun::sweep {

scheduler::scheduler(const sweep_spec& s, trial_source& source, trial_backend& backend, journal_writer& writer,
                     const stop_source& stop, scheduler_options options)
    : s_{s}, source_{source}, backend_{backend}, writer_{writer}, stop_{stop}, options_{std::move(options)} {
  metric_checked_ = options_.metric_checked;
}

// Under mutex_: a retry first (on the lane that came free), else the source's next trial.
std::optional<trial> scheduler::take() {
  if (!retries_.empty()) {
    trial t = std::move(retries_.front());
    retries_.pop_front();
    return t;
  }
  std::optional<new_trial> n;
  try {
    n = source_.next();
  } catch (...) {  // the source cannot go on: the sweep stops as for a backend's failure
    if (!error_) error_ = std::current_exception();
    source_failed_ = true;
    return std::nullopt;
  }
  if (!n) return std::nullopt;
  const auto resumed = options_.resumed.find(n->id);
  trial t = resumed == options_.resumed.end() ? trial{} : resumed->second;
  t.index = n->index;
  t.id = std::move(n->id);
  t.params = std::move(n->params);
  t.origin = std::move(n->origin);
  return t;
}

bool scheduler::stopping() const { return halted_ || stop_.requests() > 0; }

void scheduler::run(bool detach) {
  std::vector<trial> adopted;
  try {
    adopted = backend_.begin(*this);
  } catch (...) {  // nothing started: the sweep ends with the reason
    {
      std::lock_guard lk(mutex_);
      if (!error_) error_ = std::current_exception();
      halted_ = true;
    }
    backend_.finish();
    return;
  }
  source_.on_ready([this] {
    std::lock_guard wake(mutex_);  // (under the lock: the loop is between its check and its wait, or waiting)
    changed_.notify_all();
  });
  struct forget_wake {  // however run() ends: the source may outlive this scheduler
    trial_source& source;
    ~forget_wake() { source.on_ready({}); }
  } forget{source_};
  std::unique_lock lk(mutex_);
  for (const trial& t : adopted)  // already running: not started again when the source gives it
    if (!ended_.count(t.index)) running_.insert(t.index);
  const std::size_t lanes = backend_.lanes();
  for (;;) {
    std::vector<trial> batch;
    while (!stopping() && running_.size() < lanes) {
      std::optional<trial> t = take();
      if (!t) break;
      if (ended_.count(t->index) || running_.count(t->index)) continue;  // ended or followed meanwhile
      running_.insert(t->index);
      batch.push_back(std::move(*t));
    }
    if (std::exchange(source_failed_, false)) {
      halt_and_cancel(lk);  // (what the batch holds is not started)
      for (const trial& t : batch) running_.erase(t.index);
      batch.clear();
    }
    if (!batch.empty()) {
      if (options_.running_changed) options_.running_changed(running_.size());
      lk.unlock();
      try {
        if (options_.starting)
          for (const trial& t : batch) options_.starting(t);
        backend_.start(batch);
        lk.lock();
      } catch (...) {
        lk.lock();
        for (const trial& t : batch) running_.erase(t.index);
        if (!error_) error_ = std::current_exception();
        halt_and_cancel(lk);
      }
      continue;
    }
    // A source that gives nothing while nothing runs has nothing to wait for: the sweep is over.
    if (detach && ((retries_.empty() && source_.exhausted()) || stopping())) break;
    // (A source still at work, a searcher thinking, is waited for unless the sweep stops.)
    if (running_.empty() && (stopping() || !source_.busy())) break;
    changed_.wait(lk);
  }
  lk.unlock();
  backend_.finish();
}

void scheduler::on_finished(std::vector<finished_trial> batch) {
  std::unique_lock lk(mutex_);
  std::vector<trial_record> final;
  bool halt = false;
  for (auto& f : batch) halt = settle(f, final) || halt;
  try {
    for (const auto& rec : final)
      if (final_record(rec)) source_.tell(rec);  // (an attempt retried at a larger cap is not an end)
  } catch (...) {
    if (!error_) error_ = std::current_exception();
    halt = true;
  }
  for (auto& rec : final) writer_.push(std::move(rec));
  if (options_.running_changed) options_.running_changed(running_.size());
  if (halt) halt_and_cancel(lk);
  changed_.notify_all();
}

// What the attempt's end means to the sweep: its record's kind as this sweep saw it end (a trial
// it stopped alone, one early stopping pruned, one preempted with a checkpoint), and the step it
// reached. Under mutex_.
void scheduler::reclassify(finished_trial& f) {
  trial_record& rec = f.record;
  running_.erase(f.t.index);
  rec.attempts = std::max(rec.attempts, f.t.attempt);
  if (options_.stop_fails_as_cancelled && stop_.requests() > 0 && rec.kind != outcome_kind::success)
    rec.kind = outcome_kind::cancelled;
  const bool stopped_alone = stopped_.erase(f.t.index) > 0;
  if (stopped_alone && rec.kind != outcome_kind::success) rec.kind = outcome_kind::cancelled;
  const bool pruned = pruned_.erase(f.t.index) > 0;
  if (stopped_alone || pruned) rec.preempted = false;  // isorun's own stop of this trial alone
  // A trial that keeps checkpoints and did not succeed while the sweep stops ended with the stop
  // (it was warned, saved, and was stopped): preempted, journaled, and resumed from its
  // checkpoint by the next run. So did one the backend saw stopped from outside (a Slurm
  // requeue's SIGTERM), which may end before the sweep hears of the stop.
  if (s_.checkpoints && (stopping() || rec.preempted) && !stopped_alone && !pruned &&
      rec.kind != outcome_kind::success) {
    rec.kind = outcome_kind::cancelled;
    rec.preempted = true;
    rec.error.clear();
  }
  if (const auto last = last_report_.find(f.t.index); last != last_report_.end()) {
    // A record that already says a later step knows better: a Slurm node's record carries the
    // step and report its node saw last, which may not have reached this side before the record.
    if (last->second.first >= rec.step) {
      rec.step = last->second.first;
      // A pruned trial's result: what it returned if it stopped cleanly, else its last report.
      if (pruned && rec.kind != outcome_kind::success) rec.result = last->second.second;
    }
    last_report_.erase(last);
  }
  if (pruned) {
    // Early stopping's decision, however the trial then ended (killed, cleanly when it asked
    // should_stop(), or at its end when the decision came late): done, not failed; never
    // retried, journaled with the last step it reported.
    rec.kind = outcome_kind::cancelled;
    rec.pruned = true;
    rec.error.clear();  // the SIGTERM that stopped it says nothing about the trial
  }
}

// A cancelled attempt (not pruned): run again at once where it was preempted while the sweep
// goes on, else counted as cancelled; never an end. Under mutex_.
void scheduler::after_cancel(finished_trial& f, std::vector<trial_record>& final) {
  trial_record& rec = f.record;
  if (rec.preempted && !stopping()) {
    // Preempted while the sweep goes on (a Slurm array task past its time limit that could
    // not requeue itself; a trial stopped from outside before the sweep heard of a stop, if
    // one comes): journaled, and run again at once, from its checkpoint. (An array task's
    // isorun journals nothing preempted: the requeued task or the submitter goes on.)
    if (options_.journal_preempted) final.push_back(rec);
    trial next = f.t;
    next.attempt = rec.attempts + 1;
    retries_.push_front(std::move(next));
    return;
  }
  ++cancelled_;
  // Not an end: the journal says where it got, and the next run goes on from there.
  if (rec.preempted && options_.journal_preempted) final.push_back(std::move(rec));
}

// An attempt that ran out of memory, run again at a larger cap while the spec allows one: true
// if it is not an end (retried, or stopped before its retry). Under mutex_.
bool scheduler::retried_at_larger_cap(finished_trial& f, std::vector<trial_record>& final) {
  const trial_record& rec = f.record;
  // (At most max_attempts attempts at growing caps in a run: the first, then the retries.)
  if (rec.kind != outcome_kind::out_of_memory || rec.pruned || f.t.oom_retries + 1 >= s_.oom_retry.max_attempts)
    return false;
  const std::uint64_t larger = next_cap(s_.oom_retry, cap_of(f.t, s_));
  if (!larger) return false;
  // The attempt is journaled with the cap it had and the one that comes next, so the journal
  // shows every cap tried and a resumed sweep (after a stop now, or a crash during the retry)
  // starts the trial at the larger cap, not the spec's.
  trial_record tried = rec;
  tried.retry_mem_limit = larger;
  final.push_back(std::move(tried));
  if (stopping()) {
    ++cancelled_;  // stopped before its retry: not run to its end here; a resume goes on
    return true;
  }
  trial next = f.t;
  next.attempt = rec.attempts + 1;
  next.mem_limit = larger;
  next.oom_retries = f.t.oom_retries + 1;
  retries_.push_front(std::move(next));
  return true;
}

// An attempt run again under the spec's retries per outcome class, on the lane that just came
// free: true if it is. Under mutex_.
bool scheduler::retried(finished_trial& f) {
  const trial_record& rec = f.record;
  // The retries per outcome class count the attempts that were not out-of-memory retries: a
  // trial that needed a larger cap still has all of them (each at the cap it reached).
  const auto allowed = s_.retries.find(std::string(to_string(rec.kind)));
  if (rec.kind == outcome_kind::success || rec.pruned || allowed == s_.retries.end() ||
      rec.attempts - f.t.oom_retries > allowed->second || stopping())
    return false;
  trial next = f.t;
  next.attempt = rec.attempts + 1;
  retries_.push_front(std::move(next));
  return true;
}

bool scheduler::settle(finished_trial& f, std::vector<trial_record>& final) {
  reclassify(f);
  trial_record& rec = f.record;
  totals& sum = totals_[f.t.index];
  if (f.t.attempt == 1 || sum.wall_s == 0) sum.start_s = rec.start_s;
  sum.wall_s += rec.wall_s;
  if (rec.kind == outcome_kind::cancelled && !rec.pruned) {
    after_cancel(f, final);
    return false;
  }
  if (retried_at_larger_cap(f, final) || retried(f)) return false;
  ended_.insert(f.t.index);
  rec.start_s = sum.start_s;
  rec.wall_s = sum.wall_s;
  totals_.erase(f.t.index);
  bool halt = rec.kind != outcome_kind::success && s_.fail_fast;
  if (rec.kind == outcome_kind::success && !metric_checked_ && !s_.metric.name.empty()) {
    // The result type was not known up front: the first result decides, before another starts.
    metric_checked_ = true;
    metric_error_ = metric_problem(s_, rec.result, "trial " + rec.id);
    halt = halt || !metric_error_.empty();
  }
  final.push_back(std::move(rec));
  return halt;
}

void scheduler::on_report(const trial& t, std::int64_t step, const nlohmann::json& metrics) {
  // One report at a time, from every lane: the hook sees them in one order, the one it records.
  std::lock_guard judging(judging_);
  // A pruned trial's reports until it ends still reach the hook (every report is kept, and a
  // resumed sweep replays them all); its verdicts on them change nothing.
  bool pruned_already = false;
  {
    std::lock_guard lk(mutex_);
    if (!running_.count(t.index) || stopped_.count(t.index) || stopping()) return;
    last_report_[t.index] = {step, metrics};  // a pruned trial's too, until it ends: the step it reached
    pruned_already = pruned_.count(t.index) > 0;
  }
  if (!options_.should_stop) return;
  bool stop_it = false;
  try {
    stop_it = options_.should_stop(t, step, metrics);
  } catch (const spec_error& e) {
    std::unique_lock lk(mutex_);
    if (metric_error_.empty()) metric_error_ = e.what();
    halt_and_cancel(lk);
    changed_.notify_all();
    return;
  } catch (...) {
    fail(std::current_exception());
    return;
  }
  if (stop_it && !pruned_already) prune(t);
}

void scheduler::on_checkpoint(const trial& t, std::int64_t step) {
  if (!options_.checkpointed) return;
  try {
    options_.checkpointed(t, step);
  } catch (...) {
    fail(std::current_exception());  // (as a report that cannot be written)
  }
}

void scheduler::prune(const trial& t) {
  {
    std::lock_guard lk(mutex_);
    if (!running_.count(t.index)) return;
    pruned_.insert(t.index);
  }
  backend_.stop(t);
}

void scheduler::stop(const trial& t) {
  {
    std::lock_guard lk(mutex_);
    if (!running_.count(t.index)) return;
    stopped_.insert(t.index);
  }
  backend_.stop(t);
}

void scheduler::on_error(std::exception_ptr error) { fail(std::move(error)); }

void scheduler::fail(std::exception_ptr error) {
  std::unique_lock lk(mutex_);
  if (!error_) error_ = std::move(error);
  halt_and_cancel(lk);
  changed_.notify_all();
}

void scheduler::halt_and_cancel(std::unique_lock<std::mutex>& lk) {
  halted_ = true;
  lk.unlock();
  backend_.cancel_all();
  lk.lock();
}

void scheduler::interrupt() {
  {
    std::lock_guard lk(mutex_);
    changed_.notify_all();
  }
  backend_.cancel_all();
}

std::size_t scheduler::running() const {
  std::lock_guard lk(mutex_);
  return running_.size();
}
std::size_t scheduler::cancelled() const {
  std::lock_guard lk(mutex_);
  return cancelled_;
}
std::string scheduler::metric_error() const {
  std::lock_guard lk(mutex_);
  return metric_error_;
}
std::exception_ptr scheduler::error() const {
  std::lock_guard lk(mutex_);
  return error_;
}

}  // namespace isorun::sweep
