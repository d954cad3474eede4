// Watching one worker: the steps (worker_watch), and the driver of a wait that watches on its own
// thread (watch_here). The process's watcher drives the same steps for every other call.
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "isorun/runner/units.hpp"
#include "isorun/runner/worker_env.hpp"
#include "isorun/serialization/protocol.hpp"
#include "job_state.hpp"

namespace isorun::runner {
namespace ser = isorun::serialization;

namespace {

// At most this much of a worker's stderr per step: a worker that writes without end must not
// keep one step from returning, and so the watcher from its other calls.
constexpr std::size_t stderr_per_step = 256 << 10;

}  // namespace

std::optional<ser::segment_header> streamed_header(const ser::pooled_segment& segment) {
  ser::segment_header h{};
  if (::pread(segment.fd(), &h, sizeof h, 0) != static_cast<ssize_t>(sizeof h) || h.magic != ser::streamed_result_magic)
    return std::nullopt;
  return h;
}

worker_watch::worker_watch(job::state& s)
    : s_{s},
      tail_{s.spec.stderr_tail_lines},
      echo_{s.spec.stderr_echo_fd, s.spec.stderr_echo_limit},
      stopping_{stop_plan::graceful(s.spec.grace, s.spec.stop_signal)},
      deadline_{s.spec.timeout.count() > 0 ? s.worker.started + s.spec.timeout : clock::time_point::max()},
      await_done_{s.spec.early_result || (s.spec.early_small_result && s.spec.gpus.empty())} {}

int worker_watch::fd(slot k) const noexcept {
  switch (k) {
    case exit_slot: return s_.worker.process.pidfd();
    case stderr_slot: return stderr_open_ ? s_.worker.stderr_read.get() : -1;
    case cancel_slot: return s_.cancel_event.get();
    // The control socket is read while the worker lives: the task runs in the worker's process
    // and can write to it too. Left unread, what it wrote would fill the buffer the worker's own
    // `done` needs, and a violation would wait for an exit that may never come.
    case control_slot: return control_open_ && s_.worker.control ? s_.worker.control.get() : -1;
    case stream_slot: return s_.segments.stream_event && !w_.stream ? s_.segments.stream_event.get() : -1;
    case slot_count: break;
  }
  return -1;
}

// Reads the worker's messages that are waiting, and checks each against the protocol: one done,
// from the worker assigned (its pid, the devices it sees). Anything else (a malformed frame, a
// second done, a message only the supervisor sends) is a violation: it is recorded as
// invalid_result, nothing more of the socket is read and true is returned, for the caller to stop
// the worker at once.
bool worker_watch::read_control() {
  const std::string expected_devices = visible_devices_for(s_.spec.gpus);
  auto violation = [&](std::string why) {
    w_.force(outcome_kind::invalid_result, std::move(why));
    control_open_ = false;
    return true;
  };
  // What the worker's task may have written there, if it was not the worker.
  const std::string culprit = " (a task must not write to descriptor " + std::to_string(ser::control_fd) +
                              ", the worker's control socket)";
  while (control_open_ && s_.worker.control) {
    ser::receive_result r;
    try {
      r = ser::try_receive(s_.worker.control.get());
    } catch (const std::exception& e) {
      return violation(std::string("malformed control message from worker: ") + e.what() + culprit);
    }
    for (int fd : r.fds) ::close(fd);  // only an assignment carries descriptors, and workers send none
    if (r.closed) {
      control_open_ = false;
      return false;
    }
    if (!r.message) return false;
    auto* d = std::get_if<ser::done_message>(&*r.message);
    if (!d) return violation("worker sent a message only the supervisor may send");
    if (w_.done) return violation("worker sent a second done" + culprit);
    std::string bad;
    if (d->protocol != ser::protocol_version) bad = "protocol version " + std::to_string(d->protocol);
    else if (d->pid != s_.worker.process.pid())
      bad = "pid " + std::to_string(d->pid) + " (spawned " + std::to_string(s_.worker.process.pid()) + ")";
    else if (d->visible_devices != expected_devices)
      bad = "CUDA_VISIBLE_DEVICES='" + d->visible_devices + "' (assigned '" + expected_devices + "')";
    else if (d->device_order != "PCI_BUS_ID") bad = "CUDA_DEVICE_ORDER='" + d->device_order + "'";
    if (!bad.empty()) return violation("worker handshake mismatch: it reports " + bad);
    w_.done = std::move(*d);
    w_.done_seen_ns = ser::monotonic_ns();
  }
  return false;
}

bool worker_watch::step(const events& ready) {
  launched_worker& worker = s_.worker;
  if (ready[cancel_slot] & POLLIN) {
    std::uint64_t requests = 1;  // the eventfd counts cancels that arrived since the last read
    [[maybe_unused]] auto n = ::read(s_.cancel_event.get(), &requests, sizeof requests);
    w_.force(outcome_kind::cancelled, "cancelled by the caller");
    if (const int sig = s_.cancel_signal.load(); sig && !stopping_.started())
      stopping_ = stop_escalation(stop_plan::graceful(s_.spec.grace, sig));
    // Each cancel takes the next step of the stop: a second one does not wait for the grace.
    for (std::uint64_t i = 0; i < std::min<std::uint64_t>(requests, 2); ++i)
      deadline_ = stopping_.advance(worker.process);
  }
  if (ready[stderr_slot]) stderr_open_ = detail::drain(worker.stderr_read.get(), &tail_, echo_, stderr_per_step);
  if (ready[stream_slot] & POLLIN) {  // the worker starts streaming its result: receive it alongside
    std::uint64_t starts = 0;
    [[maybe_unused]] auto n = ::read(s_.segments.stream_event.get(), &starts, sizeof starts);
    try {
      w_.stream = std::make_unique<ser::stream_reader>(s_.segments.ring, s_.spec.max_result);
    } catch (const std::exception& e) {  // a bad size, or no memory for it: the result is lost
      w_.force(outcome_kind::invalid_result, std::string("worker result rejected: ") + e.what());
      if (!stopping_.started()) deadline_ = stopping_.advance(worker.process);
    }
  }
  if (deadline_ != clock::time_point::max() && clock::now() >= deadline_) {
    if (!stopping_.started())
      w_.force(outcome_kind::timeout, "timed out after " + format_duration(s_.spec.timeout) + "; stopped");
    deadline_ = stopping_.advance(worker.process);
  }
  if (ready[control_slot]) {  // before the exit: `done` came first, even if both are ready now
    // A violation stops the worker at once: nothing it does afterwards can count.
    if (read_control()) worker.process.signal(SIGKILL);
    if (await_done_ && w_.done) {
      await_done_ = false;
      // Sealed, the result can no longer change, whoever still runs: hand it over now. A result
      // sent in `done`, or streamed, needs no seal: its payload is in this process's memory (a
      // streamed one's header is copied now). A failure, or a seal refused because something
      // still maps it writable, waits for the exit.
      // A small result alone (early_small_result): the worker sealed nothing, and a larger one
      // waits for the exit, its segment then pooled as it is.
      if (w_.done->status == ser::task_status::ok && !w_.forced) {
        const bool small = !w_.done->inline_result.empty();
        if (!small && s_.spec.early_result) w_.streamed = streamed_header(*s_.segments.result);
        if (small || w_.streamed || (s_.spec.early_result && s_.segments.result->seal())) {
          w_.early = true;
          return true;
        }
      }
    }
  }
  return (ready[exit_slot] & POLLIN) != 0;
}

void worker_watch::fail(const std::string& why) noexcept {
  try {
    w_.force(outcome_kind::internal_error, "the call's watcher failed: " + why);
  } catch (...) {  // (no memory for the words: the kill below still ends it)
  }
  w_.early = false;
  s_.worker.process.signal(SIGKILL);
}

watch_record worker_watch::finish() {
  // The worker reported or is gone: no more of a stream will come (what it published is still
  // copied).
  if (w_.stream) w_.stream->stop_waiting();
  launched_worker& worker = s_.worker;
  if (!w_.early) {
    read_control();
    if (s_.host_cap) w_.host = s_.host_cap->read();  // before the reap removes the cgroup
    w_.exited = worker.process.reap();               // also kills what is left of the group and the cgroup
    w_.reaped_ns = ser::monotonic_ns();
    w_.memory_peak = worker.process.memory_peak().value_or(w_.host.peak.value_or(worker.process.max_rss()));
  }
  // What is there now: a process that left the worker's group may write on without end.
  if (stderr_open_) detail::drain(worker.stderr_read.get(), &tail_, echo_, stderr_per_step);
  w_.wall = clock::now() - worker.started;
  w_.stderr_tail = tail_.lines();
  w_.result_segment = s_.segments.result;
  return std::move(w_);
}

watch_record watch_here(job::state& s, const job::interruption& interrupted) {
  worker_watch w(s);
  if (interrupted && interrupted.ask()) s.request_cancel();
  constexpr std::size_t n = worker_watch::slot_count;
  for (;;) {
    pollfd fds[n + 1];
    for (std::size_t k = 0; k < n; ++k) fds[k] = {w.fd(static_cast<worker_watch::slot>(k)), POLLIN, 0};
    fds[n] = {interrupted ? interrupted.fd : -1, POLLIN, 0};
    int timeout_ms = -1;
    if (const auto due = w.due(); due != clock::time_point::max()) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(due - clock::now()).count();
      timeout_ms = static_cast<int>(std::clamp<long long>(left + 1, 0, INT_MAX));
    }
    const int rc = ::poll(fds, n + 1, timeout_ms);
    if (rc < 0 && errno != EINTR) break;
    // A signal on this thread, or one another thread saw (the interruption's descriptor).
    if (interrupted && (rc < 0 || (fds[n].revents & POLLIN)) && interrupted.ask()) s.request_cancel();
    worker_watch::events ready{};
    for (std::size_t k = 0; k < n; ++k) ready[k] = rc > 0 ? fds[k].revents : short{0};
    if (w.step(ready)) break;
  }
  return w.finish();
}

// Only once the worker is gone do its segments go back to the pool: a worker still exiting maps
// its request (read-only, yet a shared mapping of a file it could write, which the kernel counts
// as a writer) and holds its descriptor; handed to the next call as its result segment, that
// segment could not be sealed, and the early hand-over would silently wait for the exit; a task
// could even write into it.
void release_worker(job::state& s) {
  s.segments.request.reset();
  s.segments.result.reset();  // (kept by the record, or the result, where it lies there)
  s.segments.ring.reset();    // a worker still exiting could have written to it
  s.worker.control.reset();
  s.worker.stderr_read.reset();
  s.host_cap.reset();
  s.spec.admitted.reset();  // its GPU memory and its core are free: the next call may start
}

void wait_until_done(std::mutex& mutex, std::condition_variable& changed, int fd, const std::function<bool()>& done,
                     const job::interruption& interrupted, const std::function<void()>& cancel) {
  if (interrupted) {
    if (interrupted.ask()) cancel();
    pollfd fds[2] = {{fd, POLLIN, 0}, {interrupted.fd, POLLIN, 0}};
    while (!done()) {
      const int rc = ::poll(fds, 2, -1);
      if (rc < 0 && errno != EINTR) break;  // cannot wait on descriptors: on the condition, uninterrupted
      if ((rc < 0 || (fds[1].revents & POLLIN)) && interrupted.ask()) cancel();
    }
  }
  std::unique_lock lock(mutex);
  changed.wait(lock, done);
}

void publish_end(job::state& s, watch_record r) {
  std::function<void()> on_end;
  {
    std::lock_guard lock(s.wait_mutex);
    s.record = std::move(r);
    s.ended = true;
    on_end = std::move(s.on_end);
    if (s.end_event) {
      const std::uint64_t one = 1;
      [[maybe_unused]] auto n = ::write(s.end_event.get(), &one, sizeof one);
    }
  }
  s.ready.notify_all();
  if (on_end) on_end();
}

}  // namespace isorun::runner
