#pragma once
/// @file backend.hpp
/// Where the caching allocator gets its memory from. The allocator's policy code is the same on
/// every backend; a backend only maps and unmaps memory, copies between host and device, and
/// orders work on streams.

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "isorun/alloc/export.hpp"

namespace isorun::alloc {

/// A stream, as an opaque id (a cudaStream_t on the CUDA backend; 0 is the default stream).
using stream_id = std::uintptr_t;
/// A recorded event, as an opaque id.
using event_id = std::uintptr_t;

struct memory_info {
  std::uint64_t free = 0;
  std::uint64_t total = 0;
};

/// Direction of a copy through a backend.
enum class copy_kind {
  host_to_device,
  device_to_host,
  device_to_device,
};

class ISORUN_ALLOC_API backend {
 public:
  virtual ~backend() = default;

  /// @brief "host", "simulated" or "cuda".
  [[nodiscard]] virtual std::string name() const = 0;

  /// @brief True if the host may dereference memory from this backend (the host backend only).
  ///        Device memory, real or simulated, is reached through copy() alone.
  [[nodiscard]] virtual bool host_accessible() const noexcept { return false; }

  /// @brief A fresh segment of `bytes` (a multiple of 2 MiB), or nullptr if the device is out
  ///        of memory. @throws std::runtime_error for failures other than lack of memory.
  virtual void* allocate(std::size_t bytes) = 0;
  /// @brief Returns a segment obtained from allocate().
  virtual void deallocate(void* p, std::size_t bytes) noexcept = 0;

  /// @brief Device memory as the device sees it (all processes).
  [[nodiscard]] virtual memory_info device_memory() const = 0;

  /// @brief Granule of the virtual-memory API (2 MiB on current GPUs).
  [[nodiscard]] virtual std::size_t granularity() const { return 2u << 20; }
  /// @brief Reserves `bytes` of address space without memory behind it; nullptr on failure.
  virtual void* reserve_address(std::size_t bytes) = 0;
  /// @brief Releases an address range from reserve_address() (everything in it unmapped).
  virtual void release_address(void* p, std::size_t bytes) noexcept = 0;
  /// @brief Backs [p, p+bytes) (whole granules) with memory, all of it or none: callers map a
  ///        run of pages in one call, so its fixed costs (on a GPU, setting access rights and
  ///        the page-table update behind it) are paid once per run. Any granule-aligned part of
  ///        the range may later be unmapped on its own. @return false if the device is out of
  ///        memory; nothing is mapped then.
  virtual bool map(void* p, std::size_t bytes) = 0;
  /// @brief Removes the memory behind [p, p+bytes) (whole granules); the addresses stay
  ///        reserved. It does not wait for work that may still use the memory (cuMemUnmap does
  ///        not synchronize, unlike cudaFree): callers synchronize() the stream that used it first.
  virtual void unmap(void* p, std::size_t bytes) noexcept = 0;
  /// @brief Waits until the work queued on `stream` so far has completed.
  virtual void synchronize(stream_id stream) noexcept = 0;

  /// @brief Copies `bytes` from `src` to `dst`, ordered on `stream`; returns once the copy is
  ///        complete (the host may reuse or read its side at once).
  /// @throws std::invalid_argument if a pointer is not on the side `kind` says (a host pointer
  ///         given as device memory, or the reverse), where the backend can tell;
  ///         std::runtime_error if the copy fails.
  virtual void copy(void* dst, const void* src, std::size_t bytes, copy_kind kind, stream_id stream = 0) = 0;

  /// @brief Records an event on `stream`, completed once work queued so far on it is done.
  virtual event_id record_event(stream_id stream) = 0;
  /// @brief True once `event` has completed; a completed event is released.
  virtual bool event_done(event_id event) = 0;

  /// @brief Fills `bytes` at `p` with `value` (debug fill of new allocations).
  virtual void fill(void* p, std::size_t bytes, std::uint8_t value, stream_id stream) = 0;

  /// Longest header checksum_chunks() takes.
  static constexpr std::size_t max_checksum_header = 16;

  /// @brief Checksums device memory where it lies, without copying it to the host. The input is
  ///        `header_bytes` host bytes at `header` (a length tag, say) followed by `bytes` bytes
  ///        of device memory at `src`; out[c] becomes the XXH3-64 (seed 0) of its c-th piece of
  ///        `chunk` bytes (the last may be shorter), computed after the work queued on `stream`.
  ///        `out` holds ceil((header_bytes + bytes) / chunk) entries.
  /// @return true once `out` is written; false, with nothing done, if this backend cannot (the
  ///         caller then checksums a host copy).
  /// @throws std::invalid_argument for a header over max_checksum_header bytes, a chunk of 0,
  ///         or a source that is not device memory (where the backend can tell);
  ///         std::runtime_error if the device fails.
  bool checksum_chunks(const void* header, std::size_t header_bytes, const void* src, std::size_t bytes,
                       std::size_t chunk, std::uint64_t* out, stream_id stream = 0) {
    if (header_bytes > max_checksum_header)
      throw std::invalid_argument("checksum_chunks: a header of " + std::to_string(header_bytes) + " bytes (at most " +
                                  std::to_string(max_checksum_header) + ")");
    if (chunk == 0) throw std::invalid_argument("checksum_chunks: a chunk of 0 bytes");
    return do_checksum_chunks(header, header_bytes, src, bytes, chunk, out, stream);
  }

 private:
  /// checksum_chunks() with its arguments checked; the default cannot (returns false).
  virtual bool do_checksum_chunks(const void* /*header*/, std::size_t /*header_bytes*/, const void* /*src*/,
                                  std::size_t /*bytes*/, std::size_t /*chunk*/, std::uint64_t* /*out*/,
                                  stream_id /*stream*/) {
    return false;
  }
};

}  // namespace isorun::alloc
