// The worker side of the protocol: map the request, say hello, run one task, publish its result
// in shared memory, report, exit. Everything the supervisor sent is validated first.
#include <cxxabi.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <algorithm>
#include <atomic>
#include <optional>
#include <stdexcept>
#include <thread>
#include <tuple>
#include <vector>

#include "isorun/alloc/out_of_memory.hpp"
#include "isorun/worker/init.hpp"
#include "isorun/serialization/codec.hpp"
#include "isorun/serialization/control.hpp"
#include "isorun/serialization/protocol.hpp"
#include "isorun/serialization/request.hpp"
#include "isorun/serialization/result_stream.hpp"
#include "isorun/serialization/shm_segment.hpp"
#include "isorun/serialization/wire.hpp"
#include "isorun/worker/task.hpp"
#include "isorun/worker/this_worker.hpp"

namespace isorun {
namespace {
namespace ser = isorun::serialization;

using ser::monotonic_ns;

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
  ser::shm_file request, result, ring;
  int stream_event = -1;
};

// Waits for the assignment and applies its environment before anything (a task library, the
// CUDA module) can read it: CUDA takes CUDA_VISIBLE_DEVICES when it initialises, not at exec.
assignment receive_assignment() {
  ser::receive_result r;
  try {
    r = ser::receive_message(ser::control_fd, true);
  } catch (const std::exception& e) {
    die(std::string("bad assignment: ") + e.what());
  }
  if (r.closed) die("the supervisor closed the channel before assigning work");
  const auto* a = r.message ? std::get_if<ser::assign_message>(&*r.message) : nullptr;
  if (!a) die("expected an assignment first");
  assignment out{ser::shm_file{r.fds[0]}, ser::shm_file{r.fds[1]}};
  std::size_t next = 2;
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

// A result larger than the supervisor accepts: not the task's fault, so not a task_error.
class result_too_large : public std::length_error {
 public:
  using std::length_error::length_error;
};

class segment_sink final : public worker::result_sink, public worker_context::result_stream {
 public:
  segment_sink(ser::shm_file file, std::uint64_t max_result, ser::shm_file ring, int stream_event)
      : file_{std::move(file)}, max_result_{max_result}, ring_{std::move(ring)}, stream_event_{stream_event} {}
  segment_sink(const segment_sink&) = delete;
  segment_sink& operator=(const segment_sink&) = delete;
  ~segment_sink() override {
    take_premapped(true);
    if (stream_event_ >= 0) ::close(stream_event_);
  }

  /// @brief Maps the pooled segment, for a payload of `expected` bytes (the task's last result)
  ///        or as large as the segment already is if smaller, faulted in, on a thread of its own
  ///        while the task runs. Faulting in a resident 1 GiB segment costs ~70-85 ms (one
  ///        page-table entry per 4 KiB page) that a large result would otherwise pay after the
  ///        task, on its way back; area() takes the mapping over. Small results are left alone:
  ///        the pool may hand a task with small results its largest segment.
  void premap_in_background(std::uint64_t expected) {
    const std::uint64_t size = std::min(file_.size(), ser::header_size + expected);
    if (expected < premap_threshold || size < premap_threshold || premapper_.joinable()) return;
    try {
      premapper_ = std::thread([this, size] {
        try {
          premapped_ = ser::mapping::map(file_.fd(), size, ser::mapping::access::read_write, false);
          // Faulted in piece by piece: a MAP_POPULATE of the whole holds the address-space lock
          // throughout, so any mmap or munmap of the task's, or of a small result's, would wait
          // for the whole GiB. MADV_POPULATE_READ (Linux 5.14; as fast as MAP_POPULATE) leaves a
          // shared segment's pages writable as they are; without it they fault in when written.
          constexpr std::uint64_t piece = 4ULL << 20;
          for (std::uint64_t at = 0; at < size && !stop_premap_.load(std::memory_order_relaxed); at += piece)
            if (::madvise(premapped_.data() + at, std::min(piece, size - at), MADV_POPULATE_READ) != 0) break;
        } catch (...) {  // area() maps it itself
        }
      });
    } catch (...) {  // no thread: area() maps it itself
    }
  }

  [[nodiscard]] bool has_ring() const noexcept { return ring_.valid(); }

  std::span<std::byte> slots(std::uint64_t total) override {
    const auto all = writer().slots();
    const std::uint64_t page = 4096;
    return all.first(std::min<std::uint64_t>(all.size(), (total + page - 1) / page * page));
  }

  void write(std::uint64_t total, const fill_fn& fill, std::span<const std::uint64_t> chunk_hashes) override {
    if (streamed_) throw std::logic_error("device_result() was already called: a task has one result");
    if (total > max_result_)
      throw result_too_large("result of " + std::to_string(total) + " bytes exceeds the limit of " +
                             std::to_string(max_result_) + " bytes (--max-result)");
    stream_checksum_ = writer().write(total, fill, chunk_hashes);
    stream_total_ = total;
    streamed_ = true;
  }

  void commit_streamed(std::uint64_t blob_size) override {
    if (!streamed_ || stream_total_ != sizeof(std::uint64_t) + blob_size)
      throw std::logic_error("a streamed blob returned without its stream (return what device_result() returned)");
    run_end_ns_ = monotonic_ns();
    area(0);  // the header alone
    ser::write_header(map_.data(), ser::streamed_result_magic, ser::encoding::binary, stream_total_, stream_checksum_);
    committed_ns_ = monotonic_ns();
  }

  std::byte* reserve(std::uint64_t size) override {
    run_end_ns_ = monotonic_ns();
    return area(size);
  }

  // Maps the segment for a payload of `size` bytes; an existing large enough mapping is kept,
  // so bytes a task wrote in place (output_blob) stay where the encoder expects them.
  std::byte* area(std::uint64_t size) {
    if (size > max_result_)
      throw result_too_large("result of " + std::to_string(size) + " bytes exceeds the limit of " +
                             std::to_string(max_result_) + " bytes (--max-result)");
    // A large result waits for the whole mapping made ahead; a small one (after a large one: the
    // pool hands out its largest segment first) stops it after the piece in progress.
    if (ser::mapping ahead = take_premapped(ser::header_size + size < premap_threshold); ahead.size() > map_.size())
      map_ = std::move(ahead);
    if (map_.size() < ser::header_size + size) {
      file_.reserve(ser::header_size + size);
      map_ = ser::mapping::map(file_.fd(), ser::header_size + size, ser::mapping::access::read_write, true);
    }
    return map_.data() + ser::header_size;
  }

  void commit(std::uint64_t size, std::uint64_t checksum, ser::encoding enc) override {
    ser::write_header(map_.data(), ser::result_magic, enc, size, checksum);
    committed_ns_ = monotonic_ns();
  }

  // Before the exit: unmaps the result's mapping on all cores (the exit would, on one). A mapping
  // still being made ahead (a task that failed before it wrote a result) is left to the exit.
  void unmap_result() { map_ = {}; }

  // Lets go of the segment: this process can no longer change it, so it can be sealed.
  void close() {
    take_premapped(true);
    map_ = {};
    file_ = {};
  }

  std::int64_t run_end_ns_ = 0, committed_ns_ = 0;

 private:
  // The ring, mapped on first use, without faulting it in: a payload smaller than the ring
  // touches (and page-locks) only its part.
  ser::stream_writer& writer() {
    if (!ring_.valid()) throw std::logic_error("no result ring was attached");
    if (!writer_) {
      ring_map_ = ser::mapping::map(ring_.fd(), ser::ring_bytes, ser::mapping::access::read_write, false);
      writer_.emplace(ring_map_.data(), stream_event_);
    }
    return *writer_;
  }

  // The mapping premap_in_background() made (empty if none): waited for whole, or with `stop`
  // only until the piece being faulted in is done.
  ser::mapping take_premapped(bool stop) {
    if (!premapper_.joinable()) return {};
    if (stop) stop_premap_ = true;
    premapper_.join();
    return std::move(premapped_);
  }

  static constexpr std::uint64_t premap_threshold = 32ULL << 20;

  ser::shm_file file_;
  ser::mapping map_;
  ser::mapping premapped_;  // premap_in_background()'s mapping, until area() takes it
  std::thread premapper_;
  std::atomic<bool> stop_premap_{false};
  std::uint64_t max_result_;
  ser::shm_file ring_;
  int stream_event_;
  ser::mapping ring_map_;
  std::optional<ser::stream_writer> writer_;
  bool streamed_ = false;
  std::uint64_t stream_total_ = 0, stream_checksum_ = 0;
};

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
// what was live when it failed. Written to $ISORUN_MEMORY_TIMELINE; best effort: the task's
// outcome does not depend on it.
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
    o << ",\"oom\":{\"requested\":" << oom->requested << ",\"limit\":" << oom->limit << ",\"reserved\":" << oom->reserved
      << ",\"allocated\":" << oom->allocated << ",\"largest_free\":" << oom->largest_free << ",\"live\":[";
    for (std::size_t i = 0; i < oom->live.size(); ++i) o << (i ? "," : "") << oom->live[i];
    o << "]}";
  }
  o << "}\n";
  std::ofstream(path, std::ios::trunc) << o.str();
}

}  // namespace

namespace detail {
[[noreturn]] void run_worker() {
  if (::fcntl(ser::control_fd, F_SETFD, FD_CLOEXEC) != 0)
    die("descriptor " + std::to_string(ser::control_fd) + " is missing; workers are started by isorun, not by hand");
  ser::exit_with_supervisor(ser::control_fd);
  // A file size limit (ulimit -f) reached while the result segment grows: an error saying so
  // (EFBIG), reported as the task's outcome, rather than death by SIGXFSZ. (CPython does the same.)
  ::signal(SIGXFSZ, SIG_IGN);

  const std::optional<ser::warm_device> warm = prepare_warm_device();
  assignment assigned = receive_assignment();
  ser::request req;
  std::shared_ptr<ser::mapping> request_map;
  try {
    const std::uint64_t size = assigned.request.size();
    request_map = std::make_shared<ser::mapping>(
        ser::mapping::map(assigned.request.fd(), size, ser::mapping::access::read_only, true));
    ser::encoding enc{};
    auto payload = ser::open_payload(request_map->data(), request_map->size(), ser::request_magic, size, enc);
    ser::decode(payload, request_map, req);
  } catch (const std::exception& e) {
    die(std::string("bad request: ") + e.what());
  }
  if (req.protocol != ser::protocol_version) die("request has protocol " + std::to_string(req.protocol));
  std::string assigned_gpus;
  for (const auto& g : req.gpus) assigned_gpus += (assigned_gpus.empty() ? "GPU " : ",") + g.uuid;
  if (warm && (req.gpus.size() != 1 || warm->uuid != req.gpus[0].uuid || warm->index != req.gpus[0].index ||
               warm->mem_limit != req.mem_limit || warm->alloc_conf != req.alloc_conf))
    die("this worker prepared GPU " + warm->uuid + " under a cap of " + std::to_string(warm->mem_limit) +
        " bytes, but was assigned " + (req.gpus.empty() ? std::string("no GPU") : assigned_gpus) + " under " +
        std::to_string(req.mem_limit));

  for (const auto& lib : req.task_libraries)
    if (!::dlopen(lib.c_str(), RTLD_NOW | RTLD_GLOBAL)) die(std::string("cannot load task library: ") + ::dlerror());

  ser::hello_message hello;
  hello.pid = ::getpid();
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) hello.visible_devices = v;
  if (const char* v = std::getenv("CUDA_DEVICE_ORDER")) hello.device_order = v;
  try {
    ser::send_message(ser::control_fd, hello);
  } catch (const std::exception& e) {
    die(std::string("cannot reach the supervisor: ") + e.what());
  }

  std::vector<gpu_device> devices;
  for (const auto& g : req.gpus) devices.push_back({.index = g.index, .uuid = g.uuid, .memory = g.memory});
  this_worker().assign({.devices = std::move(devices),
                        .kind = req.gpus.empty()         ? device_kind::cpu
                                : req.gpus[0].simulated ? device_kind::simulated
                                                        : device_kind::cuda,
                        .mem_limit = req.mem_limit,
                        .task = req.task,
                        .alloc_conf = req.alloc_conf});

  // Read now and removed, so that processes the task starts do not see it.
  std::string timeline;
  if (const char* t = std::getenv(ser::env::memory_timeline.data())) timeline = t;
  ::unsetenv(ser::env::memory_timeline.data());

  ser::done_message done;
  std::optional<oom_figures> oom;  // for the memory timeline
  segment_sink sink(std::move(assigned.result), req.max_result, std::move(assigned.ring), assigned.stream_event);
  if (sink.has_ring() && req.encoding == static_cast<std::uint32_t>(ser::encoding::binary))
    this_worker().set_result_stream(&sink);
  const std::int64_t start_ns = monotonic_ns();
  std::shared_ptr<void> result;  // the task's result value, encoded: destroyed after reporting
  try {
    const worker::task_info* task = worker::registry::instance().find(req.task);
    if (!task) throw std::invalid_argument("no task named '" + req.task + "' in this worker");
    if (task->result_type == "isorun::blob" && req.encoding == static_cast<std::uint32_t>(ser::encoding::binary)) {
      this_worker().set_output_area([&sink](std::uint64_t n) { return sink.area(n); });
      // A blob is the type of large results; on a GPU they stream through the ring instead
      // (device_result), which needs no mapping of the segment. Not for an early result: it is
      // sealed on `done`, and a process the task forks would inherit the writable mapping made
      // ahead, which refuses the seal (a mapping made by output_blob after the fork is not
      // inherited); without the seal, the result waits for the exit.
      if (!this_worker().has_gpu() && !req.early_result) sink.premap_in_background(req.expected_result);
    }
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
  std::tie(done.peak_allocated, done.peak_reserved) = this_worker().peaks();
  if (!timeline.empty()) write_memory_timeline(timeline.c_str(), start_ns, oom);
  const std::int64_t end_ns = sink.run_end_ns_ ? sink.run_end_ns_ : monotonic_ns();
  done.run_ns = static_cast<std::uint64_t>(end_ns - start_ns);
  if (sink.committed_ns_) {
    done.encode_begin_ns = sink.run_end_ns_;
    done.encode_ns = static_cast<std::uint64_t>(sink.committed_ns_ - sink.run_end_ns_);
  }
  if (req.early_result) {
    // The supervisor seals the result on `done` and hands it over while this process exits:
    // nothing here may still be able to write it, and the task's device memory goes back now.
    this_worker().set_output_area(nullptr);
    if (this_worker().has_gpu()) result.reset();  // device memory it may hold goes back with the rest
    this_worker().release_task_memory();
    sink.close();
  }
  std::cout.flush();
  std::fflush(nullptr);
  try {
    ser::send_message(ser::control_fd, done);
  } catch (const std::exception& e) {
    die(std::string("cannot report to the supervisor: ") + e.what());
  }
  // What the exit would tear down on one core, large pieces given back on all of them: the task's
  // result value (a 1 GiB blob is ~90 ms of freeing on one core here) and, in a CPU worker, the
  // mapping of the result segment (~35 ms per GiB). The supervisor waits for the exit, unless it
  // took the result early. A GPU worker's segment may be page-locked for the driver (output_blob):
  // its exit unmaps it, after the driver lets go, as before.
  result.reset();
  if (!this_worker().has_gpu()) sink.unmap_result();
  // No static destructors: a CUDA context or task library may take long to tear down, and the
  // kernel releases everything this process holds anyway.
  ::_exit(0);
}

}  // namespace

bool is_worker_process() noexcept {
  const char* w = std::getenv(ser::env::worker.data());
  return w && std::strcmp(w, "1") == 0;
}


}  // namespace isorun
