// The worker's reading of its request segment (everything the supervisor sent, validated
// before use).
#include <cstdint>

#include "isorun/serialization/codec.hpp"
#include "isorun/serialization/request.hpp"
#include "isorun/serialization/wire.hpp"

namespace ser = isorun::serialization;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto* segment = reinterpret_cast<const std::byte*>(data);
  std::span<const std::byte> payload{segment, size};
  ser::encoding enc{};
  try {
    payload = ser::open_payload(segment, size, ser::request_magic, size, enc);
  } catch (const ser::wire_error&) {
  }
  ser::request req;
  try {
    ser::decode(payload, nullptr, req);
  } catch (const ser::wire_error&) {
  } catch (const std::bad_alloc&) {
  } catch (const std::length_error&) {
  }
  return 0;
}
