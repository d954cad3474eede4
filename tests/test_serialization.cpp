// Serialization: segments, the wire format, codecs, blobs, control messages, the segment pool.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <cereal/types/deque.hpp>
#include <cereal/types/forward_list.hpp>
#include <cereal/types/list.hpp>
#include <cereal/types/map.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>

#include "counting_allocator.hpp"
#include "isorun/serialization/blob.hpp"
#include "isorun/serialization/codec.hpp"
#include "isorun/serialization/control.hpp"
#include "isorun/serialization/cpu_handoff.hpp"
#include "isorun/serialization/result_stream.hpp"
#include "isorun/serialization/segment_pool.hpp"
#include "isorun/serialization/shm_segment.hpp"
#include "isorun/serialization/streams.hpp"
#include "isorun/serialization/whole_file.hpp"
#include "isorun/serialization/wire.hpp"
#include "test_support.hpp"

namespace ser = isorun::serialization;

namespace {
// A segment holding `payload` under a valid header.
std::vector<std::byte> segment_with(const std::string& payload, std::uint64_t magic = ser::result_magic) {
  std::vector<std::byte> seg(ser::header_size + payload.size());
  std::memcpy(seg.data() + ser::header_size, payload.data(), payload.size());
  ser::write_header(seg.data(), magic, ser::encoding::json, payload.size(),
                    ser::checksum({seg.data() + ser::header_size, payload.size()}));
  return seg;
}
}  // namespace

TEST_CASE("segments are created already unlinked, 0600, and grow on demand", "[shm]") {
  const int before = isorun::test::shm_entries();
  auto f = ser::shm_file::create(4096);
  CHECK(isorun::test::shm_entries() == before);  // no name to leave behind
  CHECK(f.size() == 4096);
  f.reserve(1 << 20);
  CHECK(f.size() == 1 << 20);
  f.reserve(10);  // never shrinks
  CHECK(f.size() == 1 << 20);
  auto m = ser::mapping::map(f.fd(), f.size(), ser::mapping::access::read_write, true);
  std::memset(m.data(), 0xab, m.size());
  // A second, independent mapping of the same descriptor sees the bytes: it is shared memory.
  auto m2 = ser::mapping::map(f.fd(), f.size(), ser::mapping::access::read_only, false);
  CHECK(static_cast<unsigned char>(m2.data()[12345]) == 0xab);
}

TEST_CASE("a sealed segment refuses every change, through any descriptor; sealing waits for writable mappings",
          "[shm]") {
  auto f = ser::shm_file::create(1 << 20);
  {
    auto m = ser::mapping::map(f.fd(), f.size(), ser::mapping::access::read_write, true);
    std::memset(m.data(), 0x5a, m.size());
    CHECK_FALSE(f.seal());  // a writable mapping exists: refused, nothing sealed
    CHECK_FALSE(f.sealed());
  }
  const int other = ::fcntl(f.fd(), F_DUPFD_CLOEXEC, 0);  // as a worker holds its own descriptor
  REQUIRE(other >= 0);
  REQUIRE(f.seal());
  CHECK(f.sealed());
  const char byte = 1;
  errno = 0;
  CHECK(::pwrite(other, &byte, 1, 0) == -1);
  CHECK(errno == EPERM);
  CHECK(::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, other, 0) == MAP_FAILED);
  CHECK(errno == EPERM);
  CHECK(::ftruncate(other, 0) == -1);
  CHECK(::ftruncate(other, 2 << 20) == -1);
  auto ro = ser::mapping::map(f.fd(), f.size(), ser::mapping::access::read_only, false);
  CHECK(static_cast<unsigned char>(ro.data()[777]) == 0x5a);
  ::close(other);
}

TEST_CASE("open_payload accepts a valid segment and rejects each kind of damage", "[wire]") {
  auto seg = segment_with("{\"result\":1}");
  ser::encoding enc{};
  auto p = ser::open_payload(seg.data(), seg.size(), ser::result_magic, 1 << 20, enc);
  CHECK(std::string(reinterpret_cast<const char*>(p.data()), p.size()) == "{\"result\":1}");
  CHECK(enc == ser::encoding::json);

  auto expect_error = [&](std::vector<std::byte> s, std::uint64_t mapped, std::uint64_t max, const char* says) {
    CHECK_THROWS_WITH(ser::open_payload(s.data(), mapped, ser::result_magic, max, enc), Catch::Contains(says));
  };
  expect_error(seg, 10, 1 << 20, "smaller than its 64-byte header");
  expect_error(segment_with("x", ser::request_magic), ser::header_size + 1, 1 << 20, "wrong magic");
  expect_error(seg, seg.size(), 3, "exceeds the limit");
  expect_error(seg, seg.size() - 1, 1 << 20, "segment holds only");
  auto flipped = seg;
  flipped[ser::header_size] = static_cast<std::byte>(static_cast<unsigned>(flipped[ser::header_size]) ^ 1u);
  expect_error(flipped, flipped.size(), 1 << 20, "checksum mismatch");
  auto version = seg;
  ser::segment_header h;
  std::memcpy(&h, version.data(), sizeof h);
  h.version = 99;
  std::memcpy(version.data(), &h, sizeof h);
  expect_error(version, version.size(), 1 << 20, "wire version 99");
  h.version = ser::wire_version;
  h.encoding = 7;
  std::memcpy(version.data(), &h, sizeof h);
  expect_error(version, version.size(), 1 << 20, "unknown encoding");
}

TEST_CASE("codec round trip, exact sizing and rejection of malformed payloads", "[codec]") {
  std::map<std::string, std::vector<double>> value{{"a", {1, 2}}, {"b", {}}};
  std::string text = "hello";
  const auto n = ser::encoded_size(value, text);
  std::vector<std::byte> buf(n);
  const auto sum = ser::encode_into(buf.data(), n, value, text);
  CHECK(sum == ser::checksum(buf));
  decltype(value) value2;
  std::string text2;
  ser::decode(buf, nullptr, value2, text2);
  CHECK(value2 == value);
  CHECK(text2 == text);

  CHECK_THROWS_AS(ser::encode_into(buf.data(), n - 1, value, text), ser::wire_error);
  std::string s;
  CHECK_THROWS_WITH(ser::decode(std::span(buf).first(n - 2), nullptr, value2, s), Catch::Contains("decoding failed"));
  CHECK_THROWS_WITH(ser::decode(buf, nullptr, value2), Catch::Contains("trailing bytes"));
  std::vector<std::byte> huge(8);
  const std::uint64_t len = 1ULL << 62;
  std::memcpy(huge.data(), &len, 8);
  CHECK_THROWS_AS(ser::decode(huge, nullptr, s), ser::wire_error);
}

namespace {
using isorun::test::allocated_now;
using isorun::test::allocated_peak;
using isorun::test::counting_allocator;
using isorun::test::largest_allocation;
struct wide {  // 48 bytes in memory, 8 in the payload
  double x = 0;
  char pad[40] = {};
  template <class A>
  void serialize(A& ar) {
    ar(x);
  }
};
}  // namespace

TEST_CASE("a length in a payload claims no more memory than its bytes could fill", "[codec][hostile]") {
  // 1 MiB of payload claiming about a million elements; each element takes 8 bytes of it (a
  // number, or an empty string's or vector's length), so it holds 131,071 and then ends. Memory
  // goes to the elements it holds (at most twice, as a vector grows), not to the claim: a
  // decoder that sized the vector to the claim first would allocate a million elements.
  std::vector<std::byte> payload(1 << 20);
  const std::uint64_t claimed = payload.size() - 8;
  std::memcpy(payload.data(), &claimed, 8);
  auto check = [&](auto v) {
    using T = typename decltype(v)::value_type;
    largest_allocation = 0;
    CHECK_THROWS_AS(ser::decode(payload, nullptr, v), ser::wire_error);
    INFO(sizeof(T));
    CHECK(largest_allocation <= 2 * (payload.size() / 8) * sizeof(T));
  };
  check(std::vector<wide, counting_allocator<wide>>());
  check(std::vector<std::string, counting_allocator<std::string>>());
  check(std::vector<std::vector<double>, counting_allocator<std::vector<double>>>());
  // Deques and lists allocate node by node: all their memory together is what is bounded, at the
  // elements the bytes hold with a node's two links each.
  auto check_nodes = [&](auto c) {
    using T = typename decltype(c)::value_type;
    allocated_now = allocated_peak = 0;
    CHECK_THROWS_AS(ser::decode(payload, nullptr, c), ser::wire_error);
    INFO(sizeof(T));
    CHECK(allocated_peak <= 2 * (payload.size() / 8) * (sizeof(T) + 2 * sizeof(void*)));
  };
  check_nodes(std::deque<wide, counting_allocator<wide>>());
  check_nodes(std::list<wide, counting_allocator<wide>>());
  check_nodes(std::forward_list<std::string, counting_allocator<std::string>>());
  {
    const std::deque<wide> d(100, wide{.x = 3});
    const std::list<std::string> l{"a", "bc", ""};
    const std::forward_list<int> f{1, 2, 3};
    std::vector<std::byte> buf(ser::encoded_size(d, l, f));
    ser::encode_into(buf.data(), buf.size(), d, l, f);
    std::deque<wide> d2(5);
    std::list<std::string> l2{"old"};
    std::forward_list<int> f2{9};
    ser::decode(buf, nullptr, d2, l2, f2);  // replaced, not appended to
    CHECK((d2.size() == 100 && d2.back().x == 3));
    CHECK(l2 == l);
    CHECK(f2 == f);
  }
  // What does fit decodes as before.
  std::vector<wide, counting_allocator<wide>> in(1000), out;
  for (std::size_t i = 0; i < in.size(); ++i) in[i].x = static_cast<double>(i);
  std::vector<std::byte> buf(ser::encoded_size(in));
  ser::encode_into(buf.data(), buf.size(), in);
  ser::decode(buf, nullptr, out);
  REQUIRE(out.size() == in.size());
  CHECK(out[999].x == 999);
}

TEST_CASE("large vectors and strings decode whole into memory faulted in ahead, replacing what was there", "[codec]") {
  // Odd sizes and a field before them: the copies start unaligned and end inside a page.
  std::vector<float> numbers((40 << 20) / sizeof(float) + 3);
  for (std::size_t i = 0; i < numbers.size(); ++i) numbers[i] = static_cast<float>(i % 10007) * 0.5f;
  std::string text((33 << 20) + 5, 'x');
  for (std::size_t i = 0; i < text.size(); i += 4096) text[i] = static_cast<char>('a' + i / 4096 % 26);
  const std::uint8_t tag = 9;
  const auto n = ser::encoded_size(tag, numbers, text);
  std::vector<std::byte> buf(n);
  ser::encode_into(buf.data(), n, tag, numbers, text);
  std::uint8_t tag2 = 0;
  std::vector<float> numbers2(100, -1.0f);  // replaced, not appended to
  std::string text2 = "old";
  ser::decode(buf, nullptr, tag2, numbers2, text2);
  CHECK(tag2 == tag);
  CHECK(numbers2 == numbers);
  CHECK(text2 == text);
}

TEST_CASE("large writes are hashed on the fly with the same checksum", "[codec]") {
  isorun::blob big(3 << 20);
  for (std::size_t i = 0; i < big.size(); ++i) big.mutable_data()[i] = static_cast<std::byte>(i * 7);
  const auto n = ser::encoded_size(big);
  std::vector<std::byte> buf(n);
  const auto sum = ser::encode_into(buf.data(), n, big);
  CHECK(sum == ser::checksum(buf));
}

TEST_CASE("the checksum is chunked; every way of writing a payload gives what checksum() computes", "[codec]") {
  constexpr std::uint64_t C = ser::checksum_chunk;
  for (const std::uint64_t size : {C - 1, C, C + 1, 3 * C + 5, 40 * C + 123}) {  // the last on several threads
    std::vector<std::byte> src(size);
    std::uint64_t x = 88172645463325252ULL;  // xorshift: no two chunks alike
    for (auto& b : src) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      b = static_cast<std::byte>(x);
    }
    const std::uint64_t expected = ser::checksum(src);
    auto written = [&](auto&& write) {
      std::vector<std::byte> dst(size);
      ser::span_writer w(dst.data(), size);
      write(w, dst);
      REQUIRE(w.written() == size);
      CHECK(dst == src);
      return w.finish_checksum();
    };
    const auto* text = reinterpret_cast<const char*>(src.data());
    CAPTURE(size);
    CHECK(written([&](ser::span_writer& w, auto&) { w.sputn(text, static_cast<std::streamsize>(size)); }) == expected);
    // A small write first: the large one starts in the middle of a chunk.
    CHECK(written([&](ser::span_writer& w, auto&) {
            w.sputn(text, 1000);
            w.sputn(text + 1000, static_cast<std::streamsize>(size - 1000));
          }) == expected);
    CHECK(written([&](ser::span_writer& w, auto&) {  // many small writes
            for (std::uint64_t at = 0; at < size; at += 100'000)
              w.sputn(text + at, static_cast<std::streamsize>(std::min<std::uint64_t>(100'000, size - at)));
          }) == expected);
    CHECK(written([&](ser::span_writer& w, auto& dst) {  // already in place (output_blob)
            std::memcpy(dst.data(), src.data(), size);
            w.sputn(reinterpret_cast<const char*>(dst.data()), static_cast<std::streamsize>(size));
          }) == expected);
    // Any change is seen, in the last chunk too; the order of the chunks counts.
    auto changed = src;
    changed[size - 1] ^= std::byte{1};
    CHECK(ser::checksum(changed) != expected);
    if (size > 2 * C) {
      auto swapped = src;
      std::swap_ranges(swapped.begin(), swapped.begin() + C, swapped.begin() + C);
      CHECK(ser::checksum(swapped) != expected);
    }
  }
}

TEST_CASE("decoded blobs alias the payload and keep its owner alive", "[blob]") {
  isorun::blob original("abcdef", 6);
  const auto n = ser::encoded_size(original);
  auto storage = std::make_shared<std::vector<std::byte>>(n);
  ser::encode_into(storage->data(), n, original);
  std::weak_ptr<std::vector<std::byte>> watch = storage;
  isorun::blob view;
  ser::decode(*storage, storage, view);
  const std::byte* base = storage->data();
  storage.reset();
  REQUIRE_FALSE(watch.expired());  // the view holds the bytes
  CHECK(view.is_view());
  CHECK(view.data() >= base);
  CHECK(std::memcmp(view.data(), "abcdef", 6) == 0);
  isorun::blob copy = view;  // copying a view gives an owned buffer
  CHECK_FALSE(copy.is_view());
  view = isorun::blob();
  CHECK(watch.expired());
  CHECK(std::memcmp(copy.data(), "abcdef", 6) == 0);
}

namespace {
std::uint64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::uint64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
}
constexpr std::size_t mib = 1 << 20;
}  // namespace

TEST_CASE("a large blob has pages of its own, given back when it is freed", "[blob]") {
  const std::size_t n = 96 * mib + 4097;  // not a whole number of the chunks freed in parallel
  const std::uint64_t before = resident_bytes();
  {
    isorun::blob b(n);
    for (std::size_t i = 0; i < n; i += 4096) b.mutable_data()[i] = static_cast<std::byte>(i / 4096 % 251);
    b.mutable_data()[n - 1] = std::byte{7};
    CHECK(resident_bytes() >= before + 90 * mib);
    isorun::blob copy = b;
    REQUIRE(copy.size() == n);
    CHECK(copy.data() != b.data());
    CHECK(std::memcmp(copy.data(), b.data(), n) == 0);
    isorun::blob moved = std::move(copy);
    CHECK(copy.empty());
    CHECK(moved.data()[n - 1] == std::byte{7});
    b = std::move(moved);  // b's own pages go back here, moved's stay with b
    CHECK(b.data()[4096 * 250] == static_cast<std::byte>(250));
    CHECK(resident_bytes() < before + 110 * mib);
  }
  CHECK(resident_bytes() < before + 8 * mib);
}

TEST_CASE("a large mapping given back on several threads leaves the segment's bytes in place", "[shm]") {
  const std::uint64_t n = 80 * mib;
  auto f = ser::shm_file::create(n);
  std::byte* gone = nullptr;
  {
    auto m = ser::mapping::map(f.fd(), n, ser::mapping::access::read_write, true);
    for (std::uint64_t i = 0; i < n; i += 4096) m.data()[i] = static_cast<std::byte>(i / 4096 % 253);
    gone = m.data();
  }
  unsigned char in_core = 0;
  CHECK(::mincore(gone, 4096, &in_core) != 0);  // unmapped: ENOMEM
  CHECK(errno == ENOMEM);
  auto again = ser::mapping::map(f.fd(), n, ser::mapping::access::read_only, false);
  bool intact = true;
  for (std::uint64_t i = 0; i < n; i += 4096) intact &= again.data()[i] == static_cast<std::byte>(i / 4096 % 253);
  CHECK(intact);
}

TEST_CASE("control messages: framing, validation, hang-up", "[control]") {
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0);
  ser::done_message ok;
  ok.pid = 42;
  ok.visible_devices = "GPU-sim-0";
  ok.inline_result = std::string(ser::inline_limit, 'r');  // the largest result sent inline
  ser::send_message(sv[0], ok);
  ser::done_message done;
  done.status = ser::task_status::task_error;
  done.error_type = "std::runtime_error";
  done.message = std::string(1000, 'm');
  ser::send_message(sv[0], done);

  auto r1 = ser::try_receive(sv[1]);
  REQUIRE(r1.message);
  CHECK(std::get<ser::done_message>(*r1.message).visible_devices == "GPU-sim-0");
  CHECK(std::get<ser::done_message>(*r1.message).inline_result == ok.inline_result);
  auto r2 = ser::try_receive(sv[1]);
  REQUIRE(r2.message);
  CHECK(std::get<ser::done_message>(*r2.message).message.size() == 1000);
  CHECK_FALSE(ser::try_receive(sv[1]).message);  // nothing pending: does not block

  const char junk[] = "junk-junk-junk";
  ::send(sv[0], junk, sizeof junk, 0);
  CHECK_THROWS_WITH(ser::try_receive(sv[1]), Catch::Contains("wrong magic"));
  std::vector<char> big(ser::max_control_message + 10, 'x');
  ::send(sv[0], big.data(), big.size(), 0);
  CHECK_THROWS_WITH(ser::try_receive(sv[1]), Catch::Contains("exceeds"));
  done.message = std::string(ser::max_control_message, 'm');
  CHECK_THROWS_AS(ser::send_message(sv[0], done), ser::wire_error);

  ::close(sv[0]);
  CHECK(ser::try_receive(sv[1]).closed);
  ::close(sv[1]);
}

namespace {
// A thread's affinity; all zero where it cannot be read (so that a comparison fails). Safe on any
// thread: Catch's assertions stay on the test's own.
cpu_set_t affinity(pid_t tid) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(tid, sizeof set, &set) != 0) CPU_ZERO(&set);
  return set;
}
pid_t this_tid() { return static_cast<pid_t>(::syscall(SYS_gettid)); }
// The CPUs of `set`, in order.
std::vector<int> cpus_in(const cpu_set_t& set) {
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  return cpus;
}
cpu_set_t only(int cpu) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  return one;
}
ser::cpu_mask as_mask(const cpu_set_t& set) {
  ser::cpu_mask m(sizeof set / sizeof(std::uint64_t));
  std::memcpy(m.data(), &set, sizeof set);
  while (!m.empty() && m.back() == 0) m.pop_back();
  return m;
}
// Joins on every way out of a test, so that a failed assertion does not destroy a joinable thread.
struct joined {
  std::thread t;
  std::function<void()> release;  // lets the thread finish first
  ~joined() {
    if (release) release();
    if (t.joinable()) t.join();
  }
};
}  // namespace

TEST_CASE("the caller's CPU is handed to a sleeping thread, which restores the mask it had", "[control]") {
  const cpu_set_t all = affinity(0);
  const std::vector<int> cpus = cpus_in(all);
  if (cpus.size() < 2) {
    WARN("one CPU only: there is no CPU to hand over, and nothing is narrowed");
    return;
  }
  CHECK(ser::hand_this_cpu_to(0).empty());  // no thread named: the caller's own is not narrowed
  const cpu_set_t mine = affinity(0);
  CHECK(CPU_EQUAL(&all, &mine));

  // A thread that sleeps until told, then restores what it is given and reports its mask.
  std::promise<pid_t> tid;
  std::promise<ser::cpu_mask> restore;
  std::promise<cpu_set_t> after;
  joined sleeper{std::thread([&] {
                   tid.set_value(this_tid());
                   const ser::cpu_mask before_wait = ser::this_thread_cpus();
                   ser::restore_cpus(restore.get_future().get(), before_wait);
                   after.set_value(affinity(0));
                 }),
                 {}};
  const pid_t t = tid.get_future().get();
  const ser::cpu_mask had = ser::hand_this_cpu_to(t);
  const cpu_set_t narrowed = affinity(t);
  restore.set_value(had);
  const cpu_set_t restored = after.get_future().get();
  CHECK(CPU_COUNT(&narrowed) == 1);
  CHECK(had == as_mask(all));  // what it had, without trailing zero words
  CHECK(CPU_EQUAL(&restored, &all));

  // A thread on one CPU is left as it is.
  const cpu_set_t one = only(cpus.front());
  std::promise<pid_t> tid1;
  std::promise<void> go;
  joined pinned{std::thread([&] {
                  ::sched_setaffinity(0, sizeof one, &one);
                  tid1.set_value(this_tid());
                  go.get_future().wait();
                }),
                [&] { go.set_value(); }};
  const pid_t t1 = tid1.get_future().get();
  const cpu_set_t pinned_to = affinity(t1);
  REQUIRE(CPU_EQUAL(&pinned_to, &one));
  CHECK(ser::hand_this_cpu_to(t1).empty());
  const cpu_set_t still = affinity(t1);
  CHECK(CPU_EQUAL(&still, &one));

  // A mask that cannot be restored (a CPU that is not there) leaves every CPU the cpuset allows.
  ser::cpu_mask absent(16, 0);
  absent.back() = std::uint64_t{1} << 63;  // CPU 1023
  cpu_set_t was, widened;
  std::thread([&] {
    ::sched_setaffinity(0, sizeof one, &one);
    was = affinity(0);
    ser::restore_cpus(absent, {});
    widened = affinity(0);
  }).join();
  REQUIRE(CPU_EQUAL(&was, &one));
  CHECK(CPU_COUNT(&widened) >= CPU_COUNT(&all));  // (more under taskset: all the cpuset allows)
}

TEST_CASE("a worker narrowed before it waited widens the threads its start made since, and only those", "[control]") {
  const cpu_set_t all = affinity(0);
  const std::vector<int> cpus = cpus_in(all);
  if (cpus.size() < 2) {
    WARN("one CPU only: nothing is narrowed");
    return;
  }
  // A "worker" thread: narrowed to one CPU while it still starts (by the supervisor's
  // hand-over, here by itself), it starts a helper (which inherits that CPU); another thread of
  // the process chose a different single CPU itself. Then it reads its mask, waits, and restores.
  const int handed = cpus.front(), other = cpus.back();
  std::promise<pid_t> helper_tid, other_tid;
  std::promise<void> restored, release;
  std::shared_future<void> released = release.get_future().share();
  cpu_set_t worker_after;
  joined other_thread{std::thread([&] {
                        const cpu_set_t mine = only(other);
                        ::sched_setaffinity(0, sizeof mine, &mine);
                        other_tid.set_value(this_tid());
                        released.wait();
                      }),
                      {}};
  const pid_t o = other_tid.get_future().get();
  joined worker{std::thread([&] {
                  const cpu_set_t one = only(handed);
                  ::sched_setaffinity(0, sizeof one, &one);  // the hand-over, landed early
                  std::thread helper([&] {
                    helper_tid.set_value(this_tid());
                    released.wait();
                  });
                  const ser::cpu_mask before_wait = ser::this_thread_cpus();
                  ser::restore_cpus(as_mask(all), before_wait);
                  worker_after = affinity(0);
                  restored.set_value();
                  released.wait();
                  helper.join();
                }),
                [&] { release.set_value(); }};
  const pid_t h = helper_tid.get_future().get();
  restored.get_future().wait();
  const cpu_set_t helper_after = affinity(h), other_after = affinity(o), other_chose = only(other);
  CHECK(CPU_EQUAL(&worker_after, &all));
  CHECK(CPU_EQUAL(&helper_after, &all));                              // made on the one CPU, widened with the worker
  if (other != handed) CHECK(CPU_EQUAL(&other_after, &other_chose));  // its own choice, kept
}

TEST_CASE("an assignment carries its segments' descriptors; stray descriptors are refused and closed", "[control]") {
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0);
  auto request = ser::shm_file::create(4096), result = ser::shm_file::create(8192);
  const int before = isorun::test::open_fds();

  ser::assign_message a;
  a.env = {"CUDA_VISIBLE_DEVICES=GPU-sim-1", "ISORUN_MEM_LIMIT=1073741824"};
  const int fds[] = {request.fd(), result.fd()};
  ser::send_message(sv[0], a, fds);
  auto r = ser::receive_message(sv[1], true);
  REQUIRE(r.message);
  CHECK(std::get<ser::assign_message>(*r.message).env == a.env);
  CHECK(std::get<ser::assign_message>(*r.message).cpus.empty());
  REQUIRE(r.fds.size() == ser::assign_fds(a));
  // The same open files, in order, close-on-exec.
  struct stat ours {
  }, theirs{};
  for (int i = 0; i < 2; ++i) {
    REQUIRE(::fstat(fds[i], &ours) == 0);
    REQUIRE(::fstat(r.fds[i], &theirs) == 0);
    CHECK(ours.st_ino == theirs.st_ino);
    CHECK((::fcntl(r.fds[i], F_GETFD) & FD_CLOEXEC) != 0);
    ::close(r.fds[i]);
  }
  CHECK(isorun::test::open_fds() == before);

  // An assignment with the wrong number of descriptors, and a hello with any, are rejected
  // whole, and what they carried is closed.
  ser::send_message(sv[0], a, std::span<const int>(fds, 1));
  CHECK_THROWS_WITH(ser::try_receive(sv[1]), Catch::Contains("carried 1 descriptors, not 2"));
  // One that says it attaches a stdout must carry it.
  a.stdout_attached = true;
  ser::send_message(sv[0], a, fds);
  CHECK_THROWS_WITH(ser::try_receive(sv[1]), Catch::Contains("carried 2 descriptors, not 3"));
  // And one with a result ring, its ring and the ring's eventfd as well.
  a.stream_attached = true;
  const int five[] = {request.fd(), result.fd(), request.fd(), result.fd(), request.fd()};
  ser::send_message(sv[0], a, std::span<const int>(five, 4));
  CHECK_THROWS_WITH(ser::try_receive(sv[1]), Catch::Contains("carried 4 descriptors, not 5"));
  ser::send_message(sv[0], a, five);
  r = ser::receive_message(sv[1], true);
  CHECK(r.fds.size() == 5);
  for (int fd : r.fds) ::close(fd);
  ser::send_message(sv[0], ser::done_message{}, fds);
  CHECK_THROWS_WITH(ser::try_receive(sv[1]), Catch::Contains("descriptors it should not"));
  CHECK(isorun::test::open_fds() == before);
  ::close(sv[0]);
  ::close(sv[1]);
}

TEST_CASE("the segment pool recycles warm segments within its idle limit", "[pool]") {
  auto& pool = ser::segment_pool::instance();
  pool.clear();
  pool.set_idle_limit(8 << 20);
  int fd_first = -1;
  {
    auto s = pool.acquire(1 << 20);
    s->writable(1 << 20)[0] = std::byte{1};
    fd_first = s->fd();
  }
  CHECK(pool.idle_bytes() == 1 << 20);
  {
    auto s = pool.acquire(4096);  // fits in the idle one: reused, not recreated
    CHECK(s->fd() == fd_first);
    CHECK(pool.idle_bytes() == 0);
    auto big = pool.acquire(16 << 20);
    big->writable(16 << 20);
  }
  CHECK(pool.idle_bytes() == 1 << 20);  // the 16 MiB one was over the limit and was closed
  pool.clear();
  CHECK(pool.idle_bytes() == 0);
  pool.set_idle_limit(2ULL << 30);
}

namespace {

// Writes a result (header and `n` bytes of 'p') through `fd`, as a worker does.
void write_result(int fd, std::uint64_t n) {
  std::vector<std::byte> bytes(ser::header_size + n, std::byte{'p'});
  ser::write_header(bytes.data(), ser::result_magic, ser::encoding::binary, n,
                    ser::checksum({bytes.data() + ser::header_size, n}));
  REQUIRE(::pwrite(fd, bytes.data(), bytes.size(), 0) == static_cast<ssize_t>(bytes.size()));
}

// Rewrites the header through `fd` to claim `n` bytes of payload.
void claim_payload(int fd, std::uint64_t n) {
  std::byte header[ser::header_size];
  ser::write_header(header, ser::result_magic, ser::encoding::binary, n, 0);
  REQUIRE(::pwrite(fd, header, sizeof header, 0) == static_cast<ssize_t>(sizeof header));
}

}  // namespace

TEST_CASE("the segment pool never hands out a segment its worker sealed", "[pool]") {
  auto& pool = ser::segment_pool::instance();
  pool.clear();
  {
    auto s = pool.acquire(4096);
    ser::shm_file worker{::dup(s->fd())};  // the worker's descriptor, no mapping on this side
    worker.reserve(4096);
    write_result(worker.fd(), 4096 - ser::header_size);  // it wrote its result
    REQUIRE(worker.seal());
    CHECK(s->sealed());  // seen, though this side never sealed it
    ser::encoding enc{};
    // Mapped read-only: a writable mapping would be refused.
    CHECK(s->payload(ser::result_magic, 1 << 20, enc).size() == 4096 - ser::header_size);
  }
  CHECK(pool.idle_bytes() == 0);  // dropped, not kept for a request it could not hold
}

TEST_CASE("a segment can grow but never shrink, whoever holds it", "[shm]") {
  auto f = ser::shm_file::create(1 << 20);
  const int other = ::fcntl(f.fd(), F_DUPFD_CLOEXEC, 0);  // a worker's descriptor
  REQUIRE(other >= 0);
  errno = 0;
  CHECK(::ftruncate(other, 4096) == -1);
  CHECK(errno == EPERM);
  CHECK(::ftruncate(other, 2 << 20) == 0);
  CHECK(f.size() == 2 << 20);
  ::close(other);
}

TEST_CASE("a worker's payload is checked before more than its header is mapped", "[pool]") {
  auto& pool = ser::segment_pool::instance();
  pool.clear();
  ser::encoding enc{};
  SECTION("grown far past its payload, within the limit: only the payload is mapped") {
    auto s = pool.acquire(0, true);
    ser::shm_file worker{::dup(s->fd())};
    write_result(worker.fd(), 100);
    worker.reserve(64ULL << 30);  // sparse: the worker grew it for nothing
    const auto p = s->payload(ser::result_magic, 128ULL << 30, enc);
    CHECK(p.size() == 100);
    CHECK(std::all_of(p.begin(), p.end(), [](std::byte b) { return b == std::byte{'p'}; }));
    CHECK(::ftruncate(worker.fd(), 0) == -1);  // nor can it shrink under the mapping now
  }
  SECTION("grown past the largest payload it may hold: refused") {
    auto s = pool.acquire(0, true);
    ser::shm_file worker{::dup(s->fd())};
    write_result(worker.fd(), 100);
    worker.reserve(64ULL << 30);
    CHECK_THROWS_WITH(s->payload(ser::result_magic, 1 << 20, enc),
                      Catch::Contains("segment grew to 68719476736 bytes") && Catch::Contains("(1048576 bytes)"));
  }
  SECTION("a header that claims more than the segment holds: refused before anything is mapped") {
    auto s = pool.acquire(0, true);
    ser::shm_file worker{::dup(s->fd())};
    write_result(worker.fd(), 100);
    REQUIRE(::ftruncate(worker.fd(), 4096) == 0);
    claim_payload(worker.fd(), 1ULL << 30);
    CHECK_THROWS_WITH(s->payload(ser::result_magic, 2ULL << 30, enc),
                      Catch::Contains("payload claims 1073741824 bytes but the segment holds only 4032"));
  }
  SECTION("a file that could shrink under the mapping: refused") {
    ser::pooled_segment s{ser::shm_file{::memfd_create("not-isorun", MFD_CLOEXEC)}};
    write_result(s.fd(), 100);
    CHECK_THROWS_WITH(s.payload(ser::result_magic, 1 << 20, enc), Catch::Contains("not sealed against shrinking"));
  }
  SECTION("no header at all") {
    auto s = pool.acquire(0, true);
    CHECK_THROWS_WITH(s->payload(ser::result_magic, 1 << 20, enc), Catch::Contains("smaller than its 64-byte header"));
  }
  pool.clear();
}

TEST_CASE("beyond its idle limit the pool keeps the segments released lately, until their linger passes", "[pool]") {
  auto& pool = ser::segment_pool::instance();
  pool.clear();
  pool.set_idle_limit(1 << 20);
  pool.set_linger(64 << 20, std::chrono::hours(1));
  int fd_big = -1;
  {
    auto small = pool.acquire(1 << 20);
    small->writable(1 << 20);
    auto big = pool.acquire(16 << 20);
    big->writable(16 << 20);
    fd_big = big->fd();
  }
  CHECK(pool.idle_bytes() == (17 << 20));  // both kept: the 16 MiB one lingers
  {
    auto again = pool.acquire(16 << 20);  // the next large result finds it warm
    CHECK(again->fd() == fd_big);
  }
  CHECK(pool.idle_bytes() == (17 << 20));

  pool.set_linger(64 << 20, std::chrono::milliseconds(1));  // the pool's thread closes it soon
  while (pool.idle_bytes() > (1 << 20)) std::this_thread::yield();
  CHECK(pool.idle_bytes() == (1 << 20));  // what is within the idle limit stays

  pool.set_linger(64 << 20, std::chrono::hours(1));
  {
    auto huge = pool.acquire(128 << 20);  // (the idle one, grown)
    huge->writable(128 << 20);
  }
  CHECK(pool.idle_bytes() == 0);  // more than may linger: closed at once
  pool.clear();
  pool.set_idle_limit(2ULL << 30);  // (and no linger, as a program starts)
}

TEST_CASE("a segment grown while idle, by a process still holding it, is not handed out again", "[pool]") {
  auto& pool = ser::segment_pool::instance();
  pool.clear();
  pool.set_idle_limit(8 << 20);
  int held = -1;
  {
    auto s = pool.acquire(1 << 20);
    s->writable(1 << 20);
    held = ::dup(s->fd());  // a process a worker left behind
  }
  auto inode = [](int fd) {
    struct stat st {};
    REQUIRE(::fstat(fd, &st) == 0);
    return st.st_ino;
  };
  REQUIRE(pool.idle_bytes() == 1 << 20);
  REQUIRE(::ftruncate(held, (1 << 20) + 4096) == 0);  // (within the idle limit)
  {
    auto s = pool.acquire(0, true);
    CHECK(inode(s->fd()) != inode(held));
    CHECK(s->capacity() == 0);
  }
  CHECK(pool.idle_bytes() == 0);  // the grown one was closed; the new one, never grown, is kept as none
  ::close(held);
  pool.clear();
  pool.set_idle_limit(2ULL << 30);
}

TEST_CASE("a small request does not take the large idle segment a result needs", "[pool]") {
  auto& pool = ser::segment_pool::instance();
  pool.clear();
  int large_fd = -1, small_fd = -1;
  {
    auto large = pool.acquire(0, true);
    large->writable(64 << 20);
    auto small = pool.acquire(4096);
    small->writable(4096);
    large_fd = large->fd();
    small_fd = small->fd();
  }
  {
    auto request = pool.acquire(8192);  // fits only the large one: the small one is grown instead
    CHECK(request->fd() == small_fd);
    auto result = pool.acquire(0, true);
    CHECK(result->fd() == large_fd);
  }
  {
    auto result = pool.acquire(0, true);
    auto request = pool.acquire(8192);  // fits the small one, grown before: taken
    CHECK(request->fd() == small_fd);
    auto another = pool.acquire(8192);  // none idle is small: a new one, not the large one
    CHECK(another->fd() != large_fd);
    CHECK(result->fd() == large_fd);
  }
  {
    auto request = pool.acquire(8192);
    auto again = pool.acquire(8192);
    CHECK((request->fd() != large_fd && again->fd() != large_fd));
    auto fits = pool.acquire(32 << 20);  // a large request may take it: within 4× of its size
    CHECK(fits->fd() == large_fd);
  }
  pool.clear();
}

namespace {

// A result ring shared by this process (the supervisor's side) and a forked child (the worker's
// side, which inherits the shared mapping).
struct ring_pair {
  std::shared_ptr<ser::pooled_segment> ring = ser::segment_pool::rings().acquire(ser::ring_bytes);
  std::byte* mapped = ring->writable(ser::ring_bytes, false);
  int event = ::eventfd(0, EFD_CLOEXEC);
  ring_pair() { ser::reset_ring(mapped); }
  ~ring_pair() { ::close(event); }
  // Blocks until the child says a stream begins.
  void await_start() const {
    std::uint64_t n = 0;
    REQUIRE(::read(event, &n, sizeof n) == sizeof n);
  }
};

std::byte stream_byte(std::uint64_t i) { return static_cast<std::byte>((i * 2654435761u) >> 13); }

// Where a stream's chunk hashes come from: the worker's CPU hashing each slot, a device that
// hashed beforehand, or a device that hashed something else for chunk 1.
enum class hashes { by_cpu, beforehand, beforehand_wrong };

// The worker's side in a child process: streams `total` bytes of stream_byte, dying at `die_at`
// bytes if given; writes the checksum it computed to `out`.
pid_t stream_from_child(const ring_pair& r, std::uint64_t total, int out, std::uint64_t die_at = ~0ULL,
                        hashes from = hashes::by_cpu) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::vector<std::uint64_t> known;
    if (from != hashes::by_cpu) {
      std::vector<std::byte> chunk;
      for (std::uint64_t at = 0; at < total; at += ser::checksum_chunk) {
        chunk.resize(std::min(ser::checksum_chunk, total - at));
        for (std::uint64_t i = 0; i < chunk.size(); ++i) chunk[i] = stream_byte(at + i);
        known.push_back(XXH3_64bits(chunk.data(), chunk.size()));
      }
      if (from == hashes::beforehand_wrong) known.at(1) ^= 1;
    }
    ser::stream_writer w(r.mapped, r.event);
    const std::uint64_t sum = w.write(
        total,
        [&](std::byte* dst, std::uint64_t off, std::uint64_t n) {
          if (off >= die_at) ::_exit(3);
          for (std::uint64_t i = 0; i < n; ++i) dst[i] = stream_byte(off + i);
        },
        known);
    if (::write(out, &sum, sizeof sum) != sizeof sum) ::_exit(1);
    ::_exit(0);
  }
  return pid;
}

}  // namespace

TEST_CASE("a result stream crosses processes whole, through many turns of the ring, checksummed on both sides",
          "[stream]") {
  for (const hashes from : {hashes::by_cpu, hashes::beforehand}) {
    for (const std::uint64_t total : {std::uint64_t{9}, ser::ring_slot_bytes, 3 * ser::ring_bytes + 12345}) {
      INFO("total " << total << (from == hashes::by_cpu ? ", hashed by the worker's CPU" : ", hashed beforehand"));
      ring_pair r;
      int p[2];
      REQUIRE(::pipe(p) == 0);
      const pid_t child = stream_from_child(r, total, p[1], ~0ULL, from);
      r.await_start();
      ser::stream_reader reader(r.ring, 1ULL << 40);
      CHECK(reader.size() == total);
      // What the worker says it keeps busy: the filling thread, and its hashers unless the chunks
      // were hashed beforehand.
      const std::uint32_t writer_threads = reinterpret_cast<const ser::ring_control*>(r.mapped)->writer_threads;
      if (from == hashes::beforehand) CHECK(writer_threads == 1);
      else CHECK(writer_threads >= 2);
      int status = 0;
      REQUIRE(::waitpid(child, &status, 0) == child);
      CHECK(status == 0);
      reader.stop_waiting();  // all is published; stopping only ends the waiting
      const auto got = reader.finish();
      REQUIRE(got.payload.size() == total);
      std::uint64_t wrong = 0;
      for (std::uint64_t i = 0; i < total; ++i) wrong += got.payload[i] != stream_byte(i);
      CHECK(wrong == 0);
      std::uint64_t theirs = 0;
      REQUIRE(::read(p[0], &theirs, sizeof theirs) == sizeof theirs);
      CHECK(got.checksum == theirs);
      CHECK(got.checksum == ser::checksum(got.payload));  // the wire format's checksum, as for segments
      ::close(p[0]);
      ::close(p[1]);
    }
  }
}

TEST_CASE("a result stream whose worker dies midway is reported incomplete, not waited for", "[stream]") {
  ring_pair r;
  int p[2];
  REQUIRE(::pipe(p) == 0);
  const pid_t child = stream_from_child(r, 100 << 20, p[1], 3 * ser::ring_slot_bytes);
  r.await_start();
  ser::stream_reader reader(r.ring, 1ULL << 40);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WEXITSTATUS(status) == 3);
  reader.stop_waiting();
  CHECK_THROWS_WITH(reader.finish(),
                    Catch::Contains("the result stream ended after") && Catch::Contains("of 104857600 bytes"));
  ::close(p[0]);
  ::close(p[1]);
}

TEST_CASE("a result stream is checked against the worker's hashes, and its size against the limit", "[stream]") {
  {
    // A slot whose second chunk does not match its hash (changed after it was hashed).
    ring_pair r;
    auto& ctl = *reinterpret_cast<ser::ring_control*>(r.mapped);
    ctl.total = ser::checksum_chunk + 5;
    std::byte* slot = r.mapped + ser::ring_control_bytes;
    std::memset(slot, 'a', ctl.total);
    ctl.chunk_hash[0][0] = ser::checksum({slot, ser::checksum_chunk});
    ctl.chunk_hash[0][1] = 42;
    ctl.filled = 1;
    ser::stream_reader reader(r.ring, 1ULL << 40);
    reader.stop_waiting();
    CHECK_THROWS_WITH(reader.finish(), Catch::Contains("chunk 1 of the streamed result differs"));
  }
  {
    // Hashes computed beforehand (on a device) that do not match what arrives: rejected as well,
    // and a count that does not match the chunks is the writer's error.
    ring_pair r;
    int p[2];
    REQUIRE(::pipe(p) == 0);
    const pid_t child = stream_from_child(r, 3 * ser::checksum_chunk, p[1], ~0ULL, hashes::beforehand_wrong);
    r.await_start();
    ser::stream_reader reader(r.ring, 1ULL << 40);
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    reader.stop_waiting();
    CHECK_THROWS_WITH(reader.finish(), Catch::Contains("chunk 1 of the streamed result differs"));
    ::close(p[0]);
    ::close(p[1]);
    ring_pair unused;
    ser::stream_writer w(unused.mapped, unused.event);
    const std::uint64_t two[2] = {1, 2};
    CHECK_THROWS_WITH(w.write(
                          5 * ser::checksum_chunk, [](std::byte*, std::uint64_t, std::uint64_t) {}, two),
                      Catch::Contains("2 chunk hashes for 5 chunks"));
  }
  ring_pair r;
  auto& ctl = *reinterpret_cast<ser::ring_control*>(r.mapped);
  ctl.total = 0;
  CHECK_THROWS_WITH(ser::stream_reader(r.ring, 1 << 20), Catch::Contains("0 bytes"));
  ctl.total = (1 << 20) + 1;
  CHECK_THROWS_WITH(ser::stream_reader(r.ring, 1 << 20), Catch::Contains("exceeds the limit of 1048576"));
}

TEST_CASE("a whole file written by its path replaces a link at the name and leaves no temporary file", "[whole-file]") {
  char tmpl[] = "/tmp/isorun-whole-file-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  const std::string dir = tmpl, page = dir + "/page.html", target = dir + "/target";
  { std::ofstream(target) << "kept"; }
  REQUIRE(::symlink(target.c_str(), page.c_str()) == 0);  // planted at the page's name

  REQUIRE(ser::write_whole_file(page, "<html>", true) == 0);
  struct stat st {};
  REQUIRE(::lstat(page.c_str(), &st) == 0);
  CHECK(S_ISREG(st.st_mode));  // the link replaced, not written through
  const auto contents = [](const std::string& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  CHECK(contents(page) == "<html>");
  CHECK(contents(target) == "kept");

  CHECK(ser::write_whole_file(dir + "/missing/page.html", "x", false) == ENOENT);
  CHECK(ser::write_whole_file(target + "/page.html", "x", false) == ENOTDIR);  // a file is no folder
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(dir)) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  CHECK(left == std::vector<std::string>{"page.html", "target"});
  std::filesystem::remove_all(dir);
}
