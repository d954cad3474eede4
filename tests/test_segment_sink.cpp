// The worker's result segment as a home for the task's large blobs (segment_sink and
// blob_placement.hpp), in this process, on real memory files and mappings: what is placed where,
// and that a placed blob the area is taken from keeps its address and its bytes.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "isorun/serialization/blob.hpp"
#include "isorun/serialization/shm_segment.hpp"
#include "isorun/serialization/wire.hpp"
#include "isorun/worker/segment_sink.hpp"
#include "isorun/worker/task.hpp"
#include "test_support.hpp"

namespace {
namespace ser = isorun::serialization;
using isorun::worker::segment_sink;

constexpr std::uint64_t MiB = 1ULL << 20;

void fill(std::byte* p, std::uint64_t n, unsigned char seed) {
  for (std::uint64_t i = 0; i < n; ++i) p[i] = static_cast<std::byte>(seed + i * 7);
}

std::uint64_t wrong(const std::byte* p, std::uint64_t n, unsigned char seed) {
  std::uint64_t w = 0;
  for (std::uint64_t i = 0; i < n; ++i) w += p[i] != static_cast<std::byte>(seed + i * 7);
  return w;
}

// The result the segment holds, read through a mapping of its own, validated as the supervisor
// does: a blob's payload is its 8-byte length, then its bytes.
std::string committed_blob(const ser::shm_file& file, std::uint64_t size, unsigned char seed) {
  const auto view = ser::mapping::map(file.fd(), file.size(), ser::mapping::access::read_only, false);
  ser::encoding enc{};
  const auto payload = ser::open_payload(view.data(), view.size(), ser::result_magic, 1ULL << 40, enc);
  std::uint64_t length = 0;
  if (payload.size() != 8 + size) return "payload of " + std::to_string(payload.size()) + " bytes";
  std::memcpy(&length, payload.data(), 8);
  if (length != size) return "length " + std::to_string(length);
  const auto w = wrong(payload.data() + 8, size, seed);
  return w ? std::to_string(w) + " wrong bytes" : "intact";
}

}  // namespace

TEST_CASE("segment_sink places one large blob where the result goes, only where the segment has room",
          "[runner][segment_sink]") {
  ser::shm_file file = ser::shm_file::create(ser::header_size + 8 + 64 * MiB);
  const int fd = file.fd();
  segment_sink sink(std::move(file), 1ULL << 40);
  const ser::shm_file same{::dup(fd)};

  // A process the task forks places nothing, though the area is free: it shares the segment.
  const pid_t child = ::fork();
  if (child == 0) ::_exit(sink.place(32 * MiB) == nullptr ? 0 : 1);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));

  std::byte* a = sink.place(64 * MiB);
  REQUIRE(a != nullptr);
  CHECK_THAT(isorun::test::mapping_of(a), Catch::Contains("memfd:"));
  CHECK(sink.place(32 * MiB) == nullptr);  // one at a time
  CHECK_FALSE(sink.take_back(a + 1));      // not one of its blobs
  CHECK(sink.take_back(a));
  CHECK(sink.place(65 * MiB) == nullptr);  // never grows the pooled segment
  CHECK(same.size() == ser::header_size + 8 + 64 * MiB);

  // A placed blob returned: encoded where it lies, only checksummed.
  isorun::blob b(32 * MiB);  // no placement installed in this process: pages of its own
  CHECK(isorun::test::mapping_of(b.data()).empty());
  std::byte* p = sink.place(32 * MiB);
  REQUIRE(p != nullptr);
  fill(p, 32 * MiB, 3);
  std::byte* area = sink.reserve(8 + 32 * MiB, p);
  CHECK(area + 8 == p);
  std::uint64_t length = 32 * MiB;
  std::memcpy(area, &length, 8);
  sink.commit(8 + 32 * MiB, ser::checksum({area, 8 + 32 * MiB}), ser::encoding::binary);
  CHECK(committed_blob(same, 32 * MiB, 3) == "intact");
  CHECK(sink.place(32 * MiB) == nullptr);  // the encoder has the area now
  CHECK(sink.take_back(p));
}

TEST_CASE("segment_sink moves a placed blob that is still alive out of the way, at the same address",
          "[runner][segment_sink]") {
  for (const bool by_output_blob : {false, true}) {
    INFO((by_output_blob ? "the area claimed by output_blob" : "another blob returned"));
    ser::shm_file file = ser::shm_file::create(ser::header_size + 8 + 40 * MiB);
    const ser::shm_file same{::dup(file.fd())};
    segment_sink sink(std::move(file), 1ULL << 40);
    std::byte* kept = sink.place(40 * MiB);
    REQUIRE(kept != nullptr);
    fill(kept, 40 * MiB, 1);

    std::byte* area = by_output_blob ? sink.claim_area(8 + 36 * MiB) : sink.reserve(8 + 36 * MiB, nullptr);
    // The kept blob: same address, same bytes, now in private pages the segment does not share.
    CHECK(wrong(kept, 40 * MiB, 1) == 0);
    CHECK(isorun::test::mapping_of(kept).empty());
    CHECK_THAT(isorun::test::mapping_of(area), Catch::Contains("memfd:"));
    // Writing the result there leaves the kept blob alone, and vice versa.
    fill(area + 8, 36 * MiB, 2);
    fill(kept, 4096, 9);
    std::uint64_t length = 36 * MiB;
    std::memcpy(area, &length, 8);
    sink.commit(8 + 36 * MiB, ser::checksum({area, 8 + 36 * MiB}), ser::encoding::binary);
    CHECK(committed_blob(same, 36 * MiB, 2) == "intact");
    CHECK(wrong(kept + 4096, 40 * MiB - 4096, static_cast<unsigned char>(1 + 4096 * 7)) == 0);
    CHECK(sink.place(32 * MiB) == nullptr);  // claimed: nothing is placed any more
    CHECK(sink.take_back(kept));             // its private pages are unmapped
    CHECK(isorun::test::mapping_of(kept) == "unmapped");
  }
}

TEST_CASE("segment_sink places a blob at the task's offset, with the rest of its payload after it",
          "[runner][segment_sink]") {
  // A Python call's payload: a head page, the placed array, then the pickle.
  constexpr std::uint64_t offset = 4096, tail = 1000;
  for (const bool room_for_the_tail : {true, false}) {
    INFO((room_for_the_tail ? "the segment holds the whole payload" : "the segment holds the blob alone"));
    ser::shm_file file = ser::shm_file::create(ser::header_size + offset + 32 * MiB + (room_for_the_tail ? tail : 0));
    const ser::shm_file same{::dup(file.fd())};
    segment_sink sink(std::move(file), 1ULL << 40);
    sink.set_placed_offset(offset);
    std::byte* p = sink.place(32 * MiB);
    REQUIRE(p != nullptr);
    fill(p, 32 * MiB, 4);

    const std::uint64_t size = offset + 32 * MiB + tail;
    std::byte* area = sink.reserve(size, p);
    // In place only if the payload fits the mapping the blob lies in: mapping the segment anew
    // would move the blob, so it is moved out first, keeping its address and bytes.
    CHECK((area + offset == p) == room_for_the_tail);
    CHECK(isorun::test::mapping_of(p).empty() == !room_for_the_tail);
    CHECK(wrong(p, 32 * MiB, 4) == 0);
    if (area + offset != p) std::memcpy(area + offset, p, 32 * MiB);
    std::memset(area, 0, offset);
    std::memset(area + offset + 32 * MiB, 5, tail);
    sink.commit(size, ser::checksum({area, size}), ser::encoding::binary);

    const auto view = ser::mapping::map(same.fd(), same.size(), ser::mapping::access::read_only, false);
    ser::encoding enc{};
    const auto payload = ser::open_payload(view.data(), view.size(), ser::result_magic, 1ULL << 40, enc);
    REQUIRE(payload.size() == size);
    CHECK(wrong(payload.data() + offset, 32 * MiB, 4) == 0);
    CHECK(payload[offset + 32 * MiB + tail - 1] == std::byte{5});
    CHECK(sink.take_back(p));
  }
}

TEST_CASE("an early_result worker seals its result itself when it lets go of it, unless another writer maps it",
          "[runner][segment_sink]") {
  ser::shm_file file = ser::shm_file::create(ser::header_size + 4096);
  const ser::shm_file same{::dup(file.fd())};  // the supervisor's descriptor
  {
    segment_sink sink(std::move(file), 1ULL << 40);
    fill(sink.claim_area(64), 64, 3);
    sink.close();
  }
  CHECK(same.sealed());  // sealed in the worker, before its `done`: the supervisor only checks

  ser::shm_file other = ser::shm_file::create(ser::header_size + 4096);
  const ser::shm_file kept{::dup(other.fd())};
  const auto writable = ser::mapping::map(kept.fd(), kept.size(), ser::mapping::access::read_write, false);
  {
    segment_sink sink(std::move(other), 1ULL << 40);
    sink.close();  // a writable mapping elsewhere refuses the seal: left to the supervisor
  }
  CHECK_FALSE(kept.sealed());
}
