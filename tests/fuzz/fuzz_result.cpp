// The supervisor's reading of a result segment a worker wrote: header validation, then the
// decode of each kind of result the task API supports, and the CLI's JSON encoding.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "isorun/serialization/blob.hpp"
#include "isorun/serialization/codec.hpp"
#include "isorun/serialization/wire.hpp"
#include "isorun/worker/task.hpp"  // the types the task API can return

namespace ser = isorun::serialization;

namespace {
struct point {
  double x = 0, y = 0;
  std::string label;
  template <class A>
  void serialize(A& ar) {
    ar(x, y, label);
  }
};

template <class T>
void try_decode(std::span<const std::byte> payload) {
  T value{};
  try {
    ser::decode(payload, nullptr, value);
  } catch (const ser::wire_error&) {
  } catch (const std::bad_alloc&) {  // a length the memory cannot hold: refused as such
  } catch (const std::length_error&) {
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto* segment = reinterpret_cast<const std::byte*>(data);
  ser::encoding enc{};
  std::span<const std::byte> payload;
  try {
    payload = ser::open_payload(segment, size, ser::result_magic, 1 << 20, enc);
  } catch (const ser::wire_error&) {
    // Also decode what follows the header without validation, as if the checksum had matched:
    // the decoders must hold on their own.
    if (size <= ser::header_size) return 0;
    payload = {segment + ser::header_size, size - ser::header_size};
    enc = (data[0] & 1) ? ser::encoding::json : ser::encoding::binary;
  }
  if (enc == ser::encoding::json) {
    (void)nlohmann::json::parse(payload.begin(), payload.end(), nullptr, false);
    return 0;
  }
  try_decode<std::string>(payload);
  try_decode<std::vector<float>>(payload);
  try_decode<isorun::blob>(payload);
  try_decode<std::map<std::string, std::vector<double>>>(payload);
  try_decode<point>(payload);
  try_decode<std::vector<point>>(payload);
  return 0;
}
