#pragma once
/// @file this_worker.hpp
/// What a task can ask about the worker it runs in.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <cereal/archives/json.hpp>

#include "isorun/alloc/caching_allocator.hpp"
#include "isorun/alloc/cuda_module.hpp"
#include "isorun/alloc/device_buffer.hpp"
#include "isorun/export.hpp"
#include "isorun/serialization/blob.hpp"
#include "isorun/worker/checkpoint.hpp"

namespace isorun {

/// What a worker computes on.
enum class device_kind {
  cpu,        ///< no GPU: the allocator is the host backend, host-accessible
  cuda,       ///< a real GPU: the CUDA backend
  simulated,  ///< a simulated GPU (ISORUN_SIMULATE_GPUS): device memory the host cannot touch,
              ///< reached through copies only; tasks compute on the host
};

/// @brief "cpu", "cuda", "simulated".
ISORUN_API const char* to_string(device_kind kind) noexcept;

/// One GPU a worker was assigned.
struct gpu_device {
  int index = 0;    ///< physical (NVML) index; inside the worker it is CUDA device `ordinal`
  int ordinal = 0;  ///< its CUDA device number in this worker (its place in devices())
  std::string uuid;
  std::uint64_t memory = 0;  ///< total memory, bytes
};

class ISORUN_API worker_context {
 public:
  worker_context();

  /// True inside an isolated worker; false in an ordinary process.
  [[nodiscard]] bool in_worker() const noexcept { return in_worker_; }
  /// The GPUs the worker was assigned, in PCI bus order: the only visible ones, CUDA devices
  /// 0, 1, ... in this order. Empty for a CPU-only worker.
  [[nodiscard]] const std::vector<gpu_device>& devices() const noexcept { return assigned_.devices; }
  /// The (first) assigned GPU's physical (NVML) index, or -1 for a CPU-only worker. Inside the
  /// worker it is CUDA device 0.
  [[nodiscard]] int device() const noexcept { return has_gpu() ? assigned_.devices.front().index : -1; }
  /// True if the worker was assigned a GPU, real or simulated.
  [[nodiscard]] bool has_gpu() const noexcept { return !assigned_.devices.empty(); }
  /// What the worker computes on: pick a task's CUDA path only for device_kind::cuda.
  [[nodiscard]] device_kind kind() const noexcept { return assigned_.kind; }
  /// The (first) assigned GPU's UUID ("" without a GPU).
  [[nodiscard]] const std::string& device_uuid() const noexcept;
  /// Total memory of the (first) assigned GPU, bytes (0 without a GPU).
  [[nodiscard]] std::uint64_t device_memory() const noexcept {
    return has_gpu() ? assigned_.devices.front().memory : 0;
  }
  /// The memory cap per device, bytes; 0 = none.
  [[nodiscard]] std::uint64_t mem_limit() const noexcept { return assigned_.mem_limit; }
  /// Name of the running task.
  [[nodiscard]] const std::string& task() const noexcept { return assigned_.task; }
  /// The worker's allocator configuration string (ISORUN_ALLOC_CONF syntax).
  [[nodiscard]] const std::string& alloc_conf() const noexcept { return assigned_.alloc_conf; }

  /// @brief The worker's capped caching allocator, created on first use. Its backend follows
  ///        kind(): the CUDA backend on a real GPU (cap = --mem-limit minus the measured CUDA
  ///        context), the simulated device on a simulated GPU, the host backend in a CPU worker
  ///        (cap = --mem-limit). Configured by --alloc-conf / ISORUN_ALLOC_CONF. Outside a
  ///        worker: a host allocator capped at physical memory. Only the host backend's memory
  ///        may be touched by host code; device memory is reached through
  ///        alloc::device_buffer's copies (or CUDA kernels).
  /// @throws alloc::config_error for an invalid configuration; out_of_memory if the CUDA context
  ///         alone exceeds the cap; std::runtime_error if the CUDA backend cannot be loaded or
  ///         the GPU cannot be used (no driver, say).
  alloc::caching_allocator& allocator() { return allocator(0); }
  /// @brief The capped caching allocator of the `i`-th assigned GPU (CUDA device `i` here), each
  ///        under the same cap (mem_limit() is per device), created on first use like allocator().
  ///        A CPU worker has one: allocator(0).
  /// @throws std::out_of_range for `i` past devices() (past 0 in a CPU worker); what allocator()
  ///         throws.
  alloc::caching_allocator& allocator(std::size_t i);
  /// @brief What the CUDA context of the `i`-th device took when its allocator was created (all
  ///        zero unless kind() is cuda and allocator(i) has run).
  [[nodiscard]] const alloc::cuda_context_info& context_info(std::size_t i = 0) const noexcept;
  /// @brief A writable buffer of `size` bytes for a task whose result type is `isorun::blob`.
  ///        Inside a worker it lies in the result's shared-memory segment, where the result will
  ///        be (page-locked on a GPU worker, so a device-to-host copy lands there directly):
  ///        return it and nothing is copied on either side. Elsewhere, or for other result
  ///        types, it is an ordinary owned blob, so the same code works everywhere. (In a CPU
  ///        worker a `blob(size)` of 32 MiB or more often lands there too, unasked, when the
  ///        pooled segment has the room; output_blob is the way to be sure, and the way on a
  ///        GPU.) A blob placed there before and still alive is moved to private memory first.
  blob output_blob(std::size_t size);
  /// @brief The result of a task whose result type is `isorun::blob`, made in device memory:
  ///        the first `bytes` bytes of `buffer`. Return what it returns as the task's result.
  ///        Inside a worker called through isolated(), the bytes are streamed to the supervisor
  ///        now, slot by slot through a small page-locked ring while the supervisor copies them
  ///        out (result_stream.hpp): no shared mapping of the whole result is made on either
  ///        side, and the result is handed over without waiting for this process to tear down.
  ///        Where the device can, it checksums the bytes itself first (on a GPU a kernel), so
  ///        this process's CPU only starts copies.
  ///        The returned blob only stands for the bytes sent. Elsewhere (outside a worker, or
  ///        for the CLI's JSON results) it is an ordinary blob holding a copy.
  /// @throws std::out_of_range past the buffer's end; what the device copy throws;
  ///         std::logic_error if the task already streamed a result.
  blob device_result(const alloc::device_buffer& buffer, std::size_t bytes);
  /// @brief device_result(buffer, buffer.size()).
  blob device_result(const alloc::device_buffer& buffer) { return device_result(buffer, buffer.size()); }

  /// @brief An intermediate report of the running task: its `step` and the metrics it has
  ///        then, which a sweep's early stopping (ASHA, median) judges while the task runs.
  ///        `metrics` is a JSON object (anything with `dump()`, such as nlohmann::json) or a
  ///        cereal-serializable struct, whose fields become the report's. It is written at once
  ///        as one line `{"step": N, ...}` on the task's stdout (the sweep reads its log as it
  ///        grows; elsewhere it is a line of output), so `metrics` has no field "step".
  template <class T>
  void report(std::int64_t step, const T& metrics) {
    if constexpr (requires { metrics.dump(); }) {
      report_object(step, metrics.dump());
    } else {
      std::ostringstream os;
      {
        cereal::JSONOutputArchive ar(os, cereal::JSONOutputArchive::Options::NoIndent());
        ar(cereal::make_nvp("metrics", metrics));
      }
      report_object(step, unwrap_metrics(os.str()));
    }
  }
  /// @brief report() with the metrics as the text of a JSON object.
  void report_object(std::int64_t step, const std::string& object);
  /// @brief Whether the task has been asked to stop (early stopping pruned its trial, or the
  ///        sweep is stopping), for a task that stops cleanly (a checkpoint, say): from the first
  ///        call on (make it before the first report), a SIGTERM no longer ends the worker at
  ///        once but makes this true, and the task has the stop's grace period to return. The
  ///        stop stands: a pruned trial is journaled with its last report, whatever it returns.
  ///        A task that never asks is ended by the SIGTERM.
  bool should_stop() noexcept;

  /// @brief The trial's latest committed checkpoint, if it has one (in a sweep with
  ///        `checkpoints:`): what this attempt resumes from. nullopt outside such a sweep.
  [[nodiscard]] std::optional<checkpoint_info> latest_checkpoint() const;
  /// @brief Saves checkpoint `step`: `write(folder)` fills a new, empty folder, which is then
  ///        committed whole (fsync'ed and renamed; checkpoint.hpp) and handed to every later
  ///        attempt of the trial. Steps only go forward.
  /// @throws std::logic_error outside a sweep with `checkpoints:`; std::invalid_argument for a
  ///         step not after the latest; what `write` throws (nothing is committed then).
  checkpoint_info checkpoint(std::int64_t step, const std::function<void(const std::filesystem::path&)>& write);
  /// @brief Whether a planned stop is coming (the trial's timeout, the sweep stopping): save a
  ///        checkpoint now, within the stop's grace period. From the first call on, the warning
  ///        signal (`checkpoints: {signal: ...}`, SIGUSR1 by default) no longer ends the worker
  ///        but makes this true; a task that never asks is ended by it.
  bool should_checkpoint() noexcept;

  /// Set by the worker: claims the result segment for a payload of the given size (nullptr if
  /// the running task's result is not a blob).
  void set_output_area(std::function<std::byte*(std::uint64_t)> area) { output_area_ = std::move(area); }

  /// Where device_result() streams to; implemented by the worker around its result ring.
  class result_stream {
   public:
    virtual ~result_stream() = default;
    /// Writes payload bytes [offset, offset + n) into `dst`.
    using fill_fn = std::function<void(std::byte* dst, std::uint64_t offset, std::uint64_t n)>;
    /// The part of the ring's slots a payload of `total` bytes goes through (mapped on first
    /// call), to page-lock before streaming.
    virtual std::span<std::byte> slots(std::uint64_t total) = 0;
    /// Streams a payload of `total` bytes written by `fill`, slot by slot. `chunk_hashes`: the
    /// XXH3-64 of each checksum_chunk of the payload if the device computed them, else empty.
    virtual void write(std::uint64_t total, const fill_fn& fill, std::span<const std::uint64_t> chunk_hashes) = 0;
  };
  /// Set by the worker when the supervisor attached a result ring (nullptr: none), before the
  /// task runs.
  void set_result_stream(result_stream* stream) noexcept { stream_ = stream; }
  /// Called by the worker after the task, before an early hand-over: releases what the task
  /// left held on the device (the output area's page-locking, the allocator's cached memory).
  void release_task_memory() noexcept;

  /// True once allocator() has created the first device's allocator.
  [[nodiscard]] bool has_allocator() const noexcept { return has_allocator(0); }
  /// True once allocator(i) has created the i-th device's allocator.
  [[nodiscard]] bool has_allocator(std::size_t i) const noexcept {
    return i < devices_.size() && devices_[i].allocator != nullptr;
  }
  /// @brief The largest peaks over the devices' allocators that exist: {allocated, reserved}
  ///        bytes (the cap is per device, so the largest is what compares to it).
  [[nodiscard]] std::pair<std::uint64_t, std::uint64_t> peaks() const;

  /// The assignment a worker receives; set once, before the task runs.
  struct assignment {
    std::vector<gpu_device> devices;  ///< empty: CPU only
    device_kind kind = device_kind::cpu;
    std::uint64_t mem_limit = 0;
    std::string task;
    std::string alloc_conf;
  };
  /// Sets the context; called once by the worker before the task runs.
  void assign(assignment a);

 private:
  bool in_worker_ = false;
  assignment assigned_;
  std::function<std::byte*(std::uint64_t)> output_area_;
  result_stream* stream_ = nullptr;
  const alloc::cuda_module_api* cuda_ = nullptr;
  void* registered_ = nullptr;  // the output area while page-locked
  // The result ring: page-locked early, on a thread of its own, once a GPU worker that may
  // stream has its CUDA context (see allocator()); device_result waits for it.
  std::thread ring_locking_;
  std::uint64_t ring_locked_bytes_ = 0;
  // One per assigned device (one in a CPU worker), sized by assign(); a once_flag cannot move, so
  // they live in a fixed array.
  struct device_state {
    std::once_flag once;
    alloc::cuda_context_info context;
    std::unique_ptr<alloc::caching_allocator> allocator;
  };
  static std::string unwrap_metrics(const std::string& wrapped);  // {"metrics": {...}} -> {...}
  // `line` on stdout in one write (a report's, a checkpoint's); `what` names it in an error.
  static void write_line(const char* what, const std::string& line);
  std::unique_ptr<device_state[]> device_states_;
  std::span<device_state> devices_;
};

/// @brief The context of the worker this code runs in (in_worker() is false outside one).
ISORUN_API worker_context& this_worker() noexcept;

}  // namespace isorun
