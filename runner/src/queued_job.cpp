#include "isorun/runner/queued_job.hpp"

#include <algorithm>

#include "isorun/runner/errors.hpp"
#include "isorun/runner/launcher.hpp"
#include "isorun/runner/standby.hpp"

namespace isorun::runner {

std::shared_ptr<queued_job> queue_call(admission& first, admission* then, admission_request request,
                                       std::shared_ptr<job_spec> spec, std::size_t standby, bool zygote) {
  auto place = first.enqueue(std::move(request), then);
  return std::make_shared<queued_job>(
      std::move(place),
      [spec = std::move(spec), standby, zygote](std::shared_ptr<admission::ticket> ticket, bool caller_waits) {
        spec->gpus = ticket->gpus();
        spec->caller_waits = caller_waits;
        spec->admitted = std::move(ticket);
        if (!standby && !zygote) return job::start(std::move(*spec));
        launch_spec launch = launch_spec_for(*spec);
        launch.zygote = zygote;
        return job::start(std::move(*spec), standby_for(launch, standby));
      });
}

queued_job::queued_job(std::shared_ptr<admission::waiter> place, starter start)
    : place_{std::move(place)}, start_{std::move(start)} {}

queued_job::~queued_job() {
  std::lock_guard lock(mutex_);
  if (!job_) place_->cancel();
}

bool queued_job::admit_and_start(std::chrono::steady_clock::time_point deadline, bool then_waits) {
  {
    std::lock_guard lock(mutex_);
    if (job_ || ended_) return true;
  }
  const bool forever = deadline == std::chrono::steady_clock::time_point::max();
  for (;;) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (place_->wait_for(forever ? std::chrono::milliseconds::max() : std::max(left, std::chrono::milliseconds(0))))
      break;
    if (!forever && std::chrono::steady_clock::now() >= deadline) return false;
  }
  std::lock_guard lock(mutex_);  // one waiter starts the job; others find it started
  if (job_ || ended_) return true;
  try {
    std::shared_ptr<admission::ticket> ticket = place_->get();
    if (cancelled_) throw cancelled("cancelled while waiting for admission");
    job_ = start_(std::move(ticket), then_waits);
  } catch (const cancelled& e) {
    ended_ = true;
    unstarted_.status.kind = outcome_kind::cancelled;
    unstarted_.status.message = e.what();
  } catch (...) {
    ended_ = true;
    failed_ = std::current_exception();
  }
  return true;
}

const job_result& queued_job::wait() { return wait(job::interruption{}); }

const job_result& queued_job::wait(const job::interruption& interrupted) {
  if (!interrupted) {
    admit_and_start(std::chrono::steady_clock::time_point::max(), true);
  } else {
    while (!admit_and_start(std::chrono::steady_clock::now() + job::interruption_interval, true))
      if (interrupted()) cancel();
  }
  std::shared_ptr<job> j;
  {
    std::lock_guard lock(mutex_);
    if (failed_) std::rethrow_exception(failed_);
    if (!job_) return unstarted_;
    j = job_;
  }
  return j->wait(interrupted);
}

bool queued_job::start_if_admitted(bool then_waits) {
  return admit_and_start(std::chrono::steady_clock::now(), then_waits) && started();
}

bool queued_job::wait_for(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  if (!admit_and_start(deadline, false)) return false;  // (its caller may go on at the timeout)
  std::shared_ptr<job> j;
  {
    std::lock_guard lock(mutex_);
    if (!job_) return true;
    j = job_;
  }
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  return j->wait_for(std::max(left, std::chrono::milliseconds(0)));
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

}  // namespace isorun::runner
