#pragma once
// An allocator that records the largest single allocation of the containers that use it, and the
// peak of all their memory together: what
// the decoder's hostile-input tests and the result fuzz target bound (a length in a payload must
// not claim more memory than its bytes could fill).
#include <algorithm>
#include <cstddef>
#include <memory>

namespace isorun::test {

inline std::size_t largest_allocation = 0;
inline std::size_t allocated_now = 0, allocated_peak = 0;  // all such containers' memory together

template <class T>
struct counting_allocator {
  using value_type = T;
  counting_allocator() = default;
  template <class U>
  counting_allocator(const counting_allocator<U>&) noexcept {}
  T* allocate(std::size_t n) {
    largest_allocation = std::max(largest_allocation, n * sizeof(T));
    allocated_peak = std::max(allocated_peak, allocated_now += n * sizeof(T));
    return std::allocator<T>().allocate(n);
  }
  void deallocate(T* p, std::size_t n) noexcept {
    allocated_now -= n * sizeof(T);
    std::allocator<T>().deallocate(p, n);
  }
  friend bool operator==(const counting_allocator&, const counting_allocator&) noexcept { return true; }
};

}  // namespace isorun::test
