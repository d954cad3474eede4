// The supervisor's reading of a result segment a worker wrote: header validation, then the
// decode of each kind of result the task API supports, and the CLI's JSON encoding (parsed with
// the bound on nesting the supervisor uses, and dumped again, as a sweep's journal does). A
// vector, deque or list decoded from it may take memory in proportion to the elements the payload
// holds, not to the length it claims: more traps.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <list>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <cereal/types/deque.hpp>
#include <cereal/types/list.hpp>
#include <nlohmann/json.hpp>

#include "../counting_allocator.hpp"
#include "isorun/runner/bounded_json.hpp"
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

using isorun::test::allocated_now;
using isorun::test::allocated_peak;
using isorun::test::counting_allocator;
using isorun::test::largest_allocation;

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
    const auto j = isorun::parse_bounded_json(
        std::string_view(reinterpret_cast<const char*>(payload.data()), payload.size()));
    if (!j.is_discarded()) (void)j.dump();
    return 0;
  }
  try_decode<std::string>(payload);
  try_decode<std::vector<float>>(payload);
  try_decode<isorun::blob>(payload);
  try_decode<std::map<std::string, std::vector<double>>>(payload);
  try_decode<point>(payload);
  try_decode<std::vector<point>>(payload);
  // A point takes at least 24 bytes of payload (two numbers, a string's length).
  largest_allocation = 0;
  try_decode<std::vector<point, counting_allocator<point>>>(payload);
  if (largest_allocation > 2 * (payload.size() / 24 + 1) * sizeof(point)) std::abort();
  // Node by node: all of it together, at the elements the bytes hold with two links each.
  const std::size_t node_bound = 2 * (payload.size() / 24 + 1) * (sizeof(point) + 2 * sizeof(void*)) + 4096;
  allocated_now = allocated_peak = 0;
  try_decode<std::deque<point, counting_allocator<point>>>(payload);
  if (allocated_peak > node_bound) std::abort();
  allocated_now = allocated_peak = 0;
  try_decode<std::list<point, counting_allocator<point>>>(payload);
  if (allocated_peak > node_bound) std::abort();
  return 0;
}
