#include "isorun/runner/job.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>

#include "isorun/alloc/config.hpp"
#include "isorun/runner/errors.hpp"
#include "isorun/runner/host_memory.hpp"
#include "isorun/runner/launcher.hpp"
#include "isorun/runner/placement.hpp"
#include "isorun/runner/process.hpp"
#include "isorun/runner/stream_tail.hpp"
#include "isorun/runner/unique_fd.hpp"
#include "isorun/runner/units.hpp"
#include "isorun/runner/worker_env.hpp"
#include "isorun/serialization/codec.hpp"
#include "isorun/serialization/control.hpp"
#include "isorun/serialization/cpu_handoff.hpp"
#include "isorun/serialization/machine.hpp"
#include "isorun/serialization/protocol.hpp"
#include "isorun/serialization/request.hpp"
#include "isorun/serialization/result_stream.hpp"
#include "isorun/serialization/segment_pool.hpp"
#include "isorun/serialization/shm_segment.hpp"

namespace isorun::runner {
namespace ser = isorun::serialization;
using clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

using ser::monotonic_ns;
using detail::line_tail;

// A worker's request and result segments, ready to be handed over, and for a blob result its
// ring (mapped on this side) and the eventfd that announces a stream.
struct prepared_request {
  std::string inline_request;  // the request's bytes, when it is small enough to be carried (control.hpp)
  std::shared_ptr<ser::pooled_segment> request, result, ring;  // (request: when it is not)
  unique_fd stream_event;
};

// Encodes what `spec` asks for (into a request segment unless it is small enough to be carried by
// the assignment), and takes a result segment.
// The size of each task's last result, by task name: what its next worker maps ahead
// (request::expected_result).
class result_sizes {
 public:
  static result_sizes& instance() {
    static auto* sizes = new result_sizes;  // never destroyed: jobs may finish during exit
    return *sizes;
  }
  std::uint64_t last(const std::string& task) {
    std::lock_guard lock(mutex_);
    const auto it = last_.find(task);
    return it == last_.end() ? 0 : it->second;
  }
  void record(const std::string& task, std::uint64_t bytes) {
    std::lock_guard lock(mutex_);
    last_[task] = bytes;
  }

 private:
  std::mutex mutex_;
  std::map<std::string, std::uint64_t> last_;
};

prepared_request prepare_request(job_spec& spec) {
  if (!spec.max_result) spec.max_result = ser::physical_memory();
  ser::request req;
  req.task = spec.task;
  req.encoding = static_cast<std::uint32_t>(spec.encoding);
  req.task_libraries = spec.task_libraries;
  req.mem_limit = spec.mem_limit;
  for (const auto& g : spec.gpus) req.gpus.push_back({g.index, g.uuid, g.total_memory, g.simulated});
  req.alloc_conf = spec.alloc_conf;
  req.max_result = spec.max_result;
  req.early_result = spec.early_result;
  req.expected_result = result_sizes::instance().last(spec.task);
  req.args = std::move(spec.args);
  auto& pool = ser::segment_pool::instance();
  prepared_request p;
  try {
    const std::uint64_t n = ser::encoded_size(req);
    std::byte* base;
    if (ser::header_size + n <= ser::inline_limit) {  // carried by the assignment
      p.inline_request.assign(ser::header_size + n, '\0');
      base = reinterpret_cast<std::byte*>(p.inline_request.data());
    } else {
      p.request = pool.acquire(ser::header_size + n);
      base = p.request->writable(ser::header_size + n);
    }
    const std::uint64_t sum = ser::encode_into(base + ser::header_size, n, req);
    ser::write_header(base, ser::request_magic, spec.encoding, n, sum);
    p.result = pool.acquire(0, true);
    // A pooled segment still holds the result of the call it served last, which must not pass
    // for this call's if the worker reports success without writing one: its magic goes.
    if (const std::uint64_t none = 0; p.result->capacity() >= sizeof none &&
                                      ::pwrite(p.result->fd(), &none, sizeof none, 0) != sizeof none)
      throw std::system_error(errno, std::generic_category(), "clearing a result segment");
    if (spec.result_stream) {
      p.ring = ser::segment_pool::rings().acquire(ser::ring_bytes);
      // Not faulted in here: a ring's slot pages are made by the first stream through it.
      ser::reset_ring(p.ring->writable(ser::ring_bytes, false));
      p.stream_event.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
      if (!p.stream_event) throw std::system_error(errno, std::generic_category(), "eventfd");
    }
  } catch (const std::system_error& e) {
    throw internal_error(std::string("cannot prepare shared memory for the worker: ") + e.what());
  }
  return p;
}

// Gives a launched worker its work: the device assignment, the two segments and, for
// stdout_mode::file and stdout_mode::fd, its stdout; with `hand_cpu_to`, the worker's pid, this
// thread's CPU for its wake-up (true if handed). A worker that is already gone is not an error
// here; watching it finds out how it ended.
bool assign(int control, const prepared_request& p, const job_spec& spec, pid_t hand_cpu_to = 0) {
  ser::assign_message a;
  a.env = assignment_environment(spec.gpus, spec.mem_limit);
  if (!spec.memory_timeline.empty())
    a.env.push_back(std::string(ser::env::memory_timeline) + "=" + spec.memory_timeline);
  unique_fd out;
  if (spec.stdout_to == stdout_mode::file) {
    // Not through a symbolic link, and a regular file only (O_NONBLOCK: a FIFO does not hold the
    // open up): the file may lie in a folder others write to.
    out.reset(::open(spec.stdout_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644));
    if (!out) throw internal_error("cannot open " + spec.stdout_path + ": " + std::strerror(errno));
    struct stat st {};
    if (::fstat(out.get(), &st) != 0 || !S_ISREG(st.st_mode))
      throw internal_error("cannot use " + spec.stdout_path + " for the worker's stdout: it is not a regular file");
    ::fcntl(out.get(), F_SETFL, ::fcntl(out.get(), F_GETFL) & ~O_NONBLOCK);
    a.stdout_attached = true;
  } else if (spec.stdout_to == stdout_mode::fd) {
    out.reset(::fcntl(spec.stdout_fd, F_DUPFD_CLOEXEC, 0));
    if (!out) throw internal_error(std::string("cannot hand the worker its stdout: ") + std::strerror(errno));
    a.stdout_attached = true;
  }
  a.request = p.inline_request;
  std::vector<int> fds;
  if (p.request) fds.push_back(p.request->fd());
  fds.push_back(p.result->fd());
  if (out) fds.push_back(out.get());
  if (p.ring) {
    fds.insert(fds.end(), {p.ring->fd(), p.stream_event.get()});
    a.stream_attached = true;
  }
  if (hand_cpu_to) a.cpus = ser::hand_this_cpu_to(hand_cpu_to);  // last: the worker wakes at the send
  try {
    ser::send_message(control, a, fds);
  } catch (const std::system_error&) {
  }
  return !a.cpus.empty();
}

// The header of a streamed result (its payload came through the ring), read with pread: a copy
// the worker cannot change afterwards, and no mapping of a segment the pool may have grown
// large. nullopt if the segment holds anything else.
std::optional<ser::segment_header> streamed_header(const ser::pooled_segment& segment) {
  ser::segment_header h{};
  if (::pread(segment.fd(), &h, sizeof h, 0) != static_cast<ssize_t>(sizeof h) || h.magic != ser::streamed_result_magic)
    return std::nullopt;
  return h;
}

// What watching a worker until it is gone records; classify() turns it into an outcome.
struct watch_record {
  exit_status exited;
  std::optional<std::pair<outcome_kind, std::string>> forced;  // the first of cancel, timeout, violation
  std::optional<ser::done_message> done;
  std::vector<std::string> stderr_tail;
  clock::duration wall{};
  std::uint64_t memory_peak = 0;  // the worker's cgroup's memory.peak, else its largest resident set
  host_memory_cap::reading host;  // its host memory cap's cgroup, where it has one
  std::int64_t reaped_ns = 0;     // CLOCK_MONOTONIC when the worker was reaped (not for an early hand-over)
  std::int64_t done_seen_ns = 0;  // CLOCK_MONOTONIC when its done was read
  bool early = false;  // the result was handed over (sealed, or streamed); the worker has not exited yet
  std::unique_ptr<ser::stream_reader> stream;  // receiving a result the worker streams
  std::optional<ser::segment_header> streamed;  // a snapshot of a streamed result's header

  void force(outcome_kind k, std::string why) {
    if (!forced) forced.emplace(k, std::move(why));
  }
};

}  // namespace

struct job::state {
  job_spec spec;
  prepared_request segments;
  launched_worker worker;
  pid_t pid = -1;  // the worker's, kept once it is reaped (the watcher may reap it at any time)
  unique_fd cancel_event;
  std::atomic<int> cancel_signal{0};          // the first cancel()'s signal, where it named one
  std::unique_ptr<host_memory_cap> host_cap;  // until the worker is reaped
  call_trace trace;                           // the supervisor's steps until the assignment

  std::mutex wait_mutex;
  std::condition_variable ready;  // early_result: whoever watches set `result`
  bool watched = false;           // early_result: someone watches (under wait_mutex)
  std::atomic<bool> finished{false};
  job_result result;

  // A cancel, for the watcher's next poll: the eventfd counts them (each, the stop's next step).
  void request_cancel() noexcept {
    const std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(cancel_event.get(), &one, sizeof one);
  }
};

namespace {

// Reads the worker's messages that are waiting, and checks each against the protocol: one done,
// from the worker assigned (its pid, the devices it sees). Anything else (a malformed frame, a
// second done, a message only the supervisor sends) is a violation: it is recorded as invalid_result,
// the socket is closed (nothing more of it is read) and true is returned, for the caller to stop
// the worker at once.
bool read_control(job::state& s, watch_record& w) {
  const std::string expected_devices = visible_devices_for(s.spec.gpus);
  auto violation = [&](std::string why) {
    w.force(outcome_kind::invalid_result, std::move(why));
    s.worker.control.reset();
    return true;
  };
  // What the worker's task may have written there, if it was not the worker.
  const std::string culprit = " (a task must not write to descriptor " + std::to_string(ser::control_fd) +
                              ", the worker's control socket)";
  while (s.worker.control) {
    ser::receive_result r;
    try {
      r = ser::try_receive(s.worker.control.get());
    } catch (const std::exception& e) {
      return violation(std::string("malformed control message from worker: ") + e.what() + culprit);
    }
    for (int fd : r.fds) ::close(fd);  // only an assignment carries descriptors, and workers send none
    if (r.closed) {
      s.worker.control.reset();
      return false;
    }
    if (!r.message) return false;
    if (auto* d = std::get_if<ser::done_message>(&*r.message)) {
      if (w.done) return violation("worker sent a second done" + culprit);
      std::string bad;
      if (d->protocol != ser::protocol_version) bad = "protocol version " + std::to_string(d->protocol);
      else if (d->pid != s.worker.process.pid())
        bad = "pid " + std::to_string(d->pid) + " (spawned " + std::to_string(s.worker.process.pid()) + ")";
      else if (d->visible_devices != expected_devices)
        bad = "CUDA_VISIBLE_DEVICES='" + d->visible_devices + "' (assigned '" + expected_devices + "')";
      else if (d->device_order != "PCI_BUS_ID") bad = "CUDA_DEVICE_ORDER='" + d->device_order + "'";
      if (!bad.empty()) return violation("worker handshake mismatch: it reports " + bad);
      w.done = std::move(*d);
      w.done_seen_ns = monotonic_ns();
    } else {
      return violation("worker sent a message only the supervisor may send");
    }
  }
  return false;
}

// Watches the worker until it is gone: echoes and keeps the tail of its stderr, enforces the
// timeout, carries out cancels (and the caller's `interrupted`, as cancels), then reaps it and
// collects its messages.
watch_record watch(job::state& s, const job::interruption& interrupted) {
  watch_record w;
  line_tail tail(s.spec.stderr_tail_lines);
  launched_worker& worker = s.worker;
  stop_escalation stopping(stop_plan::graceful(s.spec.grace, s.spec.stop_signal));
  constexpr auto never = clock::time_point::max();
  clock::time_point deadline = s.spec.timeout.count() > 0 ? worker.started + s.spec.timeout : never;

  detail::capped_echo echo(s.spec.stderr_echo_fd, s.spec.stderr_echo_limit);
  auto read_stderr = [&] { return detail::drain(worker.stderr_read.get(), &tail, echo); };

  bool stderr_open = true;
  bool await_done = s.spec.early_result;
  // Asked on time, not only when poll comes back empty: a worker that keeps its stderr busy
  // keeps poll from ever timing out, and a signal that lands outside poll interrupts nothing.
  clock::time_point next_ask = interrupted ? clock::now() + job::interruption_interval : never;
  for (;;) {
    // The control socket is read while the worker lives: the task runs in the worker's process
    // and can write to it too. Left unread, what it wrote would fill the buffer the worker's
    // own `done` needs, and a violation would wait for an exit that may never come.
    pollfd fds[5] = {{worker.process.pidfd(), POLLIN, 0},
                     {stderr_open ? worker.stderr_read.get() : -1, POLLIN, 0},
                     {s.cancel_event.get(), POLLIN, 0},
                     {worker.control ? worker.control.get() : -1, POLLIN, 0},
                     {s.segments.stream_event && !w.stream ? s.segments.stream_event.get() : -1, POLLIN, 0}};
    int timeout_ms = -1;
    if (const auto wake = std::min(deadline, next_ask); wake != never) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(wake - clock::now()).count();
      timeout_ms = static_cast<int>(std::clamp<long long>(left + 1, 0, INT_MAX));
    }
    int rc = ::poll(fds, 5, timeout_ms);
    if (rc < 0 && errno != EINTR) break;
    if (interrupted && (rc < 0 || clock::now() >= next_ask)) {
      next_ask = clock::now() + job::interruption_interval;
      if (interrupted()) s.request_cancel();
    }
    if (fds[2].revents & POLLIN) {
      std::uint64_t requests = 1;  // the eventfd counts cancels that arrived since the last read
      [[maybe_unused]] auto n = ::read(s.cancel_event.get(), &requests, sizeof requests);
      w.force(outcome_kind::cancelled, "cancelled by the caller");
      if (const int sig = s.cancel_signal.load(); sig && !stopping.started())
        stopping = stop_escalation(stop_plan::graceful(s.spec.grace, sig));
      // Each cancel takes the next step of the stop: a second one does not wait for the grace.
      for (std::uint64_t i = 0; i < std::min<std::uint64_t>(requests, 2); ++i) deadline = stopping.advance(worker.process);
    }
    if (fds[1].revents) stderr_open = read_stderr();
    if (fds[4].revents & POLLIN) {  // the worker starts streaming its result: receive it alongside
      std::uint64_t starts = 0;
      [[maybe_unused]] auto n = ::read(s.segments.stream_event.get(), &starts, sizeof starts);
      try {
        w.stream = std::make_unique<ser::stream_reader>(s.segments.ring, s.spec.max_result);
      } catch (const std::exception& e) {  // a bad size, or no memory for it: the result is lost
        w.force(outcome_kind::invalid_result, std::string("worker result rejected: ") + e.what());
        if (!stopping.started()) deadline = stopping.advance(worker.process);
      }
    }
    if (deadline != never && clock::now() >= deadline) {
      if (!stopping.started())
        w.force(outcome_kind::timeout, "timed out after " + format_duration(s.spec.timeout) + "; stopped");
      deadline = stopping.advance(worker.process);
    }
    if (fds[3].revents) {  // before the exit: `done` came first, even if both are ready now
      // A violation stops the worker at once: nothing it does afterwards can count.
      if (read_control(s, w)) worker.process.signal(SIGKILL);
      if (await_done && w.done) {
        await_done = false;
        // Sealed, the result can no longer change, whoever still runs: hand it over now. A
        // result sent in `done`, or streamed, needs no seal: its payload is in this process's
        // memory (a streamed one's header is copied now). A failure, or a seal refused because something still maps it
        // writable, waits for the exit.
        if (w.done->status == ser::task_status::ok && !w.forced) {
          if (w.done->inline_result.empty()) w.streamed = streamed_header(*s.segments.result);
          if (!w.done->inline_result.empty() || w.streamed || s.segments.result->seal()) {
            w.early = true;
            break;
          }
        }
      }
    }
    if (fds[0].revents & POLLIN) break;
  }

  // The worker reported or is gone: no more of a stream will come (what it published is
  // still copied).
  if (w.stream) w.stream->stop_waiting();
  if (!w.early) {
    read_control(s, w);
    if (s.host_cap) w.host = s.host_cap->read();  // before the reap removes the cgroup
    w.exited = worker.process.reap();  // also kills what is left of the group and the cgroup
    w.reaped_ns = monotonic_ns();
    w.memory_peak = worker.process.memory_peak().value_or(w.host.peak.value_or(worker.process.max_rss()));
  }
  if (stderr_open) read_stderr();
  w.wall = clock::now() - worker.started;
  w.stderr_tail = tail.lines();
  return w;
}

// What a job holds of its worker once the worker is reaped goes. Only then do its segments go
// back to the pool: a worker still exiting maps its request (read-only, yet a shared mapping of a
// file it could write, which the kernel counts as a writer) and holds its descriptor; handed to
// the next call as its result segment, that segment could not be sealed, and the early hand-over
// would silently wait for the exit; a task could even write into it.
void release_worker(job::state& s) {
  s.segments.request.reset();
  s.segments.result.reset();  // (kept by the result where it lies there) a worker still exiting could write it
  s.segments.ring.reset();  // a worker still exiting could have written to it
  s.worker.control.reset();
  s.worker.stderr_read.reset();
  s.host_cap.reset();
  s.spec.admitted.reset();  // its GPU memory and its core are free: the next call may start
}

// After an early hand-over the worker has reported and let go of its result, and now exits; its
// call has returned. One thread for the whole process sees such workers to their end: each gets
// its grace period to exit (a CUDA context's teardown), a cancel or the end of the grace kills its
// group (at once: its call is over), and it is reaped once it is gone. One long-lived thread
// rather than one per call: starting a thread would sit on the call's path, before its return.
//
// Nor is that thread woken on the call's path. It sleeps on an epoll set, which the call adds its
// worker's pidfd and cancel eventfd to without waking it, and on a timer for the earliest grace;
// it wakes when a worker exits, a cancel comes or a grace ends. (Waking a sleeping thread costs
// the waker the wake-up of the CPU that thread sleeps on: on an idle virtual CPU, about as long
// as everything else the caller does after `done`.) The call tells its worker it may go itself:
// the worker usually sleeps on the CPU the caller runs on (it woke the caller there), and a Unix
// socket's wake-up stays there, so the worker runs its exit once the caller's thread lets go of
// that CPU, or the kernel moves it.
class exit_reaper {
 public:
  static exit_reaper& instance() {
    static auto* r = new exit_reaper;  // never destroyed: calls may end while the process exits
    return *r;
  }

  void adopt(const std::shared_ptr<job::state>& s) {
    s->worker.stderr_read.reset();  // nothing more of it is reported
    const auto now = clock::now();
    // (A grace too long for the clock is no end.)
    const auto end_of_grace = s->spec.grace < std::chrono::duration_cast<std::chrono::milliseconds>(
                                                  clock::time_point::max() - now)
                                  ? now + s->spec.grace
                                  : clock::time_point::max();
    std::lock_guard lock(mutex_);
    exiting_.reserve(exiting_.size() + 1);  // (so that nothing throws once its descriptors are watched)
    exiting e{s, end_of_grace};
    e.watched = watch(e);
    if (const auto look = e.watched ? end_of_grace : now + retry; look < alarm_) alarm_at(look);
    exiting_.push_back(std::move(e));
    // Last, under the lock: the reaper cannot let go of the worker before it is told.
    if (s->worker.control) [[maybe_unused]]
      auto sent = ::send(s->worker.control.get(), &ser::let_go, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
  }

 private:
  // How soon a worker whose descriptors could not be watched (no memory for them) is looked at
  // again: nothing else would wake the reaper for it.
  static constexpr auto retry = std::chrono::milliseconds(10);

  struct exiting {
    std::shared_ptr<job::state> state;
    clock::time_point end_of_grace;
    bool watched = false;  // its pidfd (and, until it is killed, its cancel eventfd) in the epoll set
    bool killed = false;   // killed at a cancel or at the end of its grace, and not gone yet
  };

  exit_reaper()
      : watched_{::epoll_create1(EPOLL_CLOEXEC)},
        alarm_fd_{::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK)} {
    static_assert(std::is_same_v<clock, std::chrono::steady_clock>, "the alarm is set on CLOCK_MONOTONIC");
    if (!watched_ || !alarm_fd_ || !watch(alarm_fd_.get()))
      throw internal_error(std::string("epoll/timerfd: ") + std::strerror(errno));
    std::thread([this] { run(); }).detach();
  }

  bool watch(int fd) noexcept {
    epoll_event e{.events = EPOLLIN, .data = {.fd = fd}};
    return ::epoll_ctl(watched_.get(), EPOLL_CTL_ADD, fd, &e) == 0;
  }
  bool watch(const exiting& e) noexcept {
    const int pidfd = e.state->worker.process.pidfd();
    if (!watch(pidfd)) return false;
    if (e.killed || watch(e.state->cancel_event.get())) return true;
    unwatch(pidfd);
    return false;
  }
  // Before the descriptor closes: a registration lives as long as the open file, which a copy of
  // the descriptor (a pool's pidfd) can keep open.
  void unwatch(int fd) noexcept { ::epoll_ctl(watched_.get(), EPOLL_CTL_DEL, fd, nullptr); }

  // (Under the lock.) A grace ends seconds from now, beyond the next tick: arming it touches no
  // hardware timer, unlike an alarm due within a tick.
  void alarm_at(clock::time_point when) noexcept {
    alarm_ = when;
    const auto ns = std::max<std::int64_t>(
        1, std::chrono::duration_cast<std::chrono::nanoseconds>(when.time_since_epoch()).count());
    itimerspec at{};
    at.it_value = {static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
    ::timerfd_settime(alarm_fd_.get(), TFD_TIMER_ABSTIME, &at, nullptr);
  }

  // (Under the lock.) Whether the worker is gone; otherwise kills it at a cancel or at the end of
  // its grace, and says by `next` when to look at it again. A killed worker stays until its
  // pidfd says it is gone, so that reaping it never waits (SIGKILL does not end a process in an
  // uninterruptible sleep, a driver's teardown).
  bool gone(exiting& e, clock::time_point now, clock::time_point& next) noexcept {
    job::state& s = *e.state;
    const int pidfd = s.worker.process.pidfd(), cancel = s.cancel_event.get();
    pollfd p[2] = {{pidfd, POLLIN, 0}, {e.killed ? -1 : cancel, POLLIN, 0}};
    const int ready = ::poll(p, 2, 0);
    if (ready > 0 && (p[0].revents & POLLIN)) {
      if (e.watched) {
        unwatch(pidfd);
        if (!e.killed) unwatch(cancel);
      }
      return true;
    }
    if (!e.killed && ((ready > 0 && (p[1].revents & POLLIN)) || now >= e.end_of_grace)) {
      s.worker.process.signal(SIGKILL);
      e.killed = true;
      if (e.watched) unwatch(cancel);  // (never read: it would stay ready)
    }
    if (!e.watched) e.watched = watch(e);
    if (!e.watched || ready < 0) next = std::min(next, now + retry);
    else if (!e.killed) next = std::min(next, e.end_of_grace);
    return false;
  }

  void run() {
    std::vector<std::shared_ptr<job::state>> done;
    for (;;) {
      {
        std::lock_guard lock(mutex_);
        const auto now = clock::now();
        auto next = clock::time_point::max();
        std::erase_if(exiting_, [&](exiting& e) {
          if (!gone(e, now, next)) return false;
          done.push_back(std::move(e.state));
          return true;
        });
        // An alarm is left armed once its workers are gone (it rings for nothing): a call then
        // seldom has to arm it.
        if (alarm_ <= now) alarm_ = clock::time_point::max();
        if (next < alarm_) alarm_at(next);
      }
      for (auto& s : done) {  // outside the lock; each is gone: the reap does not wait
        s->worker.process.reap();
        release_worker(*s);
      }
      done.clear();
      epoll_event ready[16];
      if (::epoll_wait(watched_.get(), ready, 16, -1) > 0) {
        std::uint64_t rang;
        [[maybe_unused]] auto n = ::read(alarm_fd_.get(), &rang, sizeof rang);
      }
    }
  }

  std::mutex mutex_;
  std::vector<exiting> exiting_;
  unique_fd watched_;
  unique_fd alarm_fd_;
  clock::time_point alarm_ = clock::time_point::max();  // when the alarm rings (max: not armed)
};

// How the job ended, from what watching recorded: forced ends first (cancel, timeout, protocol
// violation), then the worker's own report, validated; no report means it crashed.
job_result classify(watch_record w, const job_spec& spec, const std::shared_ptr<ser::pooled_segment>& result_segment,
                    const call_trace& trace) {
  job_result r;
  r.trace = trace;
  r.trace.done_seen_ns = w.done_seen_ns;
  if (w.done) {
    r.trace.worker_assigned_ns = w.done->assigned_ns;
    r.trace.worker_request_ns = w.done->request_ns;
    r.trace.worker_sent_ns = w.done->sent_ns;
  }
  outcome& o = r.status;
  o.exit = w.exited;
  o.exit_pending = w.early;
  o.wall = std::chrono::duration_cast<std::chrono::nanoseconds>(w.wall);
  o.timeout = spec.timeout;
  o.device = spec.gpus.empty() ? "cpu" : visible_devices_for(spec.gpus);
  o.stderr_tail = std::move(w.stderr_tail);
  o.host_memory_peak = w.memory_peak;
  if (w.done) {
    o.peak_allocated = w.done->peak_allocated;
    o.peak_reserved = w.done->peak_reserved;
    o.run = std::chrono::nanoseconds(w.done->run_ns);
    r.encode_begin_ns = static_cast<std::int64_t>(w.done->encode_begin_ns);
    r.encode_ns = w.done->encode_ns;
  }
  r.reaped_ns = w.reaped_ns;

  if (w.forced) {
    o.kind = w.forced->first;
    o.message = std::move(w.forced->second);
  } else if (w.done && w.done->status == ser::task_status::ok) {
    try {
      const bool sent_inline = !w.done->inline_result.empty();
      if (!sent_inline && !w.streamed) w.streamed = streamed_header(*result_segment);
      ser::encoding enc{};
      if (sent_inline) {
        const std::string& bytes = w.done->inline_result;
        auto copy = ser::aligned_copy(bytes);
        r.payload = ser::open_payload(copy.get(), bytes.size(), ser::result_magic, spec.max_result, enc);
        r.owner = std::move(copy);
        r.sent_inline = true;
      } else if (w.streamed) {  // the payload came through the ring
        const ser::segment_header h = ser::read_header(reinterpret_cast<const std::byte*>(&*w.streamed),
                                                       sizeof(ser::segment_header), ser::streamed_result_magic,
                                                       spec.max_result);
        if (!w.stream) throw ser::wire_error("it says its result was streamed, but no stream began");
        auto got = w.stream->finish();
        if (h.payload_size != got.payload.size() || h.checksum != got.checksum)
          throw ser::wire_error("the streamed result differs from what its header says (size or checksum)");
        enc = static_cast<ser::encoding>(h.encoding);
        r.payload = got.payload;
        r.owner = std::move(got.owner);
      } else {
        r.payload = result_segment->payload(ser::result_magic, spec.max_result, enc);
        r.owner = result_segment;
      }
      if (enc != spec.encoding) throw ser::wire_error("result has a different encoding than requested");
      r.encoding = enc;
      r.received_ns = monotonic_ns();
      result_sizes::instance().record(spec.task, r.payload.size());
      o.kind = outcome_kind::success;
    } catch (const std::exception& e) {
      r.payload = {};
      r.owner.reset();
      o.kind = outcome_kind::invalid_result;
      o.message = std::string("worker result rejected: ") + e.what();
    }
  } else if (w.done && w.done->status == ser::task_status::result_too_large) {
    o.kind = outcome_kind::invalid_result;
    o.message = "worker result rejected: " + valid_utf8(w.done->message);
  } else if (w.done) {
    o.kind = w.done->status == ser::task_status::out_of_memory ? outcome_kind::out_of_memory : outcome_kind::task_error;
    o.error_type = valid_utf8(w.done->error_type);  // the task's own text: any bytes
    o.message = valid_utf8(w.done->message);
  } else {
    o.kind = outcome_kind::crashed;
    o.message = w.exited.signal ? "worker " + describe(w.exited)
                                : "worker " + describe(w.exited) + " without delivering a result";
  }
  host_memory_cap::classify(o, w.host, spec.host_mem_limit, "worker");
  return r;
}

local_launcher& local() {
  static local_launcher l;
  return l;
}

}  // namespace

job::job(std::shared_ptr<state> s) : state_{std::move(s)} {}

job::~job() {
  if (!state_) return;
  if (!state_->finished) {
    cancel();
    wait();
  }
  // After an early hand-over the exit reaper keeps the state until the worker is reaped; the
  // result's memory goes back now (values decoded from it hold their own reference).
  std::lock_guard lock(state_->wait_mutex);
  state_->result.payload = {};
  state_->result.owner.reset();
}

pid_t job::pid() const noexcept { return state_->pid; }

void job::cancel(int first_signal) noexcept {
  if (first_signal) {
    int none = 0;
    state_->cancel_signal.compare_exchange_strong(none, first_signal);
  }
  state_->request_cancel();
}

job_spec job_spec_for(std::string task, serialization::encoding encoding, blob args, std::vector<gpu_info> gpus,
                      const isolated_options& opts) {
  job_spec spec;
  spec.task = std::move(task);
  spec.encoding = encoding;
  spec.args = std::move(args);
  spec.gpus = std::move(gpus);
  spec.mem_limit = opts.mem_limit;
  spec.host_mem_limit = opts.host_mem_limit;
  spec.timeout = opts.timeout;
  spec.grace = opts.grace;
  spec.alloc_conf = opts.alloc_conf;
  spec.extra_env = opts.env;
  if (opts.cpus_per_call) {
    auto limits = thread_limits(opts.cpus_per_call, opts.env);
    spec.extra_env.insert(spec.extra_env.end(), limits.begin(), limits.end());
  }
  spec.stderr_echo_fd = opts.echo_stderr ? 2 : -1;
  spec.max_result = opts.max_result;
  spec.warm_context = opts.warm_context;
  spec.early_result = opts.early_result;
  return spec;
}

std::vector<std::string> thread_limits(unsigned threads, const std::vector<std::string>& env) {
  static constexpr const char* names[] = {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                                          "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS"};
  std::vector<std::string> out;
  for (const char* name : names) {
    const std::string key = std::string(name) + "=";
    const bool given = std::getenv(name) ||
                       std::any_of(env.begin(), env.end(), [&](const std::string& e) { return e.rfind(key, 0) == 0; });
    if (!given) out.push_back(key + std::to_string(std::max(1u, threads)));
  }
  return out;
}

void check_job_spec(const job_spec& spec) {
  alloc::alloc_config config;
  try {
    config = alloc::alloc_config::parse(spec.alloc_conf);
  } catch (const alloc::config_error& e) {
    throw usage_error(std::string("allocator configuration: ") + e.what());
  }
  if (spec.mem_limit) {
    try {
      alloc::check_cap(spec.mem_limit, config);
    } catch (const alloc::config_error& e) {
      throw usage_error("mem-limit " + format_size(spec.mem_limit) + ": " + e.what());
    }
  }
  for (const auto& g : spec.gpus) check_fits(g, spec.mem_limit);
  if (spec.host_mem_limit) check_host_mem_limit(spec.host_mem_limit);
}

void check_host_mem_limit(std::uint64_t bytes) {
  constexpr std::uint64_t smallest = 16ULL << 20;  // below it an interpreter cannot even start
  if (bytes < smallest)
    throw usage_error("host-mem-limit " + format_size(bytes) + " is below the smallest, " + format_size(smallest) +
                      "; give a larger cap (e.g. 1G)");
  if (const std::string why = host_memory_cap::unavailable(); !why.empty())
    throw usage_error("host-mem-limit cannot be enforced here: " + why);
}

std::shared_ptr<job> job::start(job_spec spec) { return start(std::move(spec), local()); }

std::shared_ptr<job> job::start(job_spec spec, launcher& from) {
  check_job_spec(spec);  // before a worker is launched (or taken from standby) for it
  // The request is ready, and for a worker launched now already in its socket, before the
  // worker starts: it finds its assignment waiting instead of waiting for it (after a launch the
  // caller often runs again only once the new process has started up and blocked).
  const std::int64_t begin = monotonic_ns();
  auto s = prepare_state(spec);
  s->trace.begin_ns = begin;
  bool assigned = false;
  launch_spec how = launch_spec_for(spec);
  // (Not under a host memory cap: the cap is put on the worker before its task is assigned.)
  if (!spec.host_mem_limit)
    how.before_start = [&](int control) {
      assign(control, s->segments, spec);
      s->trace.assigned_ns = monotonic_ns();
      assigned = true;
    };
  launched_worker w = from.launch(how);
  s->trace.launched_ns = monotonic_ns();
  return assign_prepared(std::move(s), std::move(spec), std::move(w), assigned);
}

std::shared_ptr<job> job::start(job_spec spec, launched_worker worker) {
  check_job_spec(spec);  // a launched worker that is not used is stopped when `worker` goes
  const std::int64_t begin = monotonic_ns();
  auto s = prepare_state(spec);
  s->trace.begin_ns = begin;
  s->trace.launched_ns = begin;  // (launched before)
  return assign_prepared(std::move(s), std::move(spec), std::move(worker), false);
}

std::shared_ptr<job::state> job::prepare_state(job_spec& spec) {
  auto s = std::make_shared<state>();
  s->cancel_event.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!s->cancel_event) throw internal_error(std::string("eventfd: ") + std::strerror(errno));
  s->segments = prepare_request(spec);
  s->trace.prepared_ns = monotonic_ns();
  return s;
}

std::shared_ptr<job> job::assign_prepared(std::shared_ptr<state> s, job_spec spec, launched_worker worker, bool assigned) {
  s->worker = std::move(worker);
  s->pid = s->worker.process.pid();
  // The job starts now, not when its worker was launched (a standby one may have waited long):
  // the timeout and the wall time count from here.
  s->worker.started = clock::now();
  if (spec.host_mem_limit) s->host_cap = std::make_unique<host_memory_cap>(s->worker.process, spec.host_mem_limit);
  if (!assigned) {
    s->trace.cpu_handed = assign(s->worker.control.get(), s->segments, spec,
                                 spec.caller_waits && s->worker.waiting ? s->pid : 0);
    s->trace.assigned_ns = monotonic_ns();
  }
  s->spec = std::move(spec);
  return std::shared_ptr<job>(new job(std::move(s)));
}

namespace {

// An early_result job is watched by the first to wait for it, on their own thread (wait_for,
// which must return at its timeout, starts one): for a call that waits at once, the common case,
// no thread is started on its path. It watches to the hand-over (or the worker's end), publishes
// the result, and leaves the exit to the exit reaper.
void watch_early(const std::shared_ptr<job::state>& s, const job::interruption& interrupted) {
  watch_record w = watch(*s, interrupted);
  const bool early = w.early;
  // A CPU call's core is free once its result is handed over (the exit takes little of it): let
  // go of it before the caller hears of the result. A GPU call's memory is not, until its worker
  // is gone.
  if (early && s->spec.gpus.empty()) s->spec.admitted.reset();
  {
    std::lock_guard lock(s->wait_mutex);
    s->result = classify(std::move(w), s->spec, s->segments.result, s->trace);
    s->finished = true;
  }
  s->ready.notify_all();
  if (early) exit_reaper::instance().adopt(s);
  else release_worker(*s);
}

}  // namespace

bool job::wait_for(std::chrono::milliseconds timeout) {
  if (state_->spec.early_result) {
    std::unique_lock lock(state_->wait_mutex);
    if (!state_->finished && !state_->watched) {
      // Not watched yet, and this must return at its timeout: a thread watches.
      state_->watched = true;
      std::thread([s = state_] { watch_early(s, {}); }).detach();
    }
    return state_->ready.wait_for(lock, timeout, [&] { return state_->finished.load(); });
  }
  {
    std::unique_lock lock(state_->wait_mutex, std::try_to_lock);
    if (lock.owns_lock() && state_->finished) return true;
  }
  if (!state_->worker.process.wait_for(timeout) && !state_->finished) return false;
  wait();
  return true;
}

const job_result& job::wait() { return wait(interruption{}); }

const job_result& job::wait(const interruption& interrupted) {
  state& s = *state_;
  if (s.spec.early_result) {
    std::unique_lock lock(s.wait_mutex);
    if (!s.finished && !s.watched) {
      s.watched = true;
      lock.unlock();
      watch_early(state_, interrupted);
      lock.lock();
    }
    s.ready.wait(lock, [&] { return s.finished.load(); });
    return s.result;
  }
  std::lock_guard lock(s.wait_mutex);
  if (s.finished) return s.result;
  s.result = classify(watch(s, interrupted), s.spec, s.segments.result, s.trace);
  release_worker(s);
  s.finished = true;
  return s.result;
}

}  // namespace isorun::runner
