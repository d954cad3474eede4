#include "isorun/job.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <atomic>
#include <deque>
#include <mutex>

#include "isorun/alloc/config.hpp"
#include "isorun/errors.hpp"
#include "isorun/process.hpp"
#include "isorun/serialization/codec.hpp"
#include "isorun/serialization/control.hpp"
#include "isorun/serialization/request.hpp"
#include "isorun/serialization/segment_pool.hpp"
#include "isorun/serialization/shm_segment.hpp"
#include "isorun/unique_fd.hpp"
#include "isorun/units.hpp"

extern char** environ;

namespace isorun::runner {
namespace ser = isorun::serialization;
using clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

using ser::monotonic_ns;

bool starts_with_key(const std::string& entry, std::string_view key) {
  return entry.size() > key.size() && entry.compare(0, key.size(), key) == 0 && entry[key.size()] == '=';
}

void write_all(int fd, const char* data, std::size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return;  // a broken echo target must not break the job
    }
    data += w;
    n -= static_cast<std::size_t>(w);
  }
}

// Keeps the last N lines of a stream, each capped, without unbounded growth.
class line_tail {
 public:
  explicit line_tail(std::size_t max_lines) : max_lines_{max_lines} {}
  void feed(const char* data, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      if (data[i] == '\n') {
        push();
      } else if (partial_.size() < max_line) {
        partial_.push_back(data[i]);
      }
    }
  }
  std::vector<std::string> lines() {
    if (!partial_.empty()) push();
    return {lines_.begin(), lines_.end()};
  }

 private:
  static constexpr std::size_t max_line = 1000;
  void push() {
    lines_.push_back(std::move(partial_));
    partial_.clear();
    while (lines_.size() > max_lines_) lines_.pop_front();
  }
  std::size_t max_lines_;
  std::string partial_;
  std::deque<std::string> lines_;
};

}  // namespace

std::string visible_devices_for(const std::optional<gpu_info>& gpu) {
  if (!gpu) return "";
  return gpu->uuid.empty() ? std::to_string(gpu->index) : gpu->uuid;
}

std::vector<std::string> worker_environment(const std::optional<gpu_info>& gpu, std::uint64_t mem_limit,
                                            const std::vector<std::string>& extra) {
  static constexpr std::string_view ours[] = {"ISORUN_WORKER", "ISORUN_SHIM", "CUDA_VISIBLE_DEVICES",
                                              "CUDA_DEVICE_ORDER", "ISORUN_MEM_LIMIT", "ISORUN_GPU"};
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string entry(*e);
    if (std::none_of(std::begin(ours), std::end(ours), [&](auto key) { return starts_with_key(entry, key); }))
      env.push_back(std::move(entry));
  }
  env.push_back("CUDA_VISIBLE_DEVICES=" + visible_devices_for(gpu));
  env.push_back("CUDA_DEVICE_ORDER=PCI_BUS_ID");
  env.push_back("ISORUN_GPU=" + (gpu ? std::to_string(gpu->index) : std::string()));
  env.push_back("ISORUN_MEM_LIMIT=" + std::to_string(mem_limit));
  for (const auto& e : extra) env.push_back(e);
  return env;
}

struct job::state {
  job_spec spec;
  std::shared_ptr<ser::pooled_segment> request_segment, result_segment;
  unique_fd control, stderr_read, cancel_event;
  child process;
  clock::time_point started;
  std::string expected_devices;

  std::mutex wait_mutex;
  std::atomic<bool> finished{false};
  job_result result;

  // Filled in while watching.
  std::optional<ser::hello_message> hello;
  std::optional<ser::done_message> done;
  std::string violation;  // why the worker's messages were rejected
  line_tail tail{20};
};

job::job(std::unique_ptr<state> s) : state_{std::move(s)} {}

job::~job() {
  if (state_ && !state_->finished) {
    cancel();
    wait();
  }
}

pid_t job::pid() const noexcept { return state_->process.pid(); }

void job::cancel() noexcept {
  const std::uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(state_->cancel_event.get(), &one, sizeof one);
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
  if (spec.gpu && spec.mem_limit > spec.gpu->total_memory)
    throw usage_error("mem-limit " + format_size(spec.mem_limit) + " exceeds GPU " + std::to_string(spec.gpu->index) +
                      "'s " + format_size(spec.gpu->total_memory));
}

std::shared_ptr<job> job::start(job_spec spec) {
  check_job_spec(spec);
  static std::once_flag sweep_once;
  std::call_once(sweep_once, [] { ser::remove_stale_segments(); });

  auto s = std::make_unique<state>();
  s->tail = line_tail(spec.stderr_tail_lines);
  s->expected_devices = visible_devices_for(spec.gpu);
  auto& pool = ser::segment_pool::instance();

  unique_fd out_file, stdout_pipe_dup;
  int sv[2], err_pipe[2];
  try {
    ser::request req;
    req.task = spec.task;
    req.encoding = static_cast<std::uint32_t>(spec.encoding);
    req.task_libraries = spec.task_libraries;
    req.mem_limit = spec.mem_limit;
    if (spec.gpu) {
      req.gpu_index = spec.gpu->index;
      req.gpu_uuid = spec.gpu->uuid;
      req.gpu_memory = spec.gpu->total_memory;
      req.gpu_simulated = spec.gpu->simulated;
    }
    req.alloc_conf = spec.alloc_conf;
    req.max_result = spec.max_result;
    req.args = std::move(spec.args);
    const std::uint64_t n = ser::encoded_size(req);
    s->request_segment = pool.acquire(ser::header_size + n);
    std::byte* base = s->request_segment->writable(ser::header_size + n);
    const std::uint64_t sum = ser::encode_into(base + ser::header_size, n, req);
    ser::write_header(base, ser::request_magic, spec.encoding, n, sum);
    s->result_segment = pool.acquire(0, true);
  } catch (const std::system_error& e) {
    throw internal_error(std::string("cannot prepare shared memory for the worker: ") + e.what());
  }

  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
    throw internal_error(std::string("socketpair: ") + std::strerror(errno));
  s->control.reset(sv[0]);
  unique_fd worker_control(sv[1]);
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) throw internal_error(std::string("pipe2: ") + std::strerror(errno));
  s->stderr_read.reset(err_pipe[0]);
  unique_fd stderr_write(err_pipe[1]);
  ::fcntl(err_pipe[0], F_SETFL, O_NONBLOCK);
  s->cancel_event.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!s->cancel_event) throw internal_error(std::string("eventfd: ") + std::strerror(errno));
  unique_fd devnull(::open("/dev/null", O_RDONLY | O_CLOEXEC));

  int stdout_fd = STDOUT_FILENO;
  if (spec.stdout_to == stdout_mode::to_stderr) {
    stdout_fd = stderr_write.get();
  } else if (spec.stdout_to == stdout_mode::file) {
    out_file.reset(::open(spec.stdout_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!out_file) throw internal_error("cannot open " + spec.stdout_path + ": " + std::strerror(errno));
    stdout_fd = out_file.get();
  }

  spawn_options opts;
  opts.executable = spec.executable.empty() ? self_executable() : spec.executable;
  opts.args = {"isorun-worker", spec.task};
  opts.env = worker_environment(spec.gpu, spec.mem_limit, spec.extra_env);
  opts.env.push_back("ISORUN_WORKER=1");
  opts.fds = {{0, devnull.get()},
              {1, stdout_fd},
              {2, stderr_write.get()},
              {ser::worker_control_fd, worker_control.get()},
              {ser::worker_request_fd, s->request_segment->fd()},
              {ser::worker_result_fd, s->result_segment->fd()}};
  s->started = clock::now();
  try {
    s->process = spawn(opts);
  } catch (const spawn_error& e) {
    throw internal_error(std::string("cannot start worker: ") + e.what());
  }
  s->spec = std::move(spec);
  return std::shared_ptr<job>(new job(std::move(s)));
}

bool job::wait_for(std::chrono::milliseconds timeout) {
  {
    std::unique_lock lock(state_->wait_mutex, std::try_to_lock);
    if (lock.owns_lock() && state_->finished) return true;
  }
  if (!state_->process.wait_for(timeout) && !state_->finished) return false;
  wait();
  return true;
}

const job_result& job::wait() {
  state& s = *state_;
  std::lock_guard lock(s.wait_mutex);
  if (s.finished) return s.result;

  enum class phase { running, terminating, killed } ph = phase::running;
  outcome_kind forced{};
  bool forced_set = false;
  std::string forced_message;
  auto force = [&](outcome_kind k, std::string why) {
    if (!forced_set) {
      forced = k;
      forced_message = std::move(why);
      forced_set = true;
    }
  };
  constexpr auto never = clock::time_point::max();
  clock::time_point deadline = s.spec.timeout.count() > 0 ? s.started + s.spec.timeout : never;

  auto escalate = [&] {
    if (ph == phase::running) {
      s.process.signal(SIGTERM);
      ph = phase::terminating;
      deadline = clock::now() + s.spec.grace;
    } else if (ph == phase::terminating) {
      s.process.signal(SIGKILL);
      ph = phase::killed;
      deadline = never;
    }
  };

  auto read_control = [&] {
    while (s.control) {
      ser::receive_result r;
      try {
        r = ser::try_receive(s.control.get());
      } catch (const std::exception& e) {
        force(outcome_kind::invalid_result, std::string("malformed control message from worker: ") + e.what());
        s.control.reset();
        return;
      }
      if (r.closed) {
        s.control.reset();
        return;
      }
      if (!r.message) return;
      if (auto* h = std::get_if<ser::hello_message>(&*r.message)) {
        std::string bad;
        if (h->protocol != ser::protocol_version) bad = "protocol version " + std::to_string(h->protocol);
        else if (h->pid != s.process.pid()) bad = "pid " + std::to_string(h->pid) + " (spawned " + std::to_string(s.process.pid()) + ")";
        else if (h->visible_devices != s.expected_devices)
          bad = "CUDA_VISIBLE_DEVICES='" + h->visible_devices + "' (assigned '" + s.expected_devices + "')";
        else if (h->device_order != "PCI_BUS_ID") bad = "CUDA_DEVICE_ORDER='" + h->device_order + "'";
        if (!bad.empty()) force(outcome_kind::invalid_result, "worker handshake mismatch: it reports " + bad);
        s.hello = *h;
      } else {
        s.done = std::get<ser::done_message>(*r.message);
      }
    }
  };

  auto read_stderr = [&]() -> bool {  // false at EOF
    char buf[16384];
    for (;;) {
      ssize_t n = ::read(s.stderr_read.get(), buf, sizeof buf);
      if (n > 0) {
        s.tail.feed(buf, static_cast<std::size_t>(n));
        if (s.spec.stderr_echo_fd >= 0) write_all(s.spec.stderr_echo_fd, buf, static_cast<std::size_t>(n));
        continue;
      }
      if (n == 0) return false;
      if (errno == EINTR) continue;
      return true;  // EAGAIN
    }
  };

  bool stderr_open = true;
  for (;;) {
    // The control socket is read once the worker is gone: its few small messages wait in the
    // socket buffer, and not waking up for each of them keeps a short task's round trip short.
    pollfd fds[3] = {{s.process.pidfd(), POLLIN, 0},
                     {stderr_open ? s.stderr_read.get() : -1, POLLIN, 0},
                     {s.cancel_event.get(), POLLIN, 0}};
    int timeout_ms = -1;
    if (deadline != never) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
      timeout_ms = static_cast<int>(std::clamp<long long>(left + 1, 0, INT_MAX));
    }
    int rc = ::poll(fds, 3, timeout_ms);
    if (rc < 0 && errno != EINTR) break;
    if (fds[2].revents & POLLIN) {
      std::uint64_t requests = 1;  // the eventfd counts cancels that arrived since the last read
      [[maybe_unused]] auto n = ::read(s.cancel_event.get(), &requests, sizeof requests);
      force(outcome_kind::cancelled, "cancelled by the caller");
      // A first cancel sends SIGTERM, a second one SIGKILL at once.
      for (std::uint64_t i = 0; i < std::min<std::uint64_t>(requests, 2); ++i) escalate();
    }
    if (fds[1].revents) stderr_open = read_stderr();
    if (deadline != never && clock::now() >= deadline) {
      if (ph == phase::running)
        force(outcome_kind::timeout, "timed out after " + format_duration(s.spec.timeout) + "; stopped");
      escalate();
    }
    if (fds[0].revents & POLLIN) break;
  }

  read_control();  // hello and done, waiting in the socket buffer
  const exit_status exited = s.process.reap();  // also kills what is left of the group
  if (stderr_open) read_stderr();
  const auto wall = clock::now() - s.started;

  job_result& r = s.result;
  outcome& o = r.status;
  o.exit = exited;
  o.wall = std::chrono::duration_cast<std::chrono::nanoseconds>(wall);
  o.timeout = s.spec.timeout;
  o.device = s.spec.gpu ? visible_devices_for(s.spec.gpu) : "cpu";
  o.stderr_tail = s.tail.lines();
  if (s.done) {
    o.peak_allocated = s.done->peak_allocated;
    o.peak_reserved = s.done->peak_reserved;
    o.run = std::chrono::nanoseconds(s.done->run_ns);
    r.encode_begin_ns = static_cast<std::int64_t>(s.done->encode_begin_ns);
    r.encode_ns = s.done->encode_ns;
  }

  if (forced_set) {
    o.kind = forced;
    o.message = forced_message;
  } else if (s.done && s.done->status == ser::task_status::ok) {
    try {
      const ser::mapping& m = s.result_segment->current();
      ser::encoding enc{};
      r.payload = ser::open_payload(m.data(), m.size(), ser::result_magic, s.spec.max_result, enc);
      if (enc != s.spec.encoding) throw ser::wire_error("result has a different encoding than requested");
      r.encoding = enc;
      r.owner = s.result_segment;
      r.received_ns = monotonic_ns();
      o.kind = outcome_kind::success;
    } catch (const std::exception& e) {
      r.payload = {};
      o.kind = outcome_kind::invalid_result;
      o.message = std::string("worker result rejected: ") + e.what();
    }
  } else if (s.done && s.done->status == ser::task_status::result_too_large) {
    o.kind = outcome_kind::invalid_result;
    o.message = "worker result rejected: " + s.done->message;
  } else if (s.done) {
    o.kind = s.done->status == ser::task_status::out_of_memory ? outcome_kind::out_of_memory : outcome_kind::task_error;
    o.error_type = s.done->error_type;
    o.message = s.done->message;
  } else {
    o.kind = outcome_kind::crashed;
    o.message = exited.signal ? "worker " + describe(exited)
                              : "worker " + describe(exited) + " without delivering a result";
  }
  s.request_segment.reset();
  if (!r.owner) s.result_segment.reset();
  s.control.reset();
  s.stderr_read.reset();
  s.finished = true;
  return r;
}

}  // namespace isorun::runner
