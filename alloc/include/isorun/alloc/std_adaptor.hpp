#pragma once
/// @file std_adaptor.hpp
/// A standard-library allocator drawing from a caching_allocator, for containers on the host
/// backend: `std::vector<float, isorun::alloc::std_adaptor<float>> v(alloc_adaptor);`

#include <cstddef>

#include "isorun/alloc/caching_allocator.hpp"

namespace isorun::alloc {

template <class T>
class std_adaptor {
 public:
  using value_type = T;
  explicit std_adaptor(caching_allocator& a) noexcept : allocator_{&a} {}
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
