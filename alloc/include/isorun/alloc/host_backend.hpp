#pragma once
/// @file host_backend.hpp
/// The host backend: mmap'ed host memory standing in for a device of a given capacity, for CPU
/// workers. The host may touch it (host_accessible()); for a stand-in GPU whose memory the host
/// must not touch, see simulated_device.hpp.

#include <cstddef>
#include <mutex>

#include "isorun/alloc/backend.hpp"
#include "isorun/alloc/detail/simulated_streams.hpp"

namespace isorun::alloc {

class host_backend final : public backend {
 public:
  /// @param capacity simulated device memory; allocations beyond it fail like a full GPU.
  explicit host_backend(std::uint64_t capacity);
  ~host_backend() override;

  [[nodiscard]] std::string name() const override { return "host"; }
  [[nodiscard]] bool host_accessible() const noexcept override { return true; }
  void* allocate(std::size_t bytes) override;
  void deallocate(void* p, std::size_t bytes) noexcept override;
  [[nodiscard]] memory_info device_memory() const override;
  void* reserve_address(std::size_t bytes) override;
  void release_address(void* p, std::size_t bytes) noexcept override;
  bool map(void* p, std::size_t bytes) override;
  void unmap(void* p, std::size_t bytes) noexcept override;
  void copy(void* dst, const void* src, std::size_t bytes, copy_kind kind, stream_id stream = 0) override;
  event_id record_event(stream_id stream) override { return streams_.record(stream); }
  bool event_done(event_id event) override { return streams_.done(event); }
  void fill(void* p, std::size_t bytes, std::uint8_t value, stream_id stream) override;

  /// @brief Simulates the completion of all work queued on `stream` so far (a test calls it
  ///        to say "the GPU finished"; the allocator calls it where it would wait on a GPU).
  void synchronize(stream_id stream) noexcept override { streams_.synchronize(stream); }
  /// @brief Bytes currently backed (segments plus mapped pages).
  [[nodiscard]] std::uint64_t used() const;
  /// @brief Number of events recorded and not yet observed as done.
  [[nodiscard]] std::size_t pending_events() const { return streams_.pending(); }

 private:
  mutable std::mutex mutex_;
  std::uint64_t capacity_;
  std::uint64_t used_ = 0;
  detail::simulated_streams streams_;
};

}  // namespace isorun::alloc
