#pragma once
/// @file simulated_device.hpp
/// A stand-in GPU for machines without one: device memory the host cannot touch.
///
/// Every segment is a memfd mapped twice: the address handed to the allocator's users is mapped
/// PROT_NONE, so host code that dereferences "device" memory dies with SIGSEGV exactly as it
/// would on a real GPU; a second, private read-write alias of the same pages serves copy() and
/// fill(), the only ways in, as cudaMemcpy and cudaMemset are on a GPU. copy() also checks each
/// pointer is on the side its direction says, which cudaMemcpy with an explicit kind does too,
/// and map() refuses (std::invalid_argument) pages that are mapped already, as cuMemMap does.
/// checksum_chunks() runs the CUDA kernel's decomposition of XXH3 on the host.
/// Workers assigned a simulated GPU (ISORUN_SIMULATE_GPUS) get this backend, so CI catches
/// host/device confusion that used to surface only on a GPU.

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "isorun/alloc/backend.hpp"
#include "isorun/alloc/detail/simulated_streams.hpp"

namespace isorun::alloc {

class simulated_device final : public backend {
 public:
  /// @param capacity the simulated GPU's memory; allocations beyond it fail like a full GPU.
  explicit simulated_device(std::uint64_t capacity);
  ~simulated_device() override;
  simulated_device(const simulated_device&) = delete;
  simulated_device& operator=(const simulated_device&) = delete;

  [[nodiscard]] std::string name() const override { return "simulated"; }
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
  /// @brief True if [p, p+bytes) is device memory of this backend (mapped or not).
  [[nodiscard]] bool is_device_memory(const void* p, std::size_t bytes = 1) const;
  /// @brief Bytes currently backed (segments plus mapped pages).
  [[nodiscard]] std::uint64_t used() const;

 private:
  bool do_checksum_chunks(const void* header, std::size_t header_bytes, const void* src, std::size_t bytes,
                          std::size_t chunk, std::uint64_t* out, stream_id stream) override;

  struct region {
    std::byte* device = nullptr;  // PROT_NONE: what users see
    std::byte* alias = nullptr;   // read-write view of the same pages, for copy() and fill()
    std::size_t bytes = 0;
    bool reserved = false;     // reserve_address(): pages count only while mapped
    std::vector<bool> mapped;  // per granule, for reserved regions
  };
  region make_region(std::size_t bytes);
  static void drop_region(region& r) noexcept;
  // The alias of [p, p+bytes), which must lie in one region (and in mapped pages of a reserved
  // one); throws std::invalid_argument naming `role` otherwise. Caller holds mutex_.
  std::byte* alias_of(const void* p, std::size_t bytes, const char* role) const;
  const region* find(const void* p) const;

  mutable std::mutex mutex_;
  std::uint64_t capacity_;
  std::uint64_t used_ = 0;
  std::map<std::uintptr_t, region> regions_;  // by device address
  detail::simulated_streams streams_;
};

}  // namespace isorun::alloc
