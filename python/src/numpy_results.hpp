#pragma once
// NumPy arrays made where the worker's result goes.
//
// A function that returns a large array would otherwise have its bytes copied into the result
// segment after it returned: a full copy, and the array's own pages freed at the worker's exit,
// which the call waits for. The worker places the first large blob a task makes in the segment,
// where its payload will hold it (serialization's blob placement, installed by the C++ worker);
// this routes NumPy's large array allocations through that placement (NEP 49's memory handler),
// so such an array is made in the segment and returning it costs a checksum.
//
// The handler is set in the calling thread's context (NumPy keeps it in a context variable):
// arrays the function makes on other threads get NumPy's own memory, and are copied as before.
// Small allocations go to the C library, as NumPy's default handler sends them.

#include <cstddef>
#include <span>

namespace isorun_python {

/// The smallest array placed: where allocate_blob starts placing (blob.hpp).
inline constexpr std::size_t placed_from = 32ULL << 20;

/// @brief Makes NumPy allocate arrays of 32 MiB and more (where the C++ worker places blobs) with
///        serialization::detail::allocate_blob, from now on in this thread's context. NumPy
///        must be imported already (importing it here would cost a call that does not use it its
///        import) and be 1.22 or later; false, with nothing changed, where it is not. Call with
///        the GIL held.
bool place_numpy_arrays();

/// @brief Whether all of [data, data + size) lies in `storage`.
inline bool lies_in(std::span<const std::byte> storage, const void* data, std::size_t size) {
  const auto* p = static_cast<const std::byte*>(data);
  return p >= storage.data() && size <= storage.size() &&
         static_cast<std::size_t>(p - storage.data()) <= storage.size() - size;
}

/// @brief The storage of a large array allocated through place_numpy_arrays() that holds all of
///        [data, data + size), or an empty span if none does.
std::span<std::byte> numpy_storage_holding(const void* data, std::size_t size);

}  // namespace isorun_python
