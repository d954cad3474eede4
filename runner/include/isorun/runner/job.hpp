#pragma once
/// @file job.hpp
/// One task in one fresh worker process: spawn, watch, stop, classify. The building block of
/// the C++ API, the CLI and sweeps.

#include <chrono>
#include <csignal>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "isorun/export.hpp"
#include "isorun/runner/gpu_inventory.hpp"
#include "isorun/runner/options.hpp"
#include "isorun/runner/outcome.hpp"
#include "isorun/serialization/blob.hpp"
#include "isorun/serialization/wire.hpp"

namespace isorun::runner {

/// Where a worker's stdout goes.
enum class stdout_mode {
  inherit,    ///< the supervisor's stdout
  to_stderr,  ///< merged into the worker's stderr stream (the CLI keeps stdout for the result)
  file,       ///< `job_spec::stdout_path`, opened (truncated) when the worker is assigned; never
              ///< through a symbolic link, and only a regular file
  fd,         ///< `job_spec::stdout_fd` (a pipe the caller reads, say), duplicated for the worker
              ///< when it is assigned; the caller keeps it open until the job has ended
};

struct job_spec {
  std::string task;  ///< registered task name
  serialization::encoding encoding = serialization::encoding::binary;
  blob args;                             ///< arguments, already encoded
  std::vector<gpu_info> gpus;            ///< visible as CUDA devices 0, 1, ...; empty: CPU only
  std::uint64_t mem_limit = 0;           ///< bytes per device, 0 = none
  std::uint64_t host_mem_limit = 0;      ///< bytes of host memory (isolated_options::host_mem_limit)
  std::chrono::milliseconds timeout{0};  ///< 0 = none
  /// First signal → SIGKILL delay; after an early hand-over, how long the worker may take to exit.
  std::chrono::milliseconds grace{5000};
  /// The first signal of a stop (the timeout, cancel()): SIGTERM; a sweep whose trials keep
  /// checkpoints sends its warning, which gives the task the grace period to save.
  int stop_signal = SIGTERM;
  std::vector<std::string> task_libraries;  ///< shared objects the worker loads
  std::string alloc_conf;                   ///< allocator configuration string
  std::string executable;                   ///< worker program; empty = this program
  /// The worker's arguments after argv[0] (`executable`) when set, e.g. what an interpreter
  /// runs; else "isorun-worker <task>" (launch_spec::argv).
  std::vector<std::string> worker_argv;
  stdout_mode stdout_to = stdout_mode::inherit;
  std::string stdout_path;
  int stdout_fd = -1;      ///< stdout_mode::fd
  int stderr_echo_fd = 2;  ///< live copy of the worker's stderr; -1 = none
  /// Bytes of it copied there at most, then a line saying it was cut (for a file: a sweep's
  /// trial log); 0: no bound.
  std::uint64_t stderr_echo_limit = 0;
  std::size_t stderr_tail_lines = 20;
  std::uint64_t max_result = 0;        ///< larger results are rejected; 0: the machine's physical memory
  std::vector<std::string> extra_env;  ///< "KEY=VALUE" added to the worker's environment
  /// On a GPU: the worker creates its CUDA context and capped allocator as soon as it is
  /// launched, before its assignment (isolated_options::warm_context).
  bool warm_context = false;
  /// Hand the result over as soon as the worker reports it, sealed, while the worker exits
  /// behind it (isolated_options::early_result).
  bool early_result = false;
  /// A CPU call's result small enough to come in the worker's `done` is handed over at once, the
  /// worker exiting behind it; a larger one waits for the exit, its segment pooled unsealed for
  /// the next call (Python's calls, whose output goes straight to this process's fds 1 and 2).
  bool early_small_result = false;
  /// The thread that starts the job waits for it at once: a worker launched ahead is woken on
  /// that thread's CPU (cpu_handoff.hpp). Set by queued_job for a start made in wait().
  bool caller_waits = false;
  /// The task's result is an `isorun::blob` (binary encoding): the worker gets a result ring, so
  /// a result made on the device can be streamed (worker_context::device_result).
  bool result_stream = false;
  /// When set, the worker writes its task's memory timeline to this file as JSON (its
  /// allocators' history, which `alloc_conf` must turn on with history:N, and after an OOM the
  /// allocations live at the failure): what `isorun report` and --memory-timeline draw.
  std::string memory_timeline;
  /// What the call holds while its worker lives (an admission ticket, admission.hpp): let go
  /// once the worker is gone, for the next calls to be admitted.
  std::shared_ptr<const void> admitted;
};

/// Where a call's time went, by CLOCK_MONOTONIC timestamps taken in both processes (the clock
/// is system-wide); 0 where a step was not reached. What `bench_calls --breakdown` prints.
struct call_trace {
  std::int64_t begin_ns = 0;            ///< job::start entered
  std::int64_t prepared_ns = 0;         ///< the request written, the result segment ready
  std::int64_t launched_ns = 0;         ///< a worker launched, or taken from standby
  std::int64_t assigned_ns = 0;         ///< its assignment sent (before its start, for a launch)
  std::int64_t worker_assigned_ns = 0;  ///< the worker had its assignment
  std::int64_t worker_request_ns = 0;   ///< the worker had mapped its request
  std::int64_t worker_sent_ns = 0;      ///< the worker sent done
  std::int64_t done_seen_ns = 0;        ///< the supervisor read done
  bool cpu_handed = false;              ///< the worker was woken on the caller's CPU (job_spec::caller_waits)
};

/// A finished job: its outcome and, on success, the validated result payload.
struct job_result {
  outcome status;
  serialization::encoding encoding = serialization::encoding::binary;
  std::span<const std::byte> payload;  ///< valid while `owner` lives
  std::shared_ptr<const void> owner;   ///< keeps the result segment mapped (or a small result's copy)
  bool sent_inline = false;            ///< the result came in the worker's `done`, not through shared memory
  std::int64_t received_ns = 0;        ///< CLOCK_MONOTONIC when the payload was validated
  std::int64_t encode_begin_ns = 0;    ///< CLOCK_MONOTONIC when the worker began encoding
  std::uint64_t encode_ns = 0;         ///< time the worker spent encoding into shared memory
  std::int64_t reaped_ns = 0;          ///< CLOCK_MONOTONIC when the worker was reaped; 0 after an early hand-over
  call_trace trace;
};

/// @brief The job_spec for `task` with `args` (encoded as `encoding`) on `gpus` (none: the
///        CPU; placed by place_job) under `opts`: the one place options become a spec. The
///        caller adds what only it knows (task libraries, where output goes).
ISORUN_API job_spec job_spec_for(std::string task, serialization::encoding encoding, blob args,
                                 std::vector<gpu_info> gpus, const isolated_options& opts);

/// @brief The thread-count variables (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, MKL_NUM_THREADS,
///        VECLIB_MAXIMUM_THREADS, NUMEXPR_NUM_THREADS) set to `threads`, but for those `env` or
///        this process's environment already sets: a user's own value is kept, as loky and Ray do,
///        and where the user set only some, the others get the user's value too.
ISORUN_API std::vector<std::string> thread_limits(unsigned threads, const std::vector<std::string>& env);

/// @brief Checks that a host memory cap of `bytes` can work here: at least 16 MiB, and a cgroup
///        with the memory controller to enforce it. @throws usage_error saying why not.
ISORUN_API void check_host_mem_limit(std::uint64_t bytes);

/// @brief Checks what `spec` asks for before anything starts: the allocator configuration
///        parses, the cap can hold the allocator's smallest segment, the cap fits each GPU.
/// @throws usage_error saying what is wrong and what to change.
ISORUN_API void check_job_spec(const job_spec& spec);

struct launched_worker;  // launcher.hpp
class launcher;          // launcher.hpp

class ISORUN_API job {
 public:
  /// @brief Checks `spec` (check_job_spec), then launches a fresh worker and assigns it the
  ///        task. Returns once the process exists.
  /// @throws usage_error for an impossible spec (nothing is started); internal_error if shared
  ///         memory or the process cannot be created.
  static std::shared_ptr<job> start(job_spec spec);

  /// @brief Like start(), with the worker from `from` (a standby pool hands over one already
  ///        waiting). The spec is checked before a worker is asked for.
  static std::shared_ptr<job> start(job_spec spec, launcher& from);

  /// @brief Like start(), on a worker launched earlier that is waiting for its assignment (a
  ///        standby worker, or one another launcher started). `spec.executable`, `extra_env`
  ///        and stdout_mode::to_stderr were the launcher's business and are not looked at; a
  ///        stdout file is opened now and handed to the worker with its assignment.
  /// @throws usage_error for an impossible spec (the worker is stopped); internal_error.
  static std::shared_ptr<job> start(job_spec spec, launched_worker worker);

  /// Stops a job that has not ended (cancel()) and leaves it to the watcher to see to its end.
  ~job();
  job(const job&) = delete;
  job& operator=(const job&) = delete;

  /// @brief Blocks until the worker is gone (enforcing the timeout) and classifies its end;
  ///        with `early_result`, until its result is sealed and validated or it is gone,
  ///        whichever comes first. The first wait of a job no one watches yet watches it on its
  ///        own thread; later ones, and any wait of a job the process's watcher watches, wait for
  ///        that watch to end. Safe to call again, and from several threads; all get the same
  ///        result.
  const job_result& wait();

  /// What a wait that watches the job itself asks, for a caller whose signal handlers only set a
  /// flag (Python's Ctrl-C): `ask` is asked as the wait begins, and again each time `fd` turns
  /// readable or a signal interrupts the wait on its thread; `ask` drains `fd`. Each true stops
  /// the job as cancel() does (each, the next step of the stop) and the wait goes on to the job's
  /// end. Nothing is asked on a clock: waiting costs nothing.
  struct interruption {
    int fd = -1;
    std::function<bool()> ask;
    explicit operator bool() const noexcept { return static_cast<bool>(ask); }
  };

  /// @brief Like wait(), asking `interrupted` while it waits.
  const job_result& wait(const interruption& interrupted);

  /// @brief Hands the job to the process's watcher, unless a wait watches it already: from now
  ///        on one thread for the whole process pumps its stderr, enforces its timeout and
  ///        carries out its cancels, with every other such job's. `on_end` runs on that thread
  ///        once the watch is over (before any wait() returns); it must not block. What a job
  ///        that no thread waits for next (a future) is watched through.
  void watch_elsewhere(std::function<void()> on_end = {});

  /// @brief Waits up to `timeout` (handing the job to the watcher first, unless a wait watches
  ///        it). @return true once wait() returns at once.
  bool wait_for(std::chrono::milliseconds timeout);

  /// @brief Whether the watch is over: wait() then returns without waiting.
  [[nodiscard]] bool ended() const noexcept;

  /// @brief A descriptor that turns readable once the watch is over, for a caller that waits for
  ///        several things at once. Made on first use; it lives as long as the job.
  int end_fd();

  /// @brief Asks for the worker to be stopped (`first_signal`, 0: the spec's stop_signal; then
  ///        SIGKILL after the grace period); a second call sends SIGKILL at once. After an
  ///        early hand-over (the call is over, its worker exiting), SIGKILL at once. Thread-safe
  ///        and async-signal-safe; returns at once.
  void cancel(int first_signal = 0) noexcept;

  /// @brief The worker's pid (also its process group id), for as long as the job lives, also
  ///        once the worker has exited and been reaped. The number may then name another
  ///        process: stop the worker with cancel(), never by signalling this pid.
  [[nodiscard]] pid_t pid() const noexcept;

  struct state;

 private:
  explicit job(std::shared_ptr<state> s);
  // Every start() after its check: the job's state with its request prepared (spec.args are
  // moved into it), then that request assigned to `worker` (unless `assigned` already, through
  // the launch).
  static std::shared_ptr<state> prepare_state(job_spec& spec);
  static std::shared_ptr<job> assign_prepared(std::shared_ptr<state> s, job_spec spec, launched_worker worker,
                                              bool assigned);
  void watch_here(const interruption& interrupted);
  void wait_elsewhere(const interruption& interrupted);
  std::shared_ptr<state> state_;  // shared with the watcher while it watches the worker
};

}  // namespace isorun::runner
