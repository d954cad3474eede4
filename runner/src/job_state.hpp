#pragma once
// What a job is between its start and its end, shared by the thread that may watch it (a call
// waited for at once), the process's watcher (every other call, and every worker after an early
// hand-over) and the job's API: its request and segments, its worker, what watching it recorded.

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "isorun/runner/host_memory.hpp"
#include "isorun/runner/job.hpp"
#include "isorun/runner/launcher.hpp"
#include "isorun/runner/process.hpp"
#include "isorun/runner/stream_tail.hpp"
#include "isorun/runner/unique_fd.hpp"
#include "isorun/serialization/control.hpp"
#include "isorun/serialization/result_stream.hpp"
#include "isorun/serialization/segment_pool.hpp"
#include "isorun/serialization/wire.hpp"

namespace isorun::runner {

using clock = std::chrono::steady_clock;

// A worker's request and result segments, ready to be handed over, and for a blob result its
// ring (mapped on this side) and the eventfd that announces a stream.
struct prepared_request {
  std::string inline_request;  // the request's bytes, when it is small enough to be carried (control.hpp)
  std::shared_ptr<serialization::pooled_segment> request, result, ring;  // (request: when it is not)
  unique_fd stream_event;
};

// What watching a worker until it is gone (or its result is handed over) records; classify()
// turns it into an outcome.
struct watch_record {
  exit_status exited;
  std::optional<std::pair<outcome_kind, std::string>> forced;  // the first of cancel, timeout, violation
  std::optional<serialization::done_message> done;
  std::vector<std::string> stderr_tail;
  clock::duration wall{};
  std::uint64_t memory_peak = 0;  // the worker's cgroup's memory.peak, else its largest resident set
  host_memory_cap::reading host;  // its host memory cap's cgroup, where it has one
  std::int64_t reaped_ns = 0;     // CLOCK_MONOTONIC when the worker was reaped (not for an early hand-over)
  std::int64_t done_seen_ns = 0;  // CLOCK_MONOTONIC when its done was read
  bool early = false;             // the result was handed over (sealed, or streamed); the worker has not exited yet
  std::unique_ptr<serialization::stream_reader> stream;   // receiving a result the worker streams
  std::optional<serialization::segment_header> streamed;  // a snapshot of a streamed result's header
  // Where the result lies, kept for classify() after the worker's other segments went back.
  std::shared_ptr<serialization::pooled_segment> result_segment;

  void force(outcome_kind k, std::string why) {
    if (!forced) forced.emplace(k, std::move(why));
  }
};

struct job::state {
  job_spec spec;
  prepared_request segments;
  launched_worker worker;
  pid_t pid = -1;  // the worker's, kept once it is reaped (the watcher may reap it at any time)
  unique_fd cancel_event;
  std::atomic<int> cancel_signal{0};          // the first cancel()'s signal, where it named one
  std::atomic<bool> cancel_asked{false};      // cancel() was called (a dropped job then asks no more)
  std::unique_ptr<host_memory_cap> host_cap;  // until the worker is reaped
  call_trace trace;                           // the supervisor's steps until the assignment

  // Who watches the job: set once, by the thread that waits for it first (a call waited for at
  // once) or for the process's watcher (watch_elsewhere).
  std::atomic<bool> claimed{false};

  std::mutex wait_mutex;
  std::condition_variable ready;       // `ended` became true
  std::atomic<bool> ended{false};      // the watch is over: `record` holds what it saw
  std::optional<watch_record> record;  // until classified
  bool classified = false;             // `result` holds the outcome (under wait_mutex)
  job_result result;
  unique_fd end_event;           // made on demand (end_fd()): readable once ended
  std::function<void()> on_end;  // run once the watch is over, by whoever watched

  // A cancel, for the watch's next look: the eventfd counts them (each, the stop's next step).
  void request_cancel() noexcept {
    const std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(cancel_event.get(), &one, sizeof one);
  }
};

// Watching one worker, as a state machine: what a watch holds between its events, so that the
// thread that waits for a call (one poll over its descriptors) and the process's watcher (one
// epoll over every call's) drive the same steps. Nothing here closes a descriptor that is
// watched: whoever drives the watch stops watching a slot when it turns -1, and the descriptors
// go with the worker (release_worker).
class worker_watch {
 public:
  enum slot : std::size_t { exit_slot, stderr_slot, cancel_slot, control_slot, stream_slot, slot_count };
  using events = std::array<short, slot_count>;  // poll revents per slot

  explicit worker_watch(job::state& s);

  // The descriptor to watch in each slot now (for POLLIN), -1 for none.
  [[nodiscard]] int fd(slot k) const noexcept;
  // When step() must run even without an event (the timeout, the stop's next step); max: never.
  [[nodiscard]] clock::time_point due() const noexcept { return deadline_; }
  // Takes in what is ready and what is due now; true once the watch is over: the worker is gone,
  // or its result was handed over early.
  bool step(const events& ready);
  // Watching failed (the watcher's own error): the call ends internal_error saying `why`, and
  // its worker is killed. finish() is next.
  void fail(const std::string& why) noexcept;
  // After step() returned true: what is left to record (its last messages and its exit, reaped,
  // unless its result was handed over early), and the record.
  watch_record finish();

 private:
  bool read_control();

  job::state& s_;
  watch_record w_;
  detail::line_tail tail_;
  detail::capped_echo echo_;  // where its stderr is copied, within job_spec::stderr_echo_limit
  stop_escalation stopping_;
  clock::time_point deadline_;
  bool stderr_open_ = true;
  bool control_open_ = true;
  bool await_done_;
};

// The header of a streamed result (its payload came through the ring), read with pread: a copy
// the worker cannot change afterwards, and no mapping of a segment the pool may have grown
// large. nullopt if the segment holds anything else.
std::optional<serialization::segment_header> streamed_header(const serialization::pooled_segment& segment);

// Watches the job on this thread until it is over (worker_watch driven by poll), asking
// `interrupted` as job::wait documents.
watch_record watch_here(job::state& s, const job::interruption& interrupted);

// Waits until `done()`, told by `fd` turning readable (or by `changed` on `mutex`: without an
// interruption), asking `interrupted` as job::interruption says and calling `cancel` for each
// true. For a wait on what another thread watches.
void wait_until_done(std::mutex& mutex, std::condition_variable& changed, int fd, const std::function<bool()>& done,
                     const job::interruption& interrupted, const std::function<void()>& cancel);

// What a job holds of its worker once the worker is gone: its segments (back to the pool: see
// job.cpp), its descriptors, its host memory cap's cgroup, its admission ticket.
void release_worker(job::state& s);

// The watch is over: `r` becomes the job's record, its waiters are woken and its on_end runs.
void publish_end(job::state& s, watch_record r);

}  // namespace isorun::runner
