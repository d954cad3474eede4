#pragma once
// An allocator that records the largest single allocation of the containers that use it: what
// the decoder's hostile-input tests and the result fuzz target bound (a length in a payload must
// not claim more memory than its bytes could fill).
#include <algorithm>
#include <cstddef>
#include <memory>

namespace isorun::test {

inline std::size_t largest_allocation = 0;

template <class T>
struct counting_allocator {
  using value_type = T;
  counting_allocator() = default;
  template <class U>
  counting_allocator(const counting_allocator<U>&) noexcept {}
  T* allocate(std::size_t n) {
    largest_allocation = std::max(largest_allocation, n * sizeof(T));
    return std::allocator<T>().allocate(n);
  }
  void deallocate(T* p, std::size_t n) noexcept { std::allocator<T>().deallocate(p, n); }
  friend bool operator==(const counting_allocator&, const counting_allocator&) noexcept { return true; }
};

}  // namespace isorun::test
