#pragma once
/// @file host_backend.hpp
/// The host backend: mmap'ed memory standing in for a device of a given capacity. Exercises the
/// allocator's policy exactly as on a GPU, so caps and fragmentation are tested without one.

#include <cstddef>
#include <map>
#include <mutex>

#include "isorun/alloc/backend.hpp"

namespace isorun::alloc {

class host_backend final : public backend {
 public:
  /// @param capacity simulated device memory; allocations beyond it fail like a full GPU.
  explicit host_backend(std::uint64_t capacity);
  ~host_backend() override;

  [[nodiscard]] std::string name() const override { return "host"; }
  void* allocate(std::size_t bytes) override;
  void deallocate(void* p, std::size_t bytes) noexcept override;
  [[nodiscard]] memory_info device_memory() const override;
  void* reserve_address(std::size_t bytes) override;
  void release_address(void* p, std::size_t bytes) noexcept override;
  bool map(void* p, std::size_t bytes) override;
  void unmap(void* p, std::size_t bytes) noexcept override;
  event_id record_event(stream_id stream) override;
  bool event_done(event_id event) override;
  void fill(void* p, std::size_t bytes, std::uint8_t value, stream_id stream) override;

  /// @brief Simulates the completion of all work queued on `stream` so far.
  void synchronize(stream_id stream);
  /// @brief Bytes currently backed (segments plus mapped pages).
  [[nodiscard]] std::uint64_t used() const;
  /// @brief Number of events recorded and not yet observed as done.
  [[nodiscard]] std::size_t pending_events() const;

 private:
  mutable std::mutex mutex_;
  std::uint64_t capacity_;
  std::uint64_t used_ = 0;
  std::map<stream_id, std::uint64_t> recorded_, completed_;  // per-stream sequence numbers
  std::map<event_id, std::pair<stream_id, std::uint64_t>> events_;
  event_id next_event_ = 1;
};

}  // namespace isorun::alloc
