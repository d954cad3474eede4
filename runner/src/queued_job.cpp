#include "isorun/runner/queued_job.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "isorun/runner/errors.hpp"
#include "isorun/runner/launcher.hpp"
#include "isorun/runner/standby.hpp"
#include "job_state.hpp"
#include "watcher.hpp"

namespace isorun::runner {

std::shared_ptr<queued_job> queue_call(admission& first, admission* then, admission_request request,
                                       std::shared_ptr<const job_spec> launch, blob args, warm_start warm) {
  auto place = first.enqueue(std::move(request), then);
  return std::make_shared<queued_job>(
      std::move(place), [launch = std::move(launch), args = std::move(args), warm](
                            std::shared_ptr<admission::ticket> ticket, bool caller_waits) mutable {
        job_spec spec = *launch;
        spec.args = std::move(args);
        spec.gpus = ticket->gpus();
        spec.caller_waits = caller_waits;
        spec.admitted = std::move(ticket);
        if (!warm.standby && !warm.zygote) return job::start(std::move(spec));
        launch_spec worker = launch_spec_for(spec);
        worker.zygote = warm.zygote;
        return job::start(std::move(spec), standby_for(worker, warm.standby, warm.linger));
      });
}

queued_job::queued_job(std::shared_ptr<admission::waiter> place, starter start)
    : place_{std::move(place)}, start_{std::move(start)} {}

queued_job::~queued_job() {
  {
    std::lock_guard lock(mutex_);
    if (!job_) place_->cancel();
  }
  if (done_event_ >= 0) ::close(done_event_);
}

bool queued_job::admitted_now() { return place_->wait_for(std::chrono::milliseconds(0)); }

void queued_job::start_locked(bool then_waits) {
  try {
    std::shared_ptr<admission::ticket> ticket = place_->get();  // ready: it does not wait
    if (cancelled_) throw cancelled("cancelled while waiting for admission");
    job_ = start_(std::move(ticket), then_waits);
  } catch (const cancelled& e) {
    ended_ = true;
    unstarted_ = std::make_unique<job_result>();
    unstarted_->status.kind = outcome_kind::cancelled;
    unstarted_->status.message = e.what();
  } catch (...) {
    ended_ = true;
    failed_ = std::current_exception();
  }
}

bool queued_job::start_if_admitted(bool then_waits) {
  std::lock_guard lock(mutex_);
  if (!job_ && !ended_ && !handed_ && admitted_now()) start_locked(then_waits);  // (a failure: wait() says)
  return job_ != nullptr;
}

// Posted by the admission's notify: the call may be admitted now. Started on the watcher's
// thread, and watched there.
void queued_job::start_from_watcher() {
  std::shared_ptr<job> j;
  {
    std::lock_guard lock(mutex_);
    if (job_ || ended_ || !admitted_now()) return;  // (behind an executor: the process's admission is next)
    start_locked(false);
    j = job_;
  }
  changed_.notify_all();
  if (!j) return mark_done();  // cancelled, or it could not start
  j->watch_elsewhere([self = weak_from_this()] {
    if (auto q = self.lock()) q->mark_done();
  });
}

void queued_job::watch_elsewhere(std::function<void()> on_done, bool until_started) {
  std::shared_ptr<job> j;
  bool ended, handed, done;
  {
    std::lock_guard lock(mutex_);
    done = done_;
    if (on_done && !done) on_done_ = std::exchange(on_done, nullptr);
    handed = std::exchange(handed_, true);
    j = job_;
    ended = ended_;
  }
  if (done && on_done) on_done();  // over already
  if (handed) return;
  const std::weak_ptr<queued_job> self = weak_from_this();
  if (j) {  // started on a caller's thread, which does not watch it
    j->watch_elsewhere([self] {
      if (auto q = self.lock()) q->mark_done();
    });
    return;
  }
  if (ended) return mark_done();
  place_->set_notify([self] {
    watcher::instance().post([self] {
      if (auto q = self.lock()) q->start_from_watcher();
    });
  });
  if (!until_started) return;
  std::unique_lock lock(mutex_);
  if (admitted_now()) changed_.wait(lock, [&] { return job_ || ended_; });
}

void queued_job::mark_done() {
  std::function<void()> on_done;
  {
    std::lock_guard lock(mutex_);
    if (done_) return;
    done_ = true;
    on_done = std::move(on_done_);
    if (done_event_ >= 0) {
      const std::uint64_t one = 1;
      [[maybe_unused]] auto n = ::write(done_event_, &one, sizeof one);
    }
  }
  changed_.notify_all();
  if (on_done) on_done();
}

void queued_job::wait_done(const job::interruption& interrupted) {
  wait_until_done(
      mutex_, changed_, interrupted ? done_fd() : -1, [this] { return done_.load(); }, interrupted,
      [this] { cancel(); });
}

const job_result& queued_job::wait() { return wait(job::interruption{}); }

const job_result& queued_job::wait(const job::interruption& interrupted) {
  std::shared_ptr<job> here;
  {
    std::lock_guard lock(mutex_);
    if (!handed_ && !job_ && !ended_ && admitted_now()) start_locked(true);
    if (!handed_ && job_) here = job_;
  }
  if (here) {  // started on this thread (now, or by start_if_admitted): watched here
    const job_result& r = here->wait(interrupted);
    mark_done();
    return r;
  }
  watch_elsewhere();
  wait_done(interrupted);
  std::shared_ptr<job> j;
  {
    std::lock_guard lock(mutex_);
    if (failed_) std::rethrow_exception(failed_);
    if (!job_) return *unstarted_;
    j = job_;
  }
  return j->wait();  // ended: its result, classified here
}

bool queued_job::wait_for(std::chrono::milliseconds timeout) {
  watch_elsewhere();
  std::unique_lock lock(mutex_);
  const auto done = [&] { return done_.load(); };
  // (milliseconds::max(): no deadline; added to now, it would overflow and not wait at all)
  if (timeout == std::chrono::milliseconds::max()) {
    changed_.wait(lock, done);
    return true;
  }
  return changed_.wait_for(lock, timeout, done);
}

void queued_job::cancel() noexcept {
  std::shared_ptr<job> j;
  {
    std::lock_guard lock(mutex_);
    cancelled_ = true;
    j = job_;
  }
  if (j) j->cancel();
  else place_->cancel();
}

pid_t queued_job::pid() const noexcept {
  std::lock_guard lock(mutex_);
  return job_ ? job_->pid() : 0;
}

bool queued_job::started() const noexcept {
  std::lock_guard lock(mutex_);
  return job_ != nullptr;
}

bool queued_job::done() const noexcept { return done_; }

int queued_job::done_fd() {
  std::lock_guard lock(mutex_);
  if (done_event_ < 0) {
    done_event_ = ::eventfd(done_ ? 1 : 0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (done_event_ < 0) throw internal_error(std::string("eventfd: ") + std::strerror(errno));
  }
  return done_event_;
}

}  // namespace isorun::runner
