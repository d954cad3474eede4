// The worker side of the protocol: map the request, run one task, publish its result (in `done`
// when small, else in shared memory), report, exit. Everything the supervisor sent is validated first.
#include <cxxabi.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <tuple>
#include <vector>

#include "isorun/alloc/out_of_memory.hpp"
#include "isorun/serialization/codec.hpp"
#include "isorun/serialization/control.hpp"
#include "isorun/serialization/cpu_handoff.hpp"
#include "isorun/serialization/protocol.hpp"
#include "isorun/serialization/request.hpp"
#include "isorun/serialization/result_stream.hpp"
#include "isorun/serialization/shm_segment.hpp"
#include "isorun/serialization/whole_file.hpp"
#include "isorun/serialization/wire.hpp"
#include "isorun/worker/init.hpp"
#include "isorun/worker/segment_sink.hpp"
#include "isorun/worker/task.hpp"
#include "isorun/worker/this_worker.hpp"
#include "isorun/worker/warm_pages.hpp"

namespace isorun {
namespace {
namespace ser = isorun::serialization;

using ser::monotonic_ns;
using worker::result_too_large;
using worker::segment_sink;

[[noreturn]] void die(const std::string& why) {
  std::fprintf(stderr, "isorun worker: %s\n", why.c_str());
  std::fflush(stderr);
  ::_exit(70);
}

std::string demangle(const char* name) {
  int status = 0;
  char* raw = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string s = status == 0 && raw ? raw : name;
  std::free(raw);
  return s;
}

std::string truncate(std::string s) {
  constexpr std::size_t limit = 16 * 1024;
  if (s.size() > limit) {
    s.resize(limit);
    s += "... (truncated)";
  }
  return s;
}

// What the supervisor's assignment gives a worker: its request, where its result goes and,
// for a task whose result is a blob, a ring to stream it through (with the eventfd that says a
// stream begins).
struct assignment {
  std::string inline_request;  // the request, when the assignment carried it
  ser::shm_file request, result, ring;
  int stream_event = -1;
};

// Waits for the assignment and applies its environment before anything (a task library, the
// CUDA module) can read it: CUDA takes CUDA_VISIBLE_DEVICES when it initialises, not at exec.
assignment receive_assignment() {
  const ser::cpu_mask before_wait = ser::this_thread_cpus();  // narrowed already if taken while starting
  worker::warm_pages_while_waiting(ser::control_fd);
  ser::receive_result r;
  try {
    r = ser::receive_message(ser::control_fd, true);
  } catch (const std::exception& e) {
    die(std::string("bad assignment: ") + e.what());
  }
  if (r.closed) die("the supervisor closed the channel before assigning work");
  auto* a = r.message ? std::get_if<ser::assign_message>(&*r.message) : nullptr;
  if (!a) die("expected an assignment first");
  ser::restore_cpus(a->cpus, before_wait);  // first: narrowed only for this wake-up
  assignment out;
  std::size_t next = 0;
  if (a->request.empty()) out.request = ser::shm_file{r.fds[next++]};
  else out.inline_request = std::move(a->request);
  out.result = ser::shm_file{r.fds[next++]};
  if (a->stdout_attached) {  // the task's own log file: stdout from here on
    std::fflush(stdout);
    if (::dup2(r.fds[next], STDOUT_FILENO) < 0) die(std::string("cannot redirect stdout: ") + std::strerror(errno));
    ::close(r.fds[next++]);
  }
  if (a->stream_attached) {
    out.ring = ser::shm_file{r.fds[next++]};
    out.stream_event = r.fds[next++];
  }
  if (a->protocol != ser::protocol_version)
    die("assignment has protocol " + std::to_string(a->protocol) + ", this worker speaks " +
        std::to_string(ser::protocol_version));
  for (const auto& entry : a->env) {
    const auto eq = entry.find('=');
    if (eq == std::string::npos || eq == 0) die("assignment has a malformed environment entry '" + entry + "'");
    ::setenv(entry.substr(0, eq).c_str(), entry.c_str() + eq + 1, 1);
  }
  return out;
}

// A warm worker (env::warm) prepares its device while it waits: the CUDA context and the
// capped allocator, the slow part of a GPU task's start. A failure here is not reported now:
// the task's first use of the allocator meets it again and reports it as the task's error.
std::optional<ser::warm_device> prepare_warm_device() {
  const char* value = std::getenv(ser::env::warm.data());
  if (!value) return std::nullopt;
  auto warm = ser::parse_warm_device(value);
  if (!warm) die(std::string("malformed ") + ser::env::warm.data() + " '" + value + "'");
  ::unsetenv(ser::env::warm.data());
  this_worker().assign({.devices = {{.index = warm->index, .uuid = warm->uuid, .memory = warm->device_memory}},
                        .kind = warm->simulated ? device_kind::simulated : device_kind::cuda,
                        .mem_limit = warm->mem_limit,
                        .alloc_conf = warm->alloc_conf});
  try {
    this_worker().allocator();
  } catch (...) {
  }
  return warm;
}

// The task's memory as `isorun report` draws it: each device's allocator history (events
// {t_ns, action, addr, size, stream} on CLOCK_MONOTONIC, with the counts at the end so the
// lines can be drawn back from them), the task's start, and, after an out-of-memory failure,
// what was live when it failed. Written to $ISORUN_MEMORY_TIMELINE whole, then renamed: a reader
// never finds one cut short by the worker's death, and nothing planted at the name is written
// through. Best effort: the task's outcome does not depend on it.
void write_memory_timeline(const char* path, std::int64_t start_ns, const std::optional<oom_figures>& oom) {
  auto& w = this_worker();
  std::ostringstream o;
  o << "{\"start_ns\":" << start_ns << ",\"end_ns\":" << monotonic_ns() << ",\"devices\":[";
  bool first = true;
  for (std::size_t i = 0; i < std::max<std::size_t>(1, w.devices().size()); ++i) {
    if (!w.has_allocator(i)) continue;
    auto& a = w.allocator(i);
    const auto st = a.stats();
    o << (first ? "" : ",") << "{\"index\":" << (w.has_gpu() ? w.devices()[i].index : -1) << ",\"cap\":" << a.cap()
      << ",\"allocated\":" << st.allocated_bytes.current << ",\"reserved\":" << st.reserved_bytes.current
      << ",\"events\":" << a.history_json() << "}";
    first = false;
  }
  o << "]";
  if (oom) {
    o << ",\"oom\":{\"requested\":" << oom->requested << ",\"limit\":" << oom->limit
      << ",\"reserved\":" << oom->reserved << ",\"allocated\":" << oom->allocated
      << ",\"largest_free\":" << oom->largest_free << ",\"live\":[";
    for (std::size_t i = 0; i < oom->live.size(); ++i) o << (i ? "," : "") << oom->live[i];
    o << "]}";
  }
  o << "}\n";
  const std::string file = path;
  const auto slash = file.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : file.substr(0, slash);
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return;
  [[maybe_unused]] int failed = ser::write_whole_file(dir_fd, file.substr(slash + 1), o.str(), false);
  ::close(dir_fd);
}

// The request the supervisor wrote, carried by the assignment or mapped, and checked. Its decoded
// payload may point into `owner`: the mapping, or a copy aligned as a mapping's payload is.
ser::request read_request(assignment& assigned, std::shared_ptr<const void>& owner) {
  ser::request req;
  try {
    std::span<const std::byte> bytes;
    if (!assigned.inline_request.empty()) {
      auto copy = ser::aligned_copy(assigned.inline_request);
      bytes = {copy.get(), assigned.inline_request.size()};
      owner = std::move(copy);
    } else {
      auto map = std::make_shared<ser::mapping>(
          ser::mapping::map(assigned.request.fd(), assigned.request.size(), ser::mapping::access::read_only, true));
      bytes = {map->data(), map->size()};
      owner = std::move(map);
    }
    ser::encoding enc{};
    auto payload = ser::open_payload(bytes.data(), bytes.size(), ser::request_magic, bytes.size(), enc);
    ser::decode(payload, owner, req);
  } catch (const std::exception& e) {
    die(std::string("bad request: ") + e.what());
  }
  if (req.protocol != ser::protocol_version) die("request has protocol " + std::to_string(req.protocol));
  return req;
}

// A worker that prepared a device ahead runs only a request for that device, under that cap.
void check_warm_device(const std::optional<ser::warm_device>& warm, const ser::request& req) {
  std::string assigned_gpus;
  for (const auto& g : req.gpus) assigned_gpus += (assigned_gpus.empty() ? "GPU " : ",") + g.uuid;
  if (warm && (req.gpus.size() != 1 || warm->uuid != req.gpus[0].uuid || warm->index != req.gpus[0].index ||
               warm->mem_limit != req.mem_limit || warm->alloc_conf != req.alloc_conf))
    die("this worker prepared GPU " + warm->uuid + " under a cap of " + std::to_string(warm->mem_limit) +
        " bytes, but was assigned " + (req.gpus.empty() ? std::string("no GPU") : assigned_gpus) + " under " +
        std::to_string(req.mem_limit));
}

// Who this worker is and what it sees, for `done`: taken before the task runs, which may change
// its own environment.
void identify(ser::done_message& done) {
  done.pid = ::getpid();
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) done.visible_devices = v;
  if (const char* v = std::getenv("CUDA_DEVICE_ORDER")) done.device_order = v;
}

void assign_devices(const ser::request& req) {
  std::vector<gpu_device> devices;
  for (const auto& g : req.gpus) devices.push_back({.index = g.index, .uuid = g.uuid, .memory = g.memory});
  this_worker().assign({.devices = std::move(devices),
                        .kind = req.gpus.empty()        ? device_kind::cpu
                                : req.gpus[0].simulated ? device_kind::simulated
                                                        : device_kind::cuda,
                        .mem_limit = req.mem_limit,
                        .task = req.task,
                        .alloc_conf = req.alloc_conf});
}

// A task whose result may hold a large blob gets the segment mapped ahead and its first large
// blob placed in it (blob_placement.hpp). Not a blob task on a GPU: its large results are made
// in device memory and stream through the ring (device_result), which needs no mapping of the
// segment. Not for an early result: it is sealed on `done`, and a process the task forks
// would inherit the writable mapping made ahead, which refuses the seal (a mapping made by
// output_blob after the fork is not inherited); without the seal, the result waits for the
// exit. ISORUN_PLACE_BLOBS=0 turns placing off, to compare.
void place_blobs(const worker::task_info& task, const ser::request& req, segment_sink& sink, bool blob_result) {
  if (task.placed_blob_offset > 0 && !(blob_result && this_worker().has_gpu()) && !req.early_result) {
    sink.premap_in_background(req.expected_result);
    sink.set_placed_offset(task.placed_blob_offset);
    if (const char* e = std::getenv("ISORUN_PLACE_BLOBS"); !e || std::strcmp(e, "0") != 0)
      sink.install_blob_placement();
  }
}

// Runs the task `req` names into `sink`. `done` gets how it ended, `oom` the allocator's figures
// after running out of memory (for the memory timeline), `result` the task's result value.
void run_task(const ser::request& req, const std::shared_ptr<const void>& request_map, segment_sink& sink,
              ser::done_message& done, std::optional<oom_figures>& oom, std::shared_ptr<void>& result) {
  try {
    const worker::task_info* task = worker::registry::instance().find(req.task);
    if (!task) throw std::invalid_argument("no task named '" + req.task + "' in this worker");
    const bool binary = req.encoding == static_cast<std::uint32_t>(ser::encoding::binary);
    const bool blob_result = task->result_type == "isorun::blob";
    if (binary && blob_result) this_worker().set_output_area([&sink](std::uint64_t n) { return sink.claim_area(n); });
    if (binary) place_blobs(*task, req, sink, blob_result);
    if (req.encoding == static_cast<std::uint32_t>(ser::encoding::json)) {
      std::string json(reinterpret_cast<const char*>(req.args.data()), req.args.size());
      task->run_json(json, sink);
    } else {
      result = task->run_binary(req.args.bytes(), request_map, sink);
    }
    done.status = ser::task_status::ok;
  } catch (const result_too_large& e) {
    done.status = ser::task_status::result_too_large;
    done.message = e.what();
  } catch (const out_of_memory& e) {
    oom = e.figures();
    done.status = ser::task_status::out_of_memory;
    done.error_type = "isorun::out_of_memory";
    done.message = truncate(e.what());
  } catch (const worker::named_error& e) {
    done.status = ser::task_status::task_error;
    done.error_type = e.type_name();
    done.message = truncate(e.what());
  } catch (const std::exception& e) {
    done.status = ser::task_status::task_error;
    done.error_type = demangle(typeid(e).name());
    done.message = truncate(e.what());
  } catch (...) {
    done.status = ser::task_status::task_error;
    const std::type_info* t = abi::__cxa_current_exception_type();
    done.error_type = t ? demangle(t->name()) : "unknown";
    done.message = "(an exception not derived from std::exception)";
  }
}

// What a worker process sets up before anything else: its descriptor to the supervisor, its
// exit with the supervisor's, and SIGXFSZ ignored.
void enter_worker() {
  if (std::getenv(ser::env::bind_now.data())) {  // launched ahead: bound at load; its task's children bind as usual
    ::unsetenv("LD_BIND_NOW");
    ::unsetenv(ser::env::bind_now.data());
  }
  if (::fcntl(ser::control_fd, F_SETFD, FD_CLOEXEC) != 0)
    die("descriptor " + std::to_string(ser::control_fd) + " is missing; workers are started by isorun, not by hand");
  ser::exit_with_supervisor(ser::control_fd);
  // A file size limit (ulimit -f) reached while the result segment grows: an error saying so
  // (EFBIG), reported as the task's outcome, rather than death by SIGXFSZ. (CPython does the same.)
  ::signal(SIGXFSZ, SIG_IGN);
}

// The task's times and peaks in its `done`: the run from `start_ns` to its result, and the
// result's encoding where the sink committed one.
void account(ser::done_message& done, const segment_sink& sink, std::int64_t start_ns) {
  std::tie(done.peak_allocated, done.peak_reserved) = this_worker().peaks();
  const std::int64_t end_ns = sink.run_end_ns_ ? sink.run_end_ns_ : monotonic_ns();
  done.run_ns = static_cast<std::uint64_t>(end_ns - start_ns);
  if (sink.committed_ns_) {
    done.encode_begin_ns = sink.run_end_ns_;
    done.encode_ns = static_cast<std::uint64_t>(sink.committed_ns_ - sink.run_end_ns_);
  }
}

// Whether the result is handed over at `done`, while this process exits; if so, what the exit
// would release goes now. The supervisor decides alike (worker_watch.cpp): with early_result, or
// a small CPU result (early_small_result), nothing sealed.
bool hand_over_early(const ser::request& req, const ser::done_message& done, segment_sink& sink,
                     std::shared_ptr<void>& result) {
  const bool early = req.early_result || (req.early_small_result && req.gpus.empty() &&
                                          done.status == ser::task_status::ok && !done.inline_result.empty());
  if (!early) return false;
  // A result in the segment is sealed here, so nothing can still write it, and the task's device
  // memory goes back now.
  this_worker().set_output_area(nullptr);
  if (this_worker().has_gpu()) result.reset();  // device memory it may hold goes back with the rest
  this_worker().release_task_memory();
  sink.close();
  return true;
}

// Sends `done`; after an early hand-over, sleeps until the supervisor has taken the result
// (protocol.hpp, let_go): not on the CPU its thread was just woken onto, with this teardown.
void report(ser::done_message& done, std::int64_t assigned_ns, bool early) {
  std::cout.flush();
  std::fflush(nullptr);
  done.assigned_ns = assigned_ns;
  done.sent_ns = monotonic_ns();
  try {
    ser::send_message(ser::control_fd, done);
  } catch (const std::exception& e) {
    die(std::string("cannot report to the supervisor: ") + e.what());
  }
  if (!early) return;
  pollfd p{ser::control_fd, POLLIN, 0};
  while (::poll(&p, 1, ser::let_go_wait_ms) < 0 && errno == EINTR) {
  }
}

}  // namespace

namespace detail {
[[noreturn]] void run_worker() {
  enter_worker();
  const std::optional<ser::warm_device> warm = prepare_warm_device();
  assignment assigned = receive_assignment();
  const std::int64_t assigned_ns = monotonic_ns();
  std::shared_ptr<const void> request_map;  // what the request's payload lies in
  const ser::request req = read_request(assigned, request_map);
  check_warm_device(warm, req);
  for (const auto& lib : req.task_libraries)
    if (!::dlopen(lib.c_str(), RTLD_NOW | RTLD_GLOBAL)) die(std::string("cannot load task library: ") + ::dlerror());
  ser::done_message done;
  identify(done);
  done.request_ns = monotonic_ns();
  assign_devices(req);

  // Read now and removed, so that processes the task starts do not see it.
  std::string timeline;
  if (const char* t = std::getenv(ser::env::memory_timeline.data())) timeline = t;
  ::unsetenv(ser::env::memory_timeline.data());

  std::optional<oom_figures> oom;  // for the memory timeline
  segment_sink sink(std::move(assigned.result), req.max_result, std::move(assigned.ring), assigned.stream_event);
  if (sink.has_ring() && req.encoding == static_cast<std::uint32_t>(ser::encoding::binary))
    this_worker().set_result_stream(&sink);
  const std::int64_t start_ns = monotonic_ns();
  std::shared_ptr<void> result;  // the task's result value, encoded: destroyed after reporting
  run_task(req, request_map, sink, done, oom, result);
  if (!timeline.empty()) write_memory_timeline(timeline.c_str(), start_ns, oom);
  account(done, sink, start_ns);
  if (done.status == ser::task_status::ok) done.inline_result = sink.take_inline_result();
  const bool early = hand_over_early(req, done, sink, result);
  report(done, assigned_ns, early);
  // What the exit would tear down on one core, large pieces given back on all of them: the task's
  // result value (freeing a large blob is one page at a time on one core) and, in a CPU worker,
  // the mapping of the result segment (its page-table entries). The supervisor waits for the
  // exit, unless it took the result early. A GPU worker's segment may be page-locked for the
  // driver (output_blob): its exit unmaps it, after the driver lets go.
  result.reset();
  if (!this_worker().has_gpu()) sink.unmap_result();
  // No static destructors: a CUDA context or task library may take long to tear down, and the
  // kernel releases everything this process holds anyway.
  ::_exit(0);
}

}  // namespace detail

bool is_worker_process() noexcept {
  const char* w = std::getenv(ser::env::worker.data());
  return w && std::strcmp(w, "1") == 0;
}

}  // namespace isorun
