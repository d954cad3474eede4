#pragma once
/// @file device_buffer.hpp
/// An owned allocation from a caching_allocator (RAII).

#include <cstddef>
#include <utility>

#include "isorun/alloc/caching_allocator.hpp"

namespace isorun::alloc {

class device_buffer {
 public:
  device_buffer() = default;
  /// @brief Allocates `bytes` on `stream`. @throws as caching_allocator::allocate.
  device_buffer(caching_allocator& allocator, std::size_t bytes, stream_id stream = 0)
      : allocator_{&allocator}, data_{allocator.allocate(bytes, stream)}, size_{bytes} {}
  device_buffer(device_buffer&& o) noexcept
      : allocator_{std::exchange(o.allocator_, nullptr)}, data_{std::exchange(o.data_, nullptr)}, size_{o.size_} {}
  device_buffer& operator=(device_buffer&& o) noexcept {
    if (this != &o) {
      reset();
      allocator_ = std::exchange(o.allocator_, nullptr);
      data_ = std::exchange(o.data_, nullptr);
      size_ = o.size_;
    }
    return *this;
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() { reset(); }

  [[nodiscard]] void* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  template <class T>
  [[nodiscard]] T* as() const noexcept {
    return static_cast<T*>(data_);
  }
  /// Frees the allocation now.
  void reset() noexcept {
    if (data_) allocator_->deallocate(data_);
    data_ = nullptr;
  }

 private:
  caching_allocator* allocator_ = nullptr;
  void* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace isorun::alloc
