#pragma once
/// @file codec.hpp
/// Encode values into a segment and decode them back, with cereal's binary archive.

#include <cereal/archives/binary.hpp>
#include <cereal/cereal.hpp>

#include <cstdint>
#include <memory>
#include <ostream>
#include <istream>
#include <span>
#include <string>

#include "isorun/serialization/streams.hpp"
#include "isorun/serialization/wire.hpp"

namespace cereal {
/// Size tags read from untrusted payloads are checked against the bytes left before a container
/// is resized to them: a corrupt length fails cleanly instead of allocating wildly. (A
/// non-template overload: preferred over cereal's own template for the binary input archive.)
inline void CEREAL_SERIALIZE_FUNCTION_NAME(BinaryInputArchive& ar, SizeTag<size_type&>& tag) {
  ar(tag.size);
  if (auto* scope = isorun::serialization::in_place_scope::current(); scope && tag.size > scope->reader().remaining())
    throw Exception("length " + std::to_string(tag.size) + " exceeds the " + std::to_string(scope->reader().remaining()) +
                    " bytes left in the payload");
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
