// isorun._core, the caller's side: a pickled call and its options become a runner::job whose
// worker is a fresh Python interpreter (exec'd, or forked from a zygote that never touched CUDA),
// and job.wait() hands back the outcome and the validated result payload as a read-only buffer
// over the mapped result segment. The request is the pickled call behind a small frame of
// variables the worker sets before the call runs (framed_request: the cap region of a capped
// call, which a standby interpreter cannot get at exec).
// bounds before the caller sees it; the Python side then parses it bounds-checked.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "isorun/preload/cap_region.hpp"
#include "isorun/runner/admission.hpp"
#include "isorun/runner/driver_cap.hpp"
#include "isorun/runner/errors.hpp"
#include "isorun/runner/executor.hpp"
#include "isorun/runner/isolated.hpp"
#include "isorun/runner/job.hpp"
#include "isorun/runner/launcher.hpp"
#include "isorun/runner/option_table.hpp"
#include "isorun/runner/placement.hpp"
#include "isorun/runner/queued_job.hpp"
#include "isorun/runner/standby.hpp"
#include "isorun/runner/units.hpp"
#include "isorun/serialization/control.hpp"
#include "isorun/serialization/protocol.hpp"
#include "isorun/serialization/segment_pool.hpp"
#include "isorun/serialization/shm_segment.hpp"
#include "isorun/serialization/wire.hpp"
#include "module.hpp"
#include "payload.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using isorun_python::python_task;

namespace {

/// Parses "2G", "512M" or a plain count of bytes (runner::parse_size); UsageError otherwise.
std::uint64_t parse_size(const std::string& text) {
  try {
    return isorun::parse_size(text);
  } catch (const std::exception& e) {
    throw isorun::usage_error(e.what());
  }
}

/// Parses "30s", "10m", "250ms" (runner::parse_duration) into milliseconds.
std::int64_t parse_duration_ms(const std::string& text) {
  try {
    return isorun::parse_duration(text).count();
  } catch (const std::exception& e) {
    throw isorun::usage_error(e.what());
  }
}

/// What the Python layer resolved from the user's options (_options.py): isolated()'s own, as the
/// C++ API has them, and what only a Python call has.
struct call_options : isorun::isolated_options {
  /// Where the worker's output goes when the caller reads it (capture_output, or a sys.stdout
  /// that is not fd 1): its stdout replaced at the assignment, and the live copy of its stderr;
  /// -1: as the runner has them (this process's stdout; stderr to fd 2 when echo_stderr).
  int stdout_fd = -1;
  int stderr_fd = -1;
  /// A small result of a CPU call handed over as it arrives (job_spec::early_small_result).
  bool early_small_result = false;
  /// Workers forked from a zygote (start="zygote"), kept `standby` waiting, not exec'd each.
  bool zygote = false;
  /// Not 0: the pool is adaptive (start="auto"): dormant after this long without a call.
  std::int64_t linger_ms = 0;

  [[nodiscard]] isorun::runner::warm_start warm(std::size_t standby_workers) const {
    return {.standby = standby_workers, .zygote = zygote, .linger = std::chrono::milliseconds(linger_ms)};
  }
};

/// An executor's admission (isorun.Executor), in front of the process's.
struct py_admission {
  std::shared_ptr<isorun::runner::admission> admission;
  std::string plan;
};

/// The cap of one call's worker on the CUDA driver API is runner::driver_cap, as for
/// `isorun --mem-limit -- CMD`: the preloaded cap library (libisorun_cuda_cap.so) of the worker
/// and its descendants charge their device allocations to it, so a framework inside the function
/// (PyTorch, JAX, CuPy) sees the cap as the device's size and gets its own out-of-memory error
/// past it. Its variables reach the worker with the call (the request), not at exec: a standby
/// interpreter is launched before its call, and the library takes them at its first allocation.
using isorun::runner::driver_cap;

/// LD_PRELOAD with the cap library first: part of how a capped worker is launched.
std::string cap_preload_variable() {
  std::string preload = driver_cap::library();
  if (const char* other = std::getenv("LD_PRELOAD"); other && *other) preload += std::string(":") + other;
  return "LD_PRELOAD=" + preload;
}

/// Whether the interpreter is finalizing: a thread that takes the GIL then is ended by Python.
bool is_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

/// Calls whose futures wait for their end: the watcher (runner/src/watcher.hpp) pushes a call's
/// token as the call ends, on its own thread and without the GIL; one Python thread takes them
/// and completes the futures (isorun._api). Calls in flight cost no thread of their own.
class completions {
 public:
  static completions& instance() {
    static auto* c = new completions;  // never destroyed: calls may end while the interpreter exits
    return *c;
  }
  void push(std::uint64_t token) {
    {
      std::lock_guard lock(mutex_);
      ended_.push_back(token);
    }
    changed_.notify_one();
  }
  /// The tokens of the calls ended since the last take, once there is one; None once closed
  /// with none left. With the GIL released while it waits.
  std::optional<std::vector<std::uint64_t>> take() {
    nb::gil_scoped_release unlocked;
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return !ended_.empty() || closed_; });
    if (ended_.empty()) return std::nullopt;
    return std::exchange(ended_, {});
  }
  /// take() returns None once the tokens left are taken.
  void close() {
    {
      std::lock_guard lock(mutex_);
      closed_ = true;
    }
    changed_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<std::uint64_t> ended_;
  bool closed_ = false;
};

/// How a wait on the main thread hears of Ctrl-C (and any signal with a Python handler) without
/// looking on a clock: Python's C signal handler writes the signal's number to the wakeup
/// descriptor (signal.set_wakeup_fd), from whichever thread the signal lands on, and a signal
/// that lands on the waiting thread interrupts its poll (EINTR). While the wait
/// lasts that descriptor is this pipe's; what was set before (asyncio's) is set back after, and
/// gets the bytes that came meanwhile.
class signal_wakeup {
 public:
  /// With the GIL, on the main thread.
  signal_wakeup() {
    static const std::array<int, 2> pipe = [] {
      std::array<int, 2> fds{-1, -1};
      if (::pipe2(fds.data(), O_NONBLOCK | O_CLOEXEC) != 0) fds = {-1, -1};
      return fds;
    }();
    if (pipe[0] < 0) return;
    try {
      before_ = nb::cast<int>(set_wakeup_fd()(pipe[1]));
      read_ = pipe[0];
    } catch (nb::python_error&) {  // (not the main thread after all): no wake-up, EINTR alone
    }
  }
  /// With the GIL.
  ~signal_wakeup() {
    if (read_ < 0) return;
    drain();
    try {
      // A caller that set one (asyncio) asked for no warning on a full pipe.
      if (before_ < 0) set_wakeup_fd()(-1);
      else set_wakeup_fd()(before_, "warn_on_full_buffer"_a = false);
    } catch (nb::python_error&) {
    }
  }
  signal_wakeup(const signal_wakeup&) = delete;
  signal_wakeup& operator=(const signal_wakeup&) = delete;
  [[nodiscard]] int fd() const noexcept { return read_; }
  /// Empties the pipe, handing its bytes on to the descriptor set before.
  void drain() noexcept {
    char bytes[64];
    for (ssize_t n; (n = ::read(read_, bytes, sizeof bytes)) > 0;) {
      // A full pipe of the handler set before loses these bytes, as it would have lost them anyway.
      if (before_ >= 0 && ::write(before_, bytes, static_cast<std::size_t>(n)) < 0) continue;
    }
  }

 private:
  // signal.set_wakeup_fd (the C function behind it is not exported), kept for the process.
  static nb::handle set_wakeup_fd() {
    static auto* f = new nb::object(nb::module_::import_("signal").attr("set_wakeup_fd"));
    return *f;
  }

  int read_ = -1;
  int before_ = -1;
};

/// Whether this thread is the interpreter's main thread: the one Python runs signal handlers on.
bool on_main_thread() {
  static const unsigned long main_ident = nb::cast<unsigned long>(
      nb::module_::import_("threading").attr("main_thread")().attr("ident"));
  return PyThread_get_thread_ident() == main_ident;
}

/// One isolated call in flight: a runner::queued_job (waiting for admission, then its job). A
/// plain call (`caller_waits`: started and waited for on the same thread) is watched on that
/// thread, without a second thread to wake on the way; any other (a future's) is handed to the
/// process's watcher, which pushes `token` to the completions when it ends.
class py_job {
 public:
  py_job(std::shared_ptr<isorun::runner::queued_job> call, std::shared_ptr<driver_cap> cap, bool caller_waits,
         std::uint64_t token)
      : job_{std::move(call)}, cap_{std::move(cap)} {
    // Admitted at once: started here, its pid known on return. Its worker is not handed this
    // thread's CPU (job_spec::caller_waits), though this thread waits next: a standby interpreter
    // taken while it still imports its preloads would finish them on this one CPU. Measured on 2
    // cores (bench/README.md): spaced calls the same either way, back to back half as many calls
    // found an interpreter ready with the hand-over.
    if (caller_waits) job_->start_if_admitted(false);
    else job_->watch_elsewhere([token] { completions::instance().push(token); }, true);
  }
  py_job(py_job&&) noexcept = default;
  py_job& operator=(py_job&&) noexcept = default;
  py_job(const py_job&) = delete;
  py_job& operator=(const py_job&) = delete;
  // (Dropped before its end, the call is stopped: nothing runs on that no one waits for.)
  ~py_job() = default;

  /// Waits up to `timeout_s` seconds (None: until done), with the GIL released. Returns whether
  /// it is done. On the main thread a signal handler that raises (Ctrl-C's KeyboardInterrupt)
  /// stops the worker, and the wait goes on until it is gone before the exception goes on, so
  /// nothing is left running; a second one takes the stop's next step.
  bool wait(std::optional<double> timeout_s) {
    if (timeout_s) {
      nb::gil_scoped_release unlocked;
      return job_->wait_for(
          std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::duration<double>(*timeout_s)));
    }
    if (job_->done()) return true;
    if (!on_main_thread()) {  // no signal handler runs here: nothing to ask
      nb::gil_scoped_release unlocked;
      wait_quietly();
      return true;
    }
    std::optional<nb::python_error> interrupted;
    {
      signal_wakeup wakeup;
      nb::gil_scoped_release unlocked;
      const isorun::runner::job::interruption ask{wakeup.fd(), [&] {
                                                    wakeup.drain();
                                                    if (is_finalizing()) return false;  // the GIL would end this thread
                                                    nb::gil_scoped_acquire locked;
                                                    return signal_raised(interrupted);
                                                  }};
      wait_quietly(ask);
    }
    if (interrupted) throw std::move(*interrupted);
    return true;
  }

  /// The finished call: its outcome as a dict and, on success, the payload as a read-only
  /// uint8 array over the mapped result segment (the segment stays mapped while it lives).
  nb::tuple result() {
    wait(std::nullopt);
    const isorun::runner::job_result* r;
    {
      nb::gil_scoped_release unlocked;
      r = &job_->wait();  // done: its result, or a start that failed rethrown (UsageError, InternalError)
    }
    const isorun::outcome& o = r->status;
    // The task's own text, decoded so that no byte can fail the call (backslashreplace: a byte
    // that is not UTF-8 shows as \xNN), whatever reached the outcome.
    auto text = [](const std::string& s) {
      return nb::steal(PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "backslashreplace"));
    };
    nb::list tail;
    for (const auto& line : o.stderr_tail) tail.append(text(line));
    nb::dict d;
    d["kind"] = std::string(isorun::to_string(o.kind));
    d["error_type"] = text(o.error_type);
    d["message"] = text(o.message);
    d["exit_code"] = o.exit.code;
    d["signal"] = o.exit.signal;
    d["core_dumped"] = o.exit.core_dumped;
    d["stderr_tail"] = tail;
    d["timeout_s"] = static_cast<double>(o.timeout.count()) / 1e3;
    d["peak_allocated"] = o.peak_allocated;
    d["peak_reserved"] = o.peak_reserved;
    d["host_memory_peak"] = o.host_memory_peak;
    d["wall_s"] = static_cast<double>(o.wall.count()) / 1e9;
    d["run_s"] = static_cast<double>(o.run.count()) / 1e9;
    d["exit_pending"] = o.exit_pending;
    d["device"] = o.device;
    d["pid"] = job_->pid();
    if (cap_) {
      nb::dict c;
      c["limit"] = cap_->limit();
      c["refusals"] = cap_->refusals();
      c["largest_refused"] = cap_->largest_refused();
      c["peak"] = cap_->peak();
      d["driver_cap"] = c;
    } else {
      d["driver_cap"] = nb::none();
    }
    if (!o.ok() || r->payload.empty()) return nb::make_tuple(d, nb::none());
    // The owner (the segment's mapping) travels in a capsule that the array keeps.
    auto* owner = new std::shared_ptr<const void>(r->owner);
    nb::capsule keep(owner, [](void* p) noexcept { delete static_cast<std::shared_ptr<const void>*>(p); });
    const std::size_t shape[1] = {r->payload.size()};
    nb::ndarray<nb::memview, const std::uint8_t, nb::ndim<1>> view(
        reinterpret_cast<const std::uint8_t*>(r->payload.data()), 1, shape, keep);
    return nb::make_tuple(d, nb::cast(view, nb::rv_policy::reference));
  }

  /// Leaves the admission queue, or asks for the worker to stop (SIGTERM, SIGKILL after the grace
  /// period); a second call kills.
  void cancel() noexcept { job_->cancel(); }
  [[nodiscard]] pid_t pid() const noexcept { return job_->pid(); }
  [[nodiscard]] bool started() const noexcept { return job_->started(); }

 private:
  /// Waits for the end, the call watched on this thread where it was started here; a start that
  /// failed is raised by result().
  void wait_quietly(const isorun::runner::job::interruption& ask = {}) {
    try {
      job_->wait(ask);
    } catch (const std::exception&) {
    }
  }

  /// With the GIL: runs Python's signal handlers; true if one raised (Ctrl-C's
  /// KeyboardInterrupt), kept in `first` unless an earlier one is: the first is the one raised.
  static bool signal_raised(std::optional<nb::python_error>& first) {
    if (PyErr_CheckSignals() == 0) return false;
    if (first) PyErr_Clear();
    else first.emplace();
    return true;
  }

  std::shared_ptr<isorun::runner::queued_job> job_;
  std::shared_ptr<driver_cap> cap_;  // lives until the worker is gone
};

/// The job_spec of one call of `request` in a fresh `argv` (a Python interpreter running
/// isorun._worker), its GPUs left to admission (`on_gpu`: it will have some). `launch_env` is
/// part of how the worker is launched (a standby interpreter gets it at exec: what it preloads,
/// its thread limits); `o.env` joins it. Without the GIL.
isorun::runner::job_spec python_job_spec(isorun::blob request, std::vector<std::string> argv,
                                         const std::vector<std::string>& launch_env, const call_options& o, bool on_gpu,
                                         isorun::isolated_options& opts) {
  opts = o;  // isolated()'s options, as the C++ API has them; the launch's variables first
  opts.env = launch_env;
  opts.env.insert(opts.env.end(), o.env.begin(), o.env.end());
  // Checked now (a GPU that does not exist, a cap larger than it); admission says which GPUs.
  auto placed = isorun::runner::place_job(isorun::gpus(), isorun::runner::gpu_request_for(opts), false, opts.mem_limit);
  // Under a cap on a GPU the worker runs with the driver-API cap library preloaded; its region
  // comes with the call (start()); what a preload allocates before it stays within the cap, and is
  // charged to the call's region when that comes.
  if (opts.mem_limit && on_gpu) {
    opts.env.push_back(cap_preload_variable());
    opts.env.push_back(std::string(isorun::serialization::env::cap_deferred) + "=" + std::to_string(opts.mem_limit));
  }
  auto spec = isorun::runner::job_spec_for(python_task, isorun::serialization::encoding::binary, std::move(request),
                                           std::move(placed), opts);
  if (o.stdout_fd >= 0) {
    spec.stdout_to = isorun::runner::stdout_mode::fd;
    spec.stdout_fd = o.stdout_fd;
  }
  if (o.stderr_fd >= 0) spec.stderr_echo_fd = o.stderr_fd;
  spec.early_small_result = o.early_small_result;
  // argv[0] is the interpreter's own path: Python finds its prefix (and a venv) from it.
  spec.executable = argv.at(0);
  spec.worker_argv.assign(argv.begin() + 1, argv.end());
  return spec;
}

/// The admission request of a call with options `o` (behind an executor with GPUs, one of its
/// GPUs), and the cores it gets (its thread limits) in `cpus_per_call`.
isorun::runner::admission_request python_request(const call_options& o, isorun::runner::admission& first, bool executor,
                                                 unsigned& cpus_per_call) {
  isorun::isolated_options placement = o;
  auto request = isorun::runner::admission_request_at(first, executor, placement);
  cpus_per_call = placement.cpus_per_call;
  return request;
}

/// How a function's calls are launched (isorun's Python _Options.launch()): the worker's argv and
/// launch environment and the calls' options, made into the job_spec its calls share, once per
/// kind of admission they are queued at (on a GPU or not, their share of the cores), not per
/// call: a queued call holds its request and a reference to this.
class py_launch {
 public:
  /// A call of these queued at `first` (`executor`: an executor's): its admission request, the
  /// job_spec it shares, and where its workers come from.
  struct prepared {
    isorun::runner::admission_request request;
    std::shared_ptr<const isorun::runner::job_spec> spec;
    isorun::runner::warm_start warm;
  };

  py_launch(std::vector<std::string> argv, std::vector<std::string> launch_env, call_options o)
      : argv_{std::move(argv)}, launch_env_{std::move(launch_env)}, o_{std::move(o)} {}

  /// Without the GIL.
  /// @throws usage_error for options that cannot work (a GPU that does not exist, a cap larger than it).
  prepared at(isorun::runner::admission& first, bool executor) const {
    unsigned cpus = 0;
    auto request = python_request(o_, first, executor, cpus);
    const bool on_gpu = request.on_gpu();
    std::lock_guard lock(mutex_);
    for (const auto& m : made_)
      if (m.on_gpu == on_gpu && m.cpus == cpus) return {std::move(request), m.spec, m.warm};
    call_options o = o_;
    o.cpus_per_call = cpus;
    isorun::isolated_options opts;
    auto spec = std::make_shared<const isorun::runner::job_spec>(
        python_job_spec(isorun::blob(), argv_, launch_env_, o, on_gpu, opts));
    isorun::runner::check_job_spec(*spec);
    // (A handful of kinds at most: the process's admission and an executor's or two.)
    if (made_.size() == 8) made_.erase(made_.begin());
    made_.push_back({on_gpu, cpus, spec, o.warm(opts.standby)});
    return {std::move(request), std::move(spec), made_.back().warm};
  }

  [[nodiscard]] const call_options& options() const noexcept { return o_; }

 private:
  struct made {
    bool on_gpu;
    unsigned cpus;
    std::shared_ptr<const isorun::runner::job_spec> spec;
    isorun::runner::warm_start warm;
  };
  std::vector<std::string> argv_;
  std::vector<std::string> launch_env_;
  call_options o_;
  mutable std::mutex mutex_;
  mutable std::vector<made> made_;
};

/// The request as the worker gets it: u32 size and the variables the call sets before it runs
/// ("KEY=VALUE\0"...), then the pickled call.
isorun::blob framed_request(const std::string& variables, const nb::bytes& request) {
  const auto n = static_cast<std::uint32_t>(variables.size());
  isorun::blob args(sizeof n + variables.size() + request.size());
  std::memcpy(args.mutable_data(), &n, sizeof n);
  std::memcpy(args.mutable_data() + sizeof n, variables.data(), variables.size());
  std::memcpy(args.mutable_data() + sizeof n + variables.size(), request.c_str(), request.size());
  return args;
}

/// Queues one isolated call of the pickled `request` (see python_job_spec) for admission, at
/// `executor` then the process's, or the process's alone; it starts at once where it fits.
py_job start(const nb::bytes& request, const py_launch& launch, const py_admission* executor, bool caller_waits,
             std::uint64_t token) {
  nb::gil_scoped_release unlocked;  // placement may read NVML; launching waits for the exec
  auto& process = isorun::runner::admission::process();
  auto& first = executor ? *executor->admission : process;
  auto call = launch.at(first, executor != nullptr);
  std::shared_ptr<driver_cap> cap;
  std::string variables;
  if (call.spec->mem_limit && call.request.on_gpu()) {
    // The cap on the driver API, for whatever the function allocates on the device.
    cap = std::make_shared<driver_cap>(call.spec->mem_limit);
    for (const auto& v : cap->variables()) variables += v + '\0';
  }
  isorun::blob args;
  {
    nb::gil_scoped_acquire locked;  // the request is a Python object
    args = framed_request(variables, request);
  }
  auto queued = isorun::runner::queue_call(first, executor ? &process : nullptr, std::move(call.request),
                                           std::move(call.spec), std::move(args), call.warm);
  return py_job(std::move(queued), std::move(cap), caller_waits, token);
}

/// Launches the standby interpreters of calls like these now and waits until they are all
/// launched (each then imports its preloads and waits for its call).
void fill_standby(const py_launch& launch, const py_admission* executor) {
  if (!launch.options().standby && !launch.options().zygote) return;
  nb::gil_scoped_release unlocked;
  auto call = launch.at(executor ? *executor->admission : isorun::runner::admission::process(), executor != nullptr);
  if (call.request.on_gpu() && call.spec->gpus.empty() && call.spec->warm_context)
    return;  // its GPU is known only when admitted
  auto worker = isorun::runner::launch_spec_for(*call.spec);
  worker.zygote = call.warm.zygote;
  isorun::runner::standby_for(worker, call.warm.standby, call.warm.linger).fill();
}

/// An executor's admission for these slots (isorun.Executor), and how they were decided.
py_admission executor_admission(std::vector<int> gpus, bool all_gpus, std::uint64_t mem_limit, int per_gpu,
                                int cpu_slots) {
  nb::gil_scoped_release unlocked;
  py_admission a;
  a.admission = isorun::detail::executor_admission({.gpus = std::move(gpus),
                                                    .all_gpus = all_gpus,
                                                    .mem_limit = mem_limit,
                                                    .per_gpu = per_gpu,
                                                    .cpu_slots = cpu_slots},
                                                   a.plan);
  return a;
}

/// The slots of a batch (map): per slot, the GPU indices it runs on (empty: a CPU slot); and
/// how they were decided.
std::pair<std::vector<std::vector<int>>, std::string> plan_slots(std::vector<int> gpus, bool all_gpus,
                                                                 std::uint64_t mem_limit, int per_gpu, int cpu_slots) {
  nb::gil_scoped_release unlocked;
  auto plan = isorun::runner::plan_slots({.gpus = std::move(gpus),
                                          .all_gpus = all_gpus,
                                          .mem_limit = mem_limit,
                                          .per_gpu = per_gpu,
                                          .cpu_slots = cpu_slots},
                                         isorun::gpus());
  std::vector<std::vector<int>> slots;
  for (const auto& sl : plan.slots) {
    std::vector<int> indices;
    for (const auto& g : sl.gpus) indices.push_back(g.index);
    slots.push_back(std::move(indices));
  }
  return {std::move(slots), plan.how};
}

/// An option of isolated_options as an attribute of CallOptions under its own name: a duration's
/// in milliseconds (`timeout_ms`), an optional one taking None.
template <class T>
void bind_option(nb::class_<call_options>& c, const isorun::runner::option_row<T>& row) {
  if constexpr (std::is_same_v<T, std::chrono::milliseconds>) {
    static std::list<std::string> names;  // a name given to nanobind lives as long as the module
    const char* name = names.emplace_back(std::string(row.name) + "_ms").c_str();
    c.def_prop_rw(
        name, [field = row.field](const call_options& o) { return (o.*field).count(); },
        [field = row.field](call_options& o, std::int64_t v) { o.*field = T(v); });
  } else if constexpr (std::is_same_v<T, std::optional<int>>) {
    c.def_rw(row.name, row.field, nb::arg(row.name).none());
  } else {
    c.def_rw(row.name, row.field);
  }
}

// Its types: the options of a call, an admission, a call in flight, how calls are launched.
void bind_types(nb::module_& m) {
  // isolated_options' fields (runner/option_table.hpp), then the Python call's own.
  nb::class_<call_options> options(m, "CallOptions");
  options.def(nb::init<>());
  isorun::runner::for_each_option([&](const auto& row) { bind_option(options, row); });
  options.def_rw("stdout_fd", &call_options::stdout_fd)
      .def_rw("stderr_fd", &call_options::stderr_fd)
      .def_rw("early_small_result", &call_options::early_small_result)
      .def_rw("zygote", &call_options::zygote)
      .def_rw("linger_ms", &call_options::linger_ms);

  nb::class_<py_admission>(m, "Admission")
      .def_prop_ro("waiting", [](const py_admission& a) { return a.admission->waiting(); })
      .def_prop_ro("running", [](const py_admission& a) { return a.admission->running(); })
      .def(
          "cancel_waiting",
          [](const py_admission& a) {
            nb::gil_scoped_release unlocked;
            a.admission->cancel_waiting();
          },
          "Cancels every call waiting here for a slot, at once (an executor's shutdown).")
      .def_prop_ro(
          "slots",
          [](const py_admission& a) { return a.admission->shares().cpu_slots + a.admission->shares().gpu_slots; })
      .def_ro("plan", &py_admission::plan);

  nb::class_<py_job>(m, "Job")
      .def("wait", &py_job::wait, "timeout"_a = nb::none(),
           "Waits for the worker's end (None: no limit); True once done. Ctrl-C stops the worker.")
      .def("result", &py_job::result, "(outcome dict, payload array or None) of the finished call.")
      .def("cancel", &py_job::cancel, "Stops the worker: SIGTERM, then SIGKILL after the grace period.")
      .def_prop_ro("pid", &py_job::pid)
      .def_prop_ro("started", &py_job::started);

  nb::class_<py_launch>(m, "Launch")
      .def(nb::init<std::vector<std::string>, std::vector<std::string>, call_options>(), "argv"_a, "launch_env"_a,
           "options"_a,
           "How a function's calls are launched: the worker's argv (an interpreter) and launch environment, "
           "and the calls' options; made into the job its calls share.");
}

// The result segments this process keeps for reuse, and where its output goes.
void bind_segments(nb::module_& m) {
  m.def(
      "set_segment_idle_limit",
      [](std::uint64_t bytes) { isorun::serialization::segment_pool::instance().set_idle_limit(bytes); }, "bytes"_a,
      "Most bytes of idle result and request segments kept for reuse; the rest are closed.");
  m.def(
      "set_segment_linger",
      [](std::uint64_t bytes, std::int64_t linger_ms) {
        isorun::serialization::segment_pool::instance().set_linger(bytes, std::chrono::milliseconds(linger_ms));
      },
      "bytes"_a, "linger_ms"_a,
      "Beyond the idle limit, segments released in the last linger_ms are kept too, up to bytes idle in all.");
  m.def(
      "segment_idle_bytes", [] { return isorun::serialization::segment_pool::instance().idle_bytes(); },
      "Bytes of the idle segments the pool keeps now (memory that stays resident).");
  m.def(
      "stdout_is_pipe",
      [] {
        struct stat st {};
        return ::fstat(STDOUT_FILENO, &st) == 0 && S_ISFIFO(st.st_mode);
      },
      "Whether this process's fd 1 is a pipe.");
}

}  // namespace

namespace isorun_python {

void bind_caller(nb::module_& m) {
  bind_types(m);
  m.def("start", &start, "request"_a, "launch"_a, "executor"_a = nb::none(), "caller_waits"_a = false, "token"_a = 0,
        "Queues one isolated call of a pickled request for admission; it starts in a fresh interpreter. "
        "caller_waits: this thread waits for it next, and watches it; otherwise the process's watcher "
        "watches it and take_completed() returns its token once it has ended.");
  m.def(
      "take_completed", [] { return completions::instance().take(); },
      "The tokens of the calls (started without caller_waits) that ended since the last take, once there is "
      "one; None once close_completions() was called and none is left.");
  m.def(
      "close_completions", [] { completions::instance().close(); },
      "take_completed() returns None once the tokens left are taken.");
  m.def("fill_standby", &fill_standby, "launch"_a, "executor"_a = nb::none(),
        "Launches the standby interpreters of such calls now; returns once they are launched.");
  m.def("executor_admission", &executor_admission, "gpus"_a, "all_gpus"_a, "mem_limit"_a, "per_gpu"_a, "cpu_slots"_a,
        "An executor's admission for these slots.");
  m.def(
      "wait_idle",
      [] {
        nb::gil_scoped_release unlocked;
        isorun::runner::admission::process().wait_idle();
      },
      "Waits until no call of this process waits or holds a slot: every worker gone, one that exits "
      "behind an early result too.");
  m.def(
      "admission_counts",
      [] {
        auto& a = isorun::runner::admission::process();
        return std::make_pair(a.waiting(), a.running());
      },
      "(waiting, running) calls of this process's admission.");
  m.def("plan_slots", &plan_slots, "gpus"_a, "all_gpus"_a, "mem_limit"_a, "per_gpu"_a, "cpu_slots"_a,
        "The slots of a batch: per slot its GPU indices (empty: CPU), and how they were decided.");
  m.def("parse_size", &parse_size, "text"_a, "Bytes in '2G', '512M', '1.5GiB' or a plain count.");
  m.def("parse_duration_ms", &parse_duration_ms, "text"_a, "Milliseconds in '30s', '10m', '250ms'.");
  m.def(
      "stop_standby",
      [] {
        nb::gil_scoped_release unlocked;
        isorun::stop_standby();
      },
      "Stops every standby worker and waits until they are gone.");
  m.def(
      "pool_stats",
      [] {
        nb::list out;
        for (const auto& s : isorun::runner::standby_stats()) {
          nb::dict d;
          d["zygote"] = s.zygote;
          d["adaptive"] = s.adaptive;
          d["dormant"] = s.dormant;
          d["waiting"] = s.waiting;
          d["zygote_pid"] = s.zygote_pid;
          d["hits"] = s.hits;
          d["misses"] = s.misses;
          d["env"] = s.env;
          out.append(d);
        }
        return out;
      },
      "Per standby pool of this process: whether it forks from a zygote, is adaptive and dormant now, its "
      "waiting workers' pids, its zygote's pid (-1: none), calls that found a worker waiting (hits) or not "
      "(misses), and its launch environment.");
  bind_segments(m);
}

}  // namespace isorun_python
