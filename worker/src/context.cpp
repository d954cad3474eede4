#include "isorun/worker/this_worker.hpp"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <mutex>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "isorun/alloc/config.hpp"
#include "isorun/alloc/host_backend.hpp"
#include "isorun/alloc/out_of_memory.hpp"
#include "isorun/alloc/simulated_device.hpp"
#include "isorun/serialization/machine.hpp"
#include "isorun/serialization/wire.hpp"

namespace isorun {
namespace {

std::string mib(std::uint64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

struct selected_backend {
  std::unique_ptr<alloc::backend> memory;
  std::uint64_t cap = 0;
  std::string origin;  // how the cap was derived, for OOM reports
};

// The one place a worker's device kind becomes a backend and a cap: for its `i`-th device.
selected_backend select_backend(const worker_context& w, std::size_t i, const alloc::cuda_module_api*& cuda,
                                alloc::cuda_context_info& context) {
  const std::string limit = w.mem_limit() ? "--mem-limit " + mib(w.mem_limit()) : "";
  // Which device, in an OOM report, where a worker has several.
  const std::string which = w.devices().size() > 1 ? " on GPU " + std::to_string(w.devices()[i].index) : "";
  switch (w.kind()) {
    case device_kind::cuda: {
      cuda = &alloc::load_cuda_module();
      char error[512] = {};
      const gpu_device& d = w.devices()[i];
      std::unique_ptr<alloc::backend> memory(
          cuda->create_backend(d.uuid.c_str(), d.ordinal, &context, error, sizeof error));
      if (!memory) throw std::runtime_error("cannot use GPU " + d.uuid + ": " + error);
      std::uint64_t cap = w.mem_limit() ? w.mem_limit() : memory->device_memory().total;
      std::string origin = (w.mem_limit() ? limit : "device memory") + which;
      if (const std::uint64_t ctx = context.counted_bytes) {
        if (ctx >= cap)
          throw out_of_memory("the CUDA context alone takes " + mib(ctx) + ", more than the " + mib(cap) + " cap");
        cap -= ctx;
        origin += " minus " + mib(ctx) + " CUDA context";
      }
      return {std::move(memory), cap, origin};
    }
    case device_kind::simulated: {
      const std::uint64_t memory = w.devices()[i].memory;
      const std::uint64_t cap = w.mem_limit() ? w.mem_limit() : memory;
      return {std::make_unique<alloc::simulated_device>(memory), cap,
              (w.mem_limit() ? limit : "device memory") + which + ", simulated GPU"};
    }
    case device_kind::cpu: break;
  }
  // CPU worker, or a process outside isorun: the host backend, capped like a device would be.
  const std::uint64_t ram = serialization::physical_memory();
  const std::uint64_t cap = w.mem_limit() ? w.mem_limit() : ram;
  return {std::make_unique<alloc::host_backend>(cap), cap, w.mem_limit() ? limit + ", host backend" : "host memory"};
}

}  // namespace

const char* to_string(device_kind kind) noexcept {
  switch (kind) {
    case device_kind::cpu: return "cpu";
    case device_kind::cuda: return "cuda";
    case device_kind::simulated: return "simulated";
  }
  return "?";
}

worker_context::worker_context() : device_states_{new device_state[1]}, devices_{device_states_.get(), 1} {}

void worker_context::assign(assignment a) {
  in_worker_ = true;
  for (std::size_t i = 0; i < a.devices.size(); ++i) a.devices[i].ordinal = static_cast<int>(i);
  // One allocator per device (one for a CPU worker). A warm worker assigns twice, the same one
  // device both times, and keeps the allocator it prepared.
  const std::size_t n = std::max<std::size_t>(1, a.devices.size());
  if (n != devices_.size()) {
    device_states_.reset(new device_state[n]);
    devices_ = {device_states_.get(), n};
  }
  assigned_ = std::move(a);
}

const std::string& worker_context::device_uuid() const noexcept {
  static const std::string none;
  return has_gpu() ? assigned_.devices.front().uuid : none;
}

alloc::caching_allocator& worker_context::allocator(std::size_t i) {
  if (i >= devices_.size())
    throw std::out_of_range(
        "allocator(" + std::to_string(i) + "): this worker has " +
        (has_gpu() ? std::to_string(devices_.size()) + " GPU(s)" : std::string("no GPU (allocator(0) only)")));
  device_state& d = devices_[i];
  std::call_once(d.once, [&] {
    std::string conf = assigned_.alloc_conf;
    if (conf.empty())
      if (const char* env = std::getenv("ISORUN_ALLOC_CONF")) conf = env;
    const auto config = alloc::alloc_config::parse(conf);
    auto selected = select_backend(*this, i, cuda_, d.context);
    d.allocator = std::make_unique<alloc::caching_allocator>(std::move(selected.memory), selected.cap, config,
                                                             selected.origin);
    // A GPU task that may stream its result: page-lock the ring now, while the task computes
    // (pinning 64 MiB of pages costs milliseconds), not after its result is ready.
    if (i == 0 && stream_ && assigned_.kind == device_kind::cuda)
      ring_locking_ = std::thread([this] {
        const auto slots = stream_->slots(std::numeric_limits<std::uint64_t>::max());
        if (cuda_->host_register(slots.data(), slots.size()) == 0) ring_locked_bytes_ = slots.size();
      });
  });
  return *d.allocator;
}

const alloc::cuda_context_info& worker_context::context_info(std::size_t i) const noexcept {
  static const alloc::cuda_context_info none;
  return i < devices_.size() ? devices_[i].context : none;
}

std::pair<std::uint64_t, std::uint64_t> worker_context::peaks() const {
  std::uint64_t allocated = 0, reserved = 0;
  for (const auto& d : devices_)
    if (d.allocator) {
      const auto st = d.allocator->stats();
      allocated = std::max(allocated, static_cast<std::uint64_t>(st.allocated_bytes.peak));
      reserved = std::max(reserved, static_cast<std::uint64_t>(st.reserved_bytes.peak));
    }
  return {allocated, reserved};
}

blob worker_context::output_blob(std::size_t size) {
  if (!in_worker_ || !output_area_) return blob(size);
  // The payload of a blob result is its 8-byte length, then the bytes: put them where the
  // encoder will find them, so encoding only checksums.
  std::byte* area = output_area_(sizeof(std::uint64_t) + size);
  if (!area) return blob(size);
  if (assigned_.kind == device_kind::cuda) {
    allocator();  // loads the CUDA module
    // Best effort: pageable memory works too.
    if (cuda_->host_register(area + sizeof(std::uint64_t), size) == 0) registered_ = area + sizeof(std::uint64_t);
  }
  return blob::external(area + sizeof(std::uint64_t), size);
}

blob worker_context::device_result(const alloc::device_buffer& buffer, std::size_t bytes) {
  if (bytes > buffer.size())
    throw std::out_of_range("device_result: " + std::to_string(bytes) + " bytes of a " + std::to_string(buffer.size()) +
                            "-byte buffer");
  if (!in_worker_ || !stream_) {  // nowhere to stream to: an ordinary blob
    blob copy(bytes);
    if (bytes) buffer.copy_to_host(copy.mutable_data(), bytes);
    return copy;
  }
  // The payload of a blob result: its length (as cereal writes a size tag), then its bytes.
  const std::uint64_t length = bytes;
  const bool trace = std::getenv("ISORUN_STREAM_TRACE") != nullptr;
  const auto t0 = std::chrono::steady_clock::now();
  if (assigned_.kind == device_kind::cuda) allocator();  // loads the CUDA module, starts the ring's locking
  // Each chunk's checksum computed where the bytes lie (on a GPU a kernel, which runs while the
  // ring is still being page-locked), so this process's CPU only starts copies; where the
  // backend cannot, the CPU hashes each slot as it lands. ISORUN_STREAM_DEVICE_HASH=0 turns it
  // off, to compare the two.
  std::vector<std::uint64_t> chunk_hashes;
  if (const char* e = std::getenv("ISORUN_STREAM_DEVICE_HASH"); !e || std::strcmp(e, "0") != 0) {
    chunk_hashes.resize((sizeof length + bytes + serialization::checksum_chunk - 1) / serialization::checksum_chunk);
    if (!buffer.checksum_chunks(&length, sizeof length, bytes, serialization::checksum_chunk, chunk_hashes.data()))
      chunk_hashes.clear();
  }
  const auto hashed = std::chrono::steady_clock::now();
  if (ring_locking_.joinable()) ring_locking_.join();
  const std::span<std::byte> slots = stream_->slots(sizeof length + bytes);
  if (assigned_.kind == device_kind::cuda && ring_locked_bytes_ < slots.size()) {
    // Page-locked, the slots take the device's DMA directly; pageable memory works too, slower.
    // Only the part this payload uses: pinning costs per page.
    if (ring_locked_bytes_) cuda_->host_unregister(slots.data());
    ring_locked_bytes_ = cuda_->host_register(slots.data(), slots.size()) == 0 ? slots.size() : 0;
  }
  const auto t1 = std::chrono::steady_clock::now();
  stream_->write(
      sizeof length + bytes,
      [&](std::byte* dst, std::uint64_t offset, std::uint64_t n) {
        if (offset < sizeof length) {
          const std::uint64_t head = std::min<std::uint64_t>(n, sizeof length - offset);
          std::memcpy(dst, reinterpret_cast<const std::byte*>(&length) + offset, head);
          dst += head;
          offset += head;
          n -= head;
        }
        if (n) buffer.copy_to_host(dst, n, offset - sizeof length);
      },
      chunk_hashes);
  if (trace) {  // ISORUN_STREAM_TRACE: where a streamed result's time goes, on stderr
    const auto t2 = std::chrono::steady_clock::now();
    char hashing[64];
    if (chunk_hashes.empty()) std::snprintf(hashing, sizeof hashing, "by the CPU as they stream");
    else
      std::snprintf(hashing, sizeof hashing, "on the device in %.2f ms",
                    std::chrono::duration<double, std::milli>(hashed - t0).count());
    std::fprintf(stderr,
                 "isorun stream: %llu bytes; chunks checksummed %s; %llu of the ring mapped and %s, waited %.2f ms "
                 "in all; streamed in %.2f ms\n",
                 static_cast<unsigned long long>(bytes), hashing, static_cast<unsigned long long>(slots.size()),
                 ring_locked_bytes_ ? "page-locked" : "not page-locked",
                 std::chrono::duration<double, std::milli>(t1 - t0).count(),
                 std::chrono::duration<double, std::milli>(t2 - t1).count());
  }
  return blob::streamed(bytes);
}

void worker_context::release_task_memory() noexcept {
  if (registered_) {
    cuda_->host_unregister(registered_);  // a page-locked page would keep the segment unsealable
    registered_ = nullptr;
  }
  for (auto& d : devices_) try {
      if (d.allocator) d.allocator->empty_cache();
    } catch (...) {
    }
}

namespace {
volatile sig_atomic_t stop_asked = 0;  // set by SIGTERM once a task has asked should_stop()
extern "C" void on_stop_signal(int) { stop_asked = 1; }
}  // namespace

void worker_context::report_object(std::int64_t step, const std::string& object) {
  std::size_t open = object.find('{');
  const std::size_t close = object.rfind('}');
  if (open == std::string::npos || close == std::string::npos || close < open)
    throw std::invalid_argument("report: the metrics are not a JSON object: " + object.substr(0, 80));
  std::string body = object.substr(open + 1, close - open - 1);
  const bool empty = body.find_first_not_of(" \t\r\n") == std::string::npos;
  for (char& c : body)
    if (c == '\n' || c == '\r') c = ' ';  // one line, whatever the archive's layout
  write_line("report", "{\"step\": " + std::to_string(step) + (empty ? "" : ", " + body) + "}\n");
}

void worker_context::write_line(const char* what, const std::string& line) {
  std::fflush(stdout);  // what the task printed before comes first
  // One write: a line is never interleaved with other output, nor seen in part.
  for (std::size_t done = 0; done < line.size();) {
    const ssize_t n = ::write(STDOUT_FILENO, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw std::runtime_error(std::string(what) + ": cannot write to stdout: " + std::strerror(errno));
    done += static_cast<std::size_t>(n);
  }
}

std::string worker_context::unwrap_metrics(const std::string& wrapped) {
  const std::size_t colon = wrapped.find(':'), close = wrapped.rfind('}');
  if (colon == std::string::npos || close == std::string::npos || close <= colon) return "{}";
  return wrapped.substr(colon + 1, close - colon - 1);
}

bool worker_context::should_stop() noexcept {
  static std::once_flag installed;
  std::call_once(installed, [] {
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    ::sigaction(SIGTERM, &sa, nullptr);
  });
  return stop_asked != 0;
}

namespace {
volatile sig_atomic_t checkpoint_asked = 0;  // set by the warning signal once a task has asked
extern "C" void on_checkpoint_signal(int) { checkpoint_asked = 1; }

std::optional<checkpoint_folder> trial_checkpoints() {
  const char* dir = std::getenv(checkpoint_env::dir);
  if (!dir || !*dir) return std::nullopt;
  const char* keep = std::getenv(checkpoint_env::keep);
  return checkpoint_folder(dir, keep && *keep ? std::atoi(keep) : 1);
}
}  // namespace

std::optional<checkpoint_info> worker_context::latest_checkpoint() const {
  const auto folder = trial_checkpoints();
  return folder ? folder->latest() : std::nullopt;
}

checkpoint_info worker_context::checkpoint(std::int64_t step,
                                           const std::function<void(const std::filesystem::path&)>& write) {
  auto folder = trial_checkpoints();
  if (!folder)
    throw std::logic_error(
        "checkpoint(): this task does not run in a sweep with checkpoints (add checkpoints: "
        "{keep: 2} to the spec)");
  folder->check_step(step);  // refused before anything is written
  const std::filesystem::path staged = folder->stage(step);
  checkpoint_info committed;
  try {
    write(staged);
    committed = folder->commit(staged, step);
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove_all(staged, ec);  // a checkpoint not committed leaves nothing
    throw;
  }
  write_line("checkpoint", "{\"checkpoint\": " + std::to_string(step) + "}\n");  // the sweep tells its trackers
  return committed;
}

bool worker_context::should_checkpoint() noexcept {
  static std::once_flag installed;
  std::call_once(installed, [] {
    const char* named = std::getenv(checkpoint_env::signal);
    struct sigaction sa {};
    sa.sa_handler = on_checkpoint_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    ::sigaction(named && *named ? std::atoi(named) : SIGUSR1, &sa, nullptr);
  });
  return checkpoint_asked != 0;
}

worker_context& this_worker() noexcept {
  static worker_context context;
  return context;
}

}  // namespace isorun
