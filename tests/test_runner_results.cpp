// Runner results: values, blobs placed where the result goes, in-place and streamed device
// results, and results over 4 GiB.
#include <catch2/catch.hpp>

#include "runner_tasks.hpp"

using namespace runner_tests;

TEST_CASE("a 256 MiB blob result arrives intact and is read in place", "[runner]") {
  const std::uint64_t size = 256_MiB;
  isorun::blob b = isorun::isolated(make_pattern)(size, 7);
  REQUIRE(b.size() == size);
  CHECK(b.is_view());  // aliases the shared-memory segment: no copy on the receiving side
  const auto* words = reinterpret_cast<const std::uint64_t*>(b.data());
  std::uint64_t mismatches = 0;
  for (std::uint64_t i = 0; i < size / 8; ++i) mismatches += words[i] != pattern_word(i, 7);
  CHECK(mismatches == 0);
}

TEST_CASE("blob results of changing sizes arrive intact through a segment mapped ahead of them", "[runner]") {
  // A CPU worker with a blob result maps its pooled segment, as large as an earlier result made
  // it, while the task runs: the next result may be smaller, larger (the mapping grows), or
  // written in place into it.
  auto intact = [](const isorun::blob& b, std::uint64_t size, std::uint64_t seed) {
    if (b.size() != size) return false;
    const auto* words = reinterpret_cast<const std::uint64_t*>(b.data());
    for (std::uint64_t i = 0; i < size / 8; ++i)
      if (words[i] != pattern_word(i, seed)) return false;
    return true;
  };
  std::uint64_t seed = 1;
  for (std::uint64_t size : {96_MiB, 40_MiB, 160_MiB, 8_MiB}) {
    INFO(size / 1_MiB << " MiB");
    CHECK(intact(isorun::isolated(make_pattern)(size, seed), size, seed));
    ++seed;
    CHECK(intact(isorun::isolated(fill_in_place)(size, seed), size, seed));
    ++seed;
  }
}

TEST_CASE("a large blob the task returns was made where the result goes: nothing is copied", "[runner]") {
  const std::uint64_t size = 48_MiB;
  // A first result of this size grows the pooled segment to hold it; placing never grows it.
  REQUIRE(isorun::isolated(make_pattern)(size, 1).size() == size);
  auto intact_after_name = [](const isorun::blob& b, std::uint64_t size, std::uint64_t seed) {
    std::uint64_t wrong = b.size() != size;
    for (std::uint64_t i = 256; i < b.size(); ++i) wrong += b.data()[i] != pattern_byte(i, seed);
    return wrong == 0;
  };
  auto where = [](const isorun::blob& b) { return std::string(reinterpret_cast<const char*>(b.data())); };

  const isorun::blob placed = isorun::isolated(locate_pattern)(size, 2);
  CHECK_THAT(where(placed), Catch::Contains("memfd:"));
  CHECK(intact_after_name(placed, size, 2));
  CHECK(placed.is_view());

  isorun::isolated_options off;
  off.env = {"ISORUN_PLACE_BLOBS=0"};  // pages of its own, copied by the encoder
  const isorun::blob copied = isorun::isolated(locate_pattern, off)(size, 3);
  CHECK(where(copied).empty());
  CHECK(intact_after_name(copied, size, 3));

  const isorun::blob small = isorun::isolated(locate_pattern)(1_MiB, 4);  // below 32 MiB: not placed
  CHECK(where(small).empty());
  CHECK(intact_after_name(small, 1_MiB, 4));
}

TEST_CASE(
    "a blob placed in the result segment keeps its bytes when another result is written there, or a child writes it",
    "[runner]") {
  const std::uint64_t size = 48_MiB;
  REQUIRE(isorun::isolated(make_pattern)(size, 1).size() == size);
  // The result is a view into the kept blob: if the kept blob were not moved out of the segment
  // first, the encoder would copy the segment onto itself, 4 KiB further on.
  std::uint64_t wrong = 0;
  {
    const isorun::blob v = isorun::isolated(view_of_kept)(size, 5);
    REQUIRE(v.size() == size - 4096);
    for (std::uint64_t i = 0; i < v.size(); ++i) wrong += v.data()[i] != pattern_byte(4096 + i, 5);
    CHECK(wrong == 0);
  }  // its segment goes back to the pool, for the next call to place its blob in
  // A child the task forks writes a copy: the result is the task's bytes.
  const isorun::blob f = isorun::isolated(forked_writer)(size, 6);
  CHECK_THAT(std::string(reinterpret_cast<const char*>(f.data())), Catch::Contains("memfd:"));
  wrong = f.size() != size;
  for (std::uint64_t i = 256; i < f.size(); ++i) wrong += f.data()[i] != pattern_byte(i, 6);
  CHECK(wrong == 0);
  for (const bool first : {true, false}) {
    INFO((first ? "the first blob returned" : "the second blob returned"));
    const isorun::blob b = isorun::isolated(one_of_two)(size, 7, first);
    REQUIRE(b.size() == size);
    wrong = 0;
    for (std::uint64_t i = 0; i < size; ++i) wrong += b.data()[i] != pattern_byte(i, 7);
    CHECK(wrong == 0);
  }
}

TEST_CASE("a small request is carried by the assignment, a larger one comes through shared memory", "[runner]") {
  // The worker holds its result segment's descriptor, and its request segment's only for a
  // request too large to be carried.
  const auto f = isorun::isolated(segments_held);
  CHECK(f(isorun::blob(100)) == 1);
  CHECK(f(isorun::blob(64 * 1024)) == 2);
}

TEST_CASE("blob arguments reach the task intact", "[runner]") {
  std::vector<std::uint8_t> bytes(1 << 20);
  std::uint64_t expected = 0;
  for (std::size_t i = 0; i < bytes.size(); ++i) expected += bytes[i] = static_cast<std::uint8_t>(i * 31);
  CHECK(isorun::isolated(sum_blob)(isorun::blob(bytes.data(), bytes.size())) == expected);
}

TEST_CASE("results over 4 GiB use 64-bit sizes end to end", "[runner][large]") {
  const std::uint64_t size = 4_GiB + 512_MiB;
  isorun::blob b = isorun::isolated(make_pattern)(size, 3);
  REQUIRE(b.size() == size);
  const auto* words = reinterpret_cast<const std::uint64_t*>(b.data());
  std::uint64_t mismatches = 0;
  for (std::uint64_t i = 0; i < size / 8; i += 4097) mismatches += words[i] != pattern_word(i, 3);
  CHECK(words[size / 8 - 1] == pattern_word(size / 8 - 1, 3));
  CHECK(mismatches == 0);
}

TEST_CASE("output_blob: a result written in place in shared memory", "[runner]") {
  const std::uint64_t size = 64_MiB;
  isorun::blob b = isorun::isolated(fill_in_place)(size, 5);
  REQUIRE(b.size() == size);
  CHECK(b.is_view());
  const auto* words = reinterpret_cast<const std::uint64_t*>(b.data());
  std::uint64_t mismatches = 0;
  for (std::uint64_t i = 0; i < size / 8; ++i) mismatches += words[i] != pattern_word(i, 5);
  CHECK(mismatches == 0);

  wrapped w = isorun::isolated(wrap_in_place)(1_MiB);
  CHECK(w.tag == 7);
  REQUIRE(w.bytes.size() == 1_MiB);
  CHECK(static_cast<unsigned char>(w.bytes.data()[12345]) == 0x5a);

  isorun::blob local = isorun::this_worker().output_blob(16);  // outside a worker: owned
  CHECK_FALSE(local.is_view());
  CHECK(local.mutable_data() != nullptr);
}

TEST_CASE("device_result: a blob in device memory streams to the supervisor, into memory only it maps",
          "[runner][stream]") {
  isorun::stop_standby();
  auto& rings = isorun::serialization::segment_pool::rings();  // kept warm between calls
  REQUIRE(isorun::isolated(from_device)(1, 1).size() == 1);    // and the segment pool warmed up
  rings.clear();
  const int fds_before = isorun::test::open_fds(), shm_before = isorun::test::shm_entries();
  // Sizes around the ring's slots (8 MiB, 8 of them) and the checksum's 4 MiB chunks: one byte;
  // a payload (8-byte length + bytes) of exactly one slot; one byte more; several turns of the ring.
  const std::uint64_t slot = isorun::serialization::ring_slot_bytes;
  for (const std::uint64_t size : {std::uint64_t{1}, slot - 8, slot - 7, 4_MiB + 5, 150_MiB + 3}) {
    for (const bool gpu : {true, false}) {
      INFO("size " << size << (gpu ? " on the simulated GPU" : " in a CPU worker"));
      isorun::isolated_options opts;
      if (gpu) opts.gpu = 0;
      auto r = isorun::isolated(from_device, opts).try_call(size, size);
      REQUIRE(r.ok());
      const isorun::blob& b = r.value();
      REQUIRE(b.size() == size);
      CHECK(b.is_view());
      std::uint64_t wrong = 0;
      for (std::uint64_t i = 0; i < size; ++i) wrong += b.data()[i] != pattern_byte(i, size);
      CHECK(wrong == 0);
      // In private anonymous memory, not in a shared segment a worker could still reach.
      CHECK(isorun::test::mapping_of(b.data()).empty());
    }
  }
  rings.clear();
  CHECK(isorun::test::open_fds() == fds_before);
  CHECK(isorun::test::shm_entries() == shm_before);
  // Outside a worker: an ordinary copy.
  {
    isorun::alloc::caching_allocator& a = isorun::this_worker().allocator();
    isorun::alloc::device_buffer d(a, 100);
    d.copy_from_host(std::string(100, 'q').data(), 100);
    const isorun::blob local = isorun::this_worker().device_result(d, 10);
    CHECK_FALSE(local.is_view());
    CHECK(local.size() == 10);
    CHECK(local.data()[9] == std::byte{'q'});
    CHECK_THROWS_AS(isorun::this_worker().device_result(d, 101), std::out_of_range);
  }
}

TEST_CASE("device_result misused: each misuse is the task's error, with what to do", "[runner][stream]") {
  auto none = isorun::isolated(streams_wrongly).try_call(0);
  REQUIRE(none.status().kind == isorun::outcome_kind::task_error);
  CHECK_THAT(none.status().message, Catch::Contains("return what device_result() returned"));
  auto twice = isorun::isolated(streams_wrongly, {.gpu = 0}).try_call(1);
  REQUIRE(twice.status().kind == isorun::outcome_kind::task_error);
  CHECK_THAT(twice.status().message, Catch::Contains("already called"));
}
