#pragma once
/// @file device_buffer.hpp
/// An owned allocation from a caching_allocator (RAII), and the copies in and out of it.
///
/// Device memory is not host memory: on a GPU (and on the simulated device CI uses) host code
/// must not dereference data(); it reaches the bytes through copy_from_host / copy_to_host,
/// which go through the allocator's backend (cudaMemcpy on a GPU).

#include <cstddef>
#include <stdexcept>
#include <utility>

#include "isorun/alloc/caching_allocator.hpp"

namespace isorun::alloc {

class device_buffer {
 public:
  device_buffer() = default;
  /// @brief Allocates `bytes` on `stream`. @throws as caching_allocator::allocate.
  device_buffer(caching_allocator& allocator, std::size_t bytes, stream_id stream = 0)
      : allocator_{&allocator}, data_{allocator.allocate(bytes, stream)}, size_{bytes}, stream_{stream} {}
  device_buffer(device_buffer&& o) noexcept
      : allocator_{std::exchange(o.allocator_, nullptr)},
        data_{std::exchange(o.data_, nullptr)},
        size_{std::exchange(o.size_, 0)},
        stream_{o.stream_} {}
  device_buffer& operator=(device_buffer&& o) noexcept {
    if (this != &o) {
      reset();
      allocator_ = std::exchange(o.allocator_, nullptr);
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
      stream_ = o.stream_;
    }
    return *this;
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() { reset(); }

  /// @brief A new buffer holding a copy of `bytes` host bytes at `src`.
  /// @throws as caching_allocator::allocate and backend::copy.
  static device_buffer from_host(caching_allocator& allocator, const void* src, std::size_t bytes,
                                 stream_id stream = 0) {
    device_buffer b(allocator, bytes, stream);
    b.copy_from_host(src, bytes);
    return b;
  }

  /// @brief Copies `bytes` from host memory at `src` to this buffer at `offset`.
  /// @throws std::out_of_range past the end; as backend::copy.
  void copy_from_host(const void* src, std::size_t bytes, std::size_t offset = 0) {
    check_range(bytes, offset);
    allocator_->memory().copy(static_cast<std::byte*>(data_) + offset, src, bytes, copy_kind::host_to_device, stream_);
  }
  /// @brief Copies `bytes` at `offset` of this buffer to host memory at `dst`.
  /// @throws std::out_of_range past the end; as backend::copy.
  void copy_to_host(void* dst, std::size_t bytes, std::size_t offset = 0) const {
    check_range(bytes, offset);
    allocator_->memory().copy(dst, static_cast<const std::byte*>(data_) + offset, bytes, copy_kind::device_to_host,
                              stream_);
  }

  /// @brief Checksums of this buffer's first `bytes` after a host `header`, chunk by chunk,
  ///        computed where the bytes lie: see backend::checksum_chunks. False if the backend
  ///        cannot. @throws std::out_of_range past the end; as backend::checksum_chunks.
  bool checksum_chunks(const void* header, std::size_t header_bytes, std::size_t bytes, std::size_t chunk,
                       std::uint64_t* out) const {
    check_range(bytes, 0);
    return allocator_->memory().checksum_chunks(header, header_bytes, data_, bytes, chunk, out, stream_);
  }

  /// Device address: hand it to kernels and copies, never dereference it on the host (unless
  /// the allocator's backend is host_accessible()).
  [[nodiscard]] void* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] stream_id stream() const noexcept { return stream_; }
  template <class T>
  [[nodiscard]] T* as() const noexcept {
    return static_cast<T*>(data_);
  }
  /// Frees the allocation now.
  void reset() noexcept {
    if (data_) allocator_->deallocate(data_);
    data_ = nullptr;
    size_ = 0;
  }

 private:
  void check_range(std::size_t bytes, std::size_t offset) const {
    if (offset > size_ || bytes > size_ - offset)
      throw std::out_of_range("device_buffer: " + std::to_string(bytes) + " bytes at offset " + std::to_string(offset) +
                              " exceed its " + std::to_string(size_) + " bytes");
  }
  caching_allocator* allocator_ = nullptr;
  void* data_ = nullptr;
  std::size_t size_ = 0;
  stream_id stream_ = 0;
};

}  // namespace isorun::alloc
