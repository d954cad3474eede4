#pragma once
/// @file codec.hpp
/// Encode values into a segment and decode them back, with cereal's binary archive.

#include <cereal/archives/binary.hpp>
#include <cereal/cereal.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <forward_list>
#include <istream>
#include <iterator>
#include <list>
#include <memory>
#include <ostream>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "isorun/export.hpp"
#include "isorun/serialization/streams.hpp"
#include "isorun/serialization/wire.hpp"

namespace isorun::serialization::detail {
/// @brief Faults in the pages of memory about to be filled by a copy, on several threads when
///        the range is large (32 MiB and up; smaller: nothing). A copy into fresh memory takes
///        its page faults one by one on one core, which on a VM can cost several times the copy
///        itself; faulted in on all cores first, the copy runs at memory speed. The contents
///        are not changed: pages already there stay as they are.
ISORUN_API void prefault(void* data, std::size_t bytes) noexcept;

// Reads T values from bytes that may not be aligned for T (a field's place in a payload
// depends on what precedes it), so that a container can be filled in one pass.
template <class T>
class unaligned_iterator {
 public:
  using iterator_category = std::random_access_iterator_tag;
  using value_type = T;
  using difference_type = std::ptrdiff_t;
  using pointer = void;
  using reference = T;
  explicit unaligned_iterator(const std::byte* p) noexcept : p_{p} {}
  T operator*() const noexcept {
    T v;
    std::memcpy(&v, p_, sizeof v);
    return v;
  }
  T operator[](difference_type i) const noexcept { return *(*this + i); }
  unaligned_iterator& operator++() noexcept { return p_ += sizeof(T), *this; }
  unaligned_iterator operator++(int) noexcept {
    auto old = *this;
    ++*this;
    return old;
  }
  unaligned_iterator& operator--() noexcept { return p_ -= sizeof(T), *this; }
  unaligned_iterator operator--(int) noexcept {
    auto old = *this;
    --*this;
    return old;
  }
  unaligned_iterator& operator+=(difference_type n) noexcept {
    return p_ += n * static_cast<difference_type>(sizeof(T)), *this;
  }
  unaligned_iterator& operator-=(difference_type n) noexcept { return *this += -n; }
  friend unaligned_iterator operator+(unaligned_iterator it, difference_type n) noexcept { return it += n; }
  friend unaligned_iterator operator+(difference_type n, unaligned_iterator it) noexcept { return it += n; }
  friend unaligned_iterator operator-(unaligned_iterator it, difference_type n) noexcept { return it -= n; }
  friend difference_type operator-(unaligned_iterator a, unaligned_iterator b) noexcept {
    return (a.p_ - b.p_) / static_cast<difference_type>(sizeof(T));
  }
  friend auto operator<=>(unaligned_iterator a, unaligned_iterator b) noexcept = default;

 private:
  const std::byte* p_;
};

// The bytes of `count` T values at the read position of the payload being decoded, skipped;
// nullptr outside an in-place decode. @throws wire_error if fewer bytes remain.
template <class T>
const std::byte* take_in_place(std::uint64_t count) {
  auto* scope = in_place_scope::current();
  if (!scope) return nullptr;
  if (count > scope->reader().remaining() / sizeof(T))
    throw wire_error("length " + std::to_string(count) + " exceeds the bytes left in the payload");
  const std::byte* at = scope->reader().current();
  scope->reader().skip(count * sizeof(T));
  return at;
}
}  // namespace isorun::serialization::detail

namespace cereal {
/// Size tags read from untrusted payloads are checked against the bytes left before a container
/// is resized to them: a corrupt length fails cleanly instead of allocating wildly. (A
/// non-template overload: preferred over cereal's own template for the binary input archive.)
inline void CEREAL_SERIALIZE_FUNCTION_NAME(BinaryInputArchive& ar, SizeTag<size_type&>& tag) {
  ar(tag.size);
  if (auto* scope = isorun::serialization::in_place_scope::current(); scope && tag.size > scope->reader().remaining())
    throw Exception("length " + std::to_string(tag.size) + " exceeds the " +
                    std::to_string(scope->reader().remaining()) + " bytes left in the payload");
}

/// Vectors of numbers and strings are filled from the payload in one pass: no zero-filled
/// resize before the copy (which, for a large result in fresh memory, doubles the cost of the
/// page faults), and a large one's fresh pages faulted in on several threads first
/// (detail::prefault). Preferred by overload resolution over cereal's generic versions.
template <class T, class A>
std::enable_if_t<std::is_arithmetic_v<T> && !std::is_same_v<T, bool>> CEREAL_LOAD_FUNCTION_NAME(BinaryInputArchive& ar,
                                                                                                std::vector<T, A>& v) {
  size_type n = 0;
  ar(make_size_tag(n));
  if (const std::byte* at = isorun::serialization::detail::take_in_place<T>(n)) {
    v.clear();  // nothing of it to move if the storage is replaced
    v.reserve(static_cast<std::size_t>(n));
    isorun::serialization::detail::prefault(v.data(), static_cast<std::size_t>(n) * sizeof(T));
    if (reinterpret_cast<std::uintptr_t>(at) % alignof(T) == 0) {
      const T* first = reinterpret_cast<const T*>(at);
      v.assign(first, first + n);
    } else {
      isorun::serialization::detail::unaligned_iterator<T> first(at);
      v.assign(first, first + static_cast<std::ptrdiff_t>(n));
    }
    return;
  }
  v.resize(static_cast<std::size_t>(n));
  ar(binary_data(v.data(), static_cast<std::size_t>(n) * sizeof(T)));
}

/// Vectors of anything else (structs, strings, vectors): a length is only a claim, checked above
/// against the bytes left at one byte per element; but cereal's generic load would resize to it
/// first, value-initializing length × sizeof(T) bytes (48 for a struct of a few numbers) before
/// the first element fails. The storage grows with the elements decoded instead: at first as much
/// as the bytes left could fill at sizeof(T) each, then as elements (which take bytes) come.
template <class T, class A>
std::enable_if_t<!std::is_arithmetic_v<T>> CEREAL_LOAD_FUNCTION_NAME(BinaryInputArchive& ar, std::vector<T, A>& v) {
  size_type n = 0;
  ar(make_size_tag(n));
  v.clear();
  if (auto* scope = isorun::serialization::in_place_scope::current())
    v.reserve(static_cast<std::size_t>(std::min<std::uint64_t>(n, scope->reader().remaining() / sizeof(T))));
  else v.reserve(static_cast<std::size_t>(n));
  for (size_type i = 0; i < n; ++i) ar(v.emplace_back());
}

/// Deques and lists, for the reason vectors of anything but numbers are loaded as above:
/// cereal's generic loads resize to the claimed length first, at sizeof(T) and more per element
/// (a list node's links) for each byte left. They grow by the elements decoded instead.
template <class T, class A>
void CEREAL_LOAD_FUNCTION_NAME(BinaryInputArchive& ar, std::deque<T, A>& d) {
  size_type n = 0;
  ar(make_size_tag(n));
  d.clear();
  for (size_type i = 0; i < n; ++i) ar(d.emplace_back());
}

template <class T, class A>
void CEREAL_LOAD_FUNCTION_NAME(BinaryInputArchive& ar, std::list<T, A>& l) {
  size_type n = 0;
  ar(make_size_tag(n));
  l.clear();
  for (size_type i = 0; i < n; ++i) ar(l.emplace_back());
}

template <class T, class A>
void CEREAL_LOAD_FUNCTION_NAME(BinaryInputArchive& ar, std::forward_list<T, A>& l) {
  size_type n = 0;
  ar(make_size_tag(n));
  l.clear();
  auto last = l.before_begin();
  for (size_type i = 0; i < n; ++i) ar(*(last = l.emplace_after(last)));
}

template <class Traits, class A>
void CEREAL_LOAD_FUNCTION_NAME(BinaryInputArchive& ar, std::basic_string<char, Traits, A>& s) {
  size_type n = 0;
  ar(make_size_tag(n));
  if (const std::byte* at = isorun::serialization::detail::take_in_place<char>(n)) {
    s.clear();
    s.reserve(static_cast<std::size_t>(n));
    isorun::serialization::detail::prefault(s.data(), static_cast<std::size_t>(n));
    s.assign(reinterpret_cast<const char*>(at), static_cast<std::size_t>(n));
    return;
  }
  s.resize(static_cast<std::size_t>(n));
  ar(binary_data(s.data(), static_cast<std::size_t>(n)));
}

}  // namespace cereal

namespace isorun::serialization {

/// @brief Exact encoded size of `values` (a counting pass, no copy of bulk data).
template <class... Ts>
std::uint64_t encoded_size(const Ts&... values) {
  counting_buf buf;
  std::ostream os(&buf);
  {
    cereal::BinaryOutputArchive ar(os);
    ar(values...);
  }
  return buf.count();
}

/// @brief Encodes `values` into `[dst, dst + capacity)`.
/// @return the checksum of the bytes written.
/// @throws wire_error if they do not fit.
template <class... Ts>
std::uint64_t encode_into(std::byte* dst, std::uint64_t capacity, const Ts&... values) {
  span_writer buf(dst, capacity);
  std::ostream os(&buf);
  try {
    cereal::BinaryOutputArchive ar(os);
    ar(values...);
  } catch (const cereal::Exception& e) {
    throw wire_error(std::string("encoding failed: ") + e.what());
  }
  return buf.finish_checksum();
}

/// @brief Decodes `values` from `payload`; `blob`s alias the payload and keep `owner` alive.
/// @throws wire_error if the payload is malformed, truncated, or has trailing bytes.
template <class... Ts>
void decode(std::span<const std::byte> payload, std::shared_ptr<const void> owner, Ts&... values) {
  span_reader buf(payload.data(), payload.size());
  std::istream is(&buf);
  try {
    in_place_scope scope(buf, std::move(owner));
    cereal::BinaryInputArchive ar(is);
    ar(values...);
  } catch (const cereal::Exception& e) {
    throw wire_error(std::string("decoding failed: ") + e.what());
  } catch (const std::length_error& e) {
    throw wire_error(std::string("decoding failed: impossible length: ") + e.what());
  } catch (const std::bad_alloc&) {
    throw wire_error("decoding failed: a length in the payload is too large to allocate");
  }
  if (buf.remaining() != 0)
    throw wire_error("decoding failed: " + std::to_string(buf.remaining()) + " unexpected trailing bytes");
}

}  // namespace isorun::serialization
