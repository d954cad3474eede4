#pragma once
/// @file this_worker.hpp
/// What a task can ask about the worker it runs in.

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "isorun/alloc/caching_allocator.hpp"
#include "isorun/serialization/blob.hpp"

namespace isorun {

class worker_context {
 public:
  /// True inside an isolated worker; false in an ordinary process.
  [[nodiscard]] bool in_worker() const noexcept { return in_worker_; }
  /// The assigned GPU's physical (NVML) index, or -1 for a CPU-only worker. Inside the worker
  /// this GPU is the only visible one: CUDA device 0.
  [[nodiscard]] int device() const noexcept { return device_; }
  [[nodiscard]] bool has_gpu() const noexcept { return device_ >= 0; }
  /// The assigned GPU's UUID ("" without a GPU).
  [[nodiscard]] const std::string& device_uuid() const noexcept { return device_uuid_; }
  /// Total memory of the assigned GPU, bytes (0 without a GPU).
  [[nodiscard]] std::uint64_t device_memory() const noexcept { return device_memory_; }
  /// The memory cap, bytes; 0 = none.
  [[nodiscard]] std::uint64_t mem_limit() const noexcept { return mem_limit_; }
  /// Name of the running task.
  [[nodiscard]] const std::string& task() const noexcept { return task_; }
  /// The worker's allocator configuration string (ISORUN_ALLOC_CONF syntax).
  [[nodiscard]] const std::string& alloc_conf() const noexcept { return alloc_conf_; }

  /// @brief The worker's capped caching allocator, created on first use: the CUDA backend on the
  ///        assigned GPU (its cap is --mem-limit minus the measured CUDA context), or the host
  ///        backend in a CPU worker (cap = --mem-limit). Configured by --alloc-conf /
  ///        ISORUN_ALLOC_CONF. Outside a worker: a host allocator capped at physical memory.
  /// @throws alloc::config_error for an invalid configuration; out_of_memory if the CUDA context
  ///         alone exceeds the cap; std::runtime_error if the CUDA backend cannot be loaded.
  alloc::caching_allocator& allocator();
  /// @brief A writable buffer of `size` bytes for a task whose result type is `isorun::blob`.
  ///        Inside a worker it lies in the result's shared-memory segment, where the result will
  ///        be (page-locked on a GPU worker, so a device-to-host copy lands there directly):
  ///        return it and nothing is copied on either side. Elsewhere, or for other result
  ///        types, it is an ordinary owned blob, so the same code works everywhere.
  blob output_blob(std::size_t size);
  /// Set by the worker: maps the result segment for a payload of the given size (nullptr if
  /// the running task's result is not a blob).
  void set_output_area(std::function<std::byte*(std::uint64_t)> area) { output_area_ = std::move(area); }

  /// True once allocator() has created the allocator.
  [[nodiscard]] bool has_allocator() const noexcept { return allocator_ != nullptr; }

  /// Sets the context; called once by the worker before the task runs.
  void assign(int device, std::string uuid, std::uint64_t device_memory, std::uint64_t mem_limit, std::string task,
              std::string alloc_conf);

 private:
  bool in_worker_ = false;
  int device_ = -1;
  std::string device_uuid_;
  std::uint64_t device_memory_ = 0;
  std::uint64_t mem_limit_ = 0;
  std::string task_;
  std::string alloc_conf_;
  std::function<std::byte*(std::uint64_t)> output_area_;
  void* cuda_module_ = nullptr;
  std::once_flag allocator_once_;
  std::unique_ptr<alloc::caching_allocator> allocator_;
};

/// @brief The context of the worker this code runs in (in_worker() is false outside one).
worker_context& this_worker() noexcept;

}  // namespace isorun
