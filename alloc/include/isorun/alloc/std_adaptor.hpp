#pragma once
/// @file std_adaptor.hpp
/// A standard-library allocator drawing from a caching_allocator whose backend the host may
/// touch (the host backend of a CPU worker):
/// `std::vector<float, isorun::alloc::std_adaptor<float>> v(isorun::alloc::std_adaptor<float>(a));`
///
/// A container's elements are read and written by host code, so drawing them from device
/// memory would crash on a GPU: the adaptor refuses a device backend up front
/// (std::invalid_argument) instead. For device memory use device_buffer.

#include <cstddef>
#include <stdexcept>
#include <string>

#include "isorun/alloc/caching_allocator.hpp"

namespace isorun::alloc {

template <class T>
class std_adaptor {
 public:
  using value_type = T;
  /// @throws std::invalid_argument if `a`'s backend is device memory (not host_accessible()).
  explicit std_adaptor(caching_allocator& a) : allocator_{&a} {
    if (!a.memory().host_accessible())
      throw std::invalid_argument("std_adaptor: the allocator's backend is '" + a.memory().name() +
                                  "' device memory, which host code cannot touch; keep host containers in host "
                                  "memory and use device_buffer for device memory");
  }
  template <class U>
  std_adaptor(const std_adaptor<U>& o) noexcept : allocator_{o.allocator_} {}

  T* allocate(std::size_t n) { return static_cast<T*>(allocator_->allocate(n * sizeof(T))); }
  void deallocate(T* p, std::size_t) { allocator_->deallocate(p); }

  template <class U>
  bool operator==(const std_adaptor<U>& o) const noexcept {
    return allocator_ == o.allocator_;
  }

 private:
  template <class U>
  friend class std_adaptor;
  caching_allocator* allocator_;
};

}  // namespace isorun::alloc
