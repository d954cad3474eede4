// The capped caching allocator on the host backend: randomized sequences with every invariant
// checked after every operation, and each policy, error and report on its own.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "checksum_cases.hpp"
#include "isorun/alloc/caching_allocator.hpp"
#include "isorun/alloc/config.hpp"
#include "isorun/alloc/cuda_module.hpp"
#include "isorun/alloc/device_buffer.hpp"
#include "isorun/alloc/host_backend.hpp"
#include "isorun/alloc/simulated_device.hpp"
#include "isorun/alloc/std_adaptor.hpp"

using namespace isorun::alloc;
constexpr std::size_t MiB = 1 << 20;

namespace {

// A host backend whose bookkeeping outlives the allocator that owns it.
struct shared_host final : backend {
  host_backend* inner;
  explicit shared_host(host_backend* b) : inner{b} {}
  std::string name() const override { return "host"; }
  bool host_accessible() const noexcept override { return inner->host_accessible(); }
  void* allocate(std::size_t n) override { return inner->allocate(n); }
  void deallocate(void* p, std::size_t n) noexcept override { inner->deallocate(p, n); }
  memory_info device_memory() const override { return inner->device_memory(); }
  void* reserve_address(std::size_t n) override { return inner->reserve_address(n); }
  void release_address(void* p, std::size_t n) noexcept override { inner->release_address(p, n); }
  bool map(void* p, std::size_t n) override { return inner->map(p, n); }
  void unmap(void* p, std::size_t n) noexcept override { inner->unmap(p, n); }
  void synchronize(stream_id s) noexcept override { inner->synchronize(s); }
  void copy(void* d, const void* s, std::size_t n, copy_kind k, stream_id st) override { inner->copy(d, s, n, k, st); }
  event_id record_event(stream_id s) override { return inner->record_event(s); }
  bool event_done(event_id e) override { return inner->event_done(e); }
  void fill(void* p, std::size_t n, std::uint8_t v, stream_id s) override { inner->fill(p, n, v, s); }
};

struct fixture {
  host_backend device;
  caching_allocator alloc;
  fixture(std::uint64_t cap, const char* conf, std::uint64_t capacity = 1ULL << 30)
      : device(capacity), alloc(std::make_unique<shared_host>(&device), cap, alloc_config::parse(conf)) {}
};

// Independent of the allocator's own bookkeeping: live ranges must never overlap and must keep
// the bytes written into them.
struct shadow {
  std::map<std::uintptr_t, std::pair<std::size_t, unsigned char>> live;
  void add(void* p, std::size_t n, unsigned char tag) {
    auto a = reinterpret_cast<std::uintptr_t>(p);
    auto next = live.lower_bound(a);
    if (next != live.end()) REQUIRE(a + n <= next->first);
    if (next != live.begin()) {
      auto prev = std::prev(next);
      REQUIRE(prev->first + prev->second.first <= a);
    }
    std::memset(p, tag, std::min<std::size_t>(n, 64));
    std::memset(static_cast<char*>(p) + n - std::min<std::size_t>(n, 64), tag, std::min<std::size_t>(n, 64));
    live[a] = {n, tag};
  }
  void check(void* p) {
    auto& [n, tag] = live.at(reinterpret_cast<std::uintptr_t>(p));
    auto* c = static_cast<unsigned char*>(p);
    REQUIRE(c[0] == tag);
    REQUIRE(c[n - 1] == tag);
  }
};

void random_run(const char* conf, std::uint32_t seed, int ops) {
  fixture f(256 * MiB, conf);
  std::mt19937 rng(seed);
  shadow sh;
  std::vector<void*> live;
  int ooms = 0;
  for (int i = 0; i < ops; ++i) {
    const int what = static_cast<int>(rng() % 100);
    if (what < 55 || live.empty()) {
      std::size_t n = rng() % 4 == 0 ? 1 + rng() % (48 * MiB) : 1 + rng() % (1 * MiB);
      try {
        void* p = f.alloc.allocate(n);
        sh.add(p, n, static_cast<unsigned char>(rng()));
        live.push_back(p);
      } catch (const isorun::out_of_memory& e) {
        ++ooms;
        REQUIRE(e.figures().requested == n);
        REQUIRE(e.figures().limit == 256 * MiB);
      }
    } else if (what < 98) {
      std::size_t k = rng() % live.size();
      sh.check(live[k]);
      f.alloc.deallocate(live[k]);
      sh.live.erase(reinterpret_cast<std::uintptr_t>(live[k]));
      live[k] = live.back();
      live.pop_back();
    } else {
      f.alloc.empty_cache();
    }
    f.alloc.check_invariants();
    const auto s = f.alloc.stats();
    REQUIRE(static_cast<std::uint64_t>(s.reserved_bytes.current) == f.device.used());
    REQUIRE(s.reserved_bytes.peak <= static_cast<std::int64_t>(256 * MiB));
  }
  for (void* p : live) f.alloc.deallocate(p);
  f.alloc.check_invariants();
  CHECK(f.alloc.stats().allocated_bytes.current == 0);
  f.alloc.empty_cache();
  if (f.alloc.config().kind != strategy::preallocate) CHECK(f.device.used() == 0);
}

}  // namespace

TEST_CASE("randomized sequences keep every invariant, for each strategy", "[alloc]") {
  const char* confs[] = {"strategy:auto_growth",
                         "strategy:preallocate",
                         "strategy:expandable",
                         "pytorch_compat:true",
                         "no_caching:true",
                         "max_split_size_mb:8,garbage_collection_threshold:0.7",
                         "regrowth_chunk_mb:32,initial_chunk_mb:64"};
  for (const char* conf : confs)
    for (std::uint32_t seed = 1; seed <= 16; ++seed) {
      INFO(conf << " seed " << seed);
      random_run(conf, seed, 3000);
    }
}

TEST_CASE("concurrent allocation from several threads never exceeds the cap", "[alloc]") {
  fixture f(128 * MiB, "strategy:auto_growth");
  std::atomic<int> ooms{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      std::mt19937 rng(t + 100);
      std::vector<void*> mine;
      for (int i = 0; i < 3000; ++i) {
        if (rng() % 2 || mine.empty()) {
          try {
            mine.push_back(f.alloc.allocate(1 + rng() % (rng() % 8 ? 256 * 1024 : 24 * MiB)));
          } catch (const isorun::out_of_memory&) {
            ++ooms;
          }
        } else {
          std::size_t k = rng() % mine.size();
          f.alloc.deallocate(mine[k]);
          mine.erase(mine.begin() + static_cast<long>(k));
        }
      }
      for (void* p : mine) f.alloc.deallocate(p);
    });
  for (auto& t : threads) t.join();
  f.alloc.check_invariants();
  const auto s = f.alloc.stats();
  CHECK(s.allocated_bytes.current == 0);
  CHECK(s.reserved_bytes.peak <= static_cast<std::int64_t>(128 * MiB));
  CHECK(s.num_ooms == static_cast<std::uint64_t>(ooms.load()));
}

TEST_CASE("the OOM report gives the numbers and advice that applies", "[alloc]") {
  fixture f(64 * MiB, "strategy:auto_growth");
  void* a = f.alloc.allocate(40 * MiB);
  try {
    f.alloc.allocate(40 * MiB);
    FAIL("expected out_of_memory");
  } catch (const isorun::out_of_memory& e) {
    const std::string m = e.what();
    CHECK_THAT(m, Catch::Contains("tried to allocate 40.00 MiB"));
    CHECK_THAT(m, Catch::Contains("cap 64.00 MiB"));
    CHECK_THAT(m, Catch::Contains("reserved 40.00 MiB, allocated 40.00 MiB"));
    CHECK_THAT(m, Catch::Contains("Largest live allocations: 40.00 MiB"));
    CHECK_THAT(m, Catch::Contains("raise --mem-limit"));
    CHECK(e.figures().allocated == 40 * MiB);
    CHECK(e.figures().limit == 64 * MiB);
  }
  CHECK(f.alloc.stats().num_ooms == 1);
  f.alloc.deallocate(a);
}

namespace {
// Leaves the cache fragmented: small blocks, every other one freed.
std::vector<void*> fragment(caching_allocator& a, std::size_t cap) {
  std::vector<void*> all, kept;
  for (std::size_t used = 0; used + 512 * 1024 <= cap; used += 512 * 1024) all.push_back(a.allocate(512 * 1024));
  for (std::size_t i = 0; i < all.size(); ++i) (i % 2 ? kept.push_back(all[i]) : a.deallocate(all[i]));
  return kept;
}
}  // namespace

TEST_CASE("fragmentation advice never names an option that is already set", "[alloc]") {
  fixture plain(16 * MiB, "strategy:auto_growth");
  auto kept = fragment(plain.alloc, 16 * MiB);
  try {
    plain.alloc.allocate(6 * MiB);
    FAIL("expected out_of_memory");
  } catch (const isorun::out_of_memory& e) {
    CHECK_THAT(e.what(), Catch::Contains("fragmented") && Catch::Contains("strategy:expandable") &&
                             Catch::Contains("garbage_collection_threshold"));
  }
  for (void* p : kept) plain.alloc.deallocate(p);

  fixture tuned(16 * MiB, "strategy:auto_growth,max_split_size_mb:4,garbage_collection_threshold:0.9");
  kept = fragment(tuned.alloc, 16 * MiB);
  try {
    tuned.alloc.allocate(6 * MiB);
    FAIL("expected out_of_memory");
  } catch (const isorun::out_of_memory& e) {
    CHECK_THAT(e.what(), !Catch::Contains("max_split_size_mb") && !Catch::Contains("garbage_collection_threshold"));
  }
  for (void* p : kept) tuned.alloc.deallocate(p);
}

TEST_CASE("expandable maps pages on demand and never strands freed pages", "[alloc]") {
  // A partly used 12 MiB segment strands 8 MiB under auto_growth; expandable reuses the pages.
  for (const char* conf : {"strategy:auto_growth", "strategy:expandable"}) {
    INFO(conf);
    fixture f(16 * MiB, conf);
    f.alloc.deallocate(f.alloc.allocate(12 * MiB));
    void* small = f.alloc.allocate(4 * MiB);
    bool fits = true;
    try {
      f.alloc.deallocate(f.alloc.allocate(10 * MiB));
    } catch (const isorun::out_of_memory&) {
      fits = false;
    }
    CHECK(fits == (std::string(conf) == "strategy:expandable"));
    f.alloc.check_invariants();
    f.alloc.deallocate(small);
  }
  fixture e(64 * MiB, "strategy:expandable");
  void* p = e.alloc.allocate(5 * MiB);
  CHECK(e.alloc.stats().reserved_bytes.current == static_cast<std::int64_t>(6 * MiB));  // three 2 MiB pages
  e.alloc.deallocate(p);
  e.alloc.empty_cache();
  CHECK(e.alloc.stats().reserved_bytes.current == 0);
  CHECK(e.device.used() == 0);
}

TEST_CASE("expandable maps each run of missing pages in one call, and waits for the stream before unmapping",
          "[alloc]") {
  fixture f(64 * MiB, "strategy:expandable");
  auto maps = [&] { return f.alloc.stats().num_backend_allocs; };
  void* a = f.alloc.allocate(8 * MiB);
  CHECK(maps() == 1);  // four pages, one call
  void* b = f.alloc.allocate(8 * MiB);
  void* c = f.alloc.allocate(8 * MiB);
  CHECK(maps() == 3);
  f.alloc.deallocate(b);
  f.alloc.empty_cache();  // b's four pages go: a hole between a and c
  CHECK(f.alloc.stats().num_backend_frees == 1);
  CHECK(f.device.used() == 16 * MiB);
  f.alloc.deallocate(a);
  f.alloc.deallocate(c);
  void* big = f.alloc.allocate(32 * MiB);  // over a (mapped), the hole, c (mapped) and four new pages
  CHECK(big == a);
  CHECK(maps() == 5);  // the hole and the tail: one call each
  CHECK(f.device.used() == 32 * MiB);
  f.alloc.check_invariants();
  f.alloc.deallocate(big);

  // A kernel queued on stream 5 may still use a block freed on it: reusing it on stream 5 is
  // ordered after the kernel, giving its memory back is not. Freeing waits for nothing; the
  // unmap waits for the stream.
  void* on5 = f.alloc.allocate(6 * MiB, 5);
  const event_id kernel = f.device.record_event(5);
  f.alloc.deallocate(on5);
  CHECK_FALSE(f.device.event_done(kernel));
  f.alloc.empty_cache();
  CHECK(f.device.event_done(kernel));
  CHECK(f.device.used() == 0);
  CHECK(f.alloc.stats().reserved_bytes.current == 0);
  f.alloc.check_invariants();
}

TEST_CASE("preallocate reserves up front and never grows", "[alloc]") {
  fixture f(32 * MiB, "strategy:preallocate");
  CHECK(f.device.used() == 32 * MiB);
  void* a = f.alloc.allocate(20 * MiB);
  CHECK_THROWS_AS(f.alloc.allocate(20 * MiB), isorun::out_of_memory);
  CHECK(f.alloc.stats().num_backend_allocs == 1);
  CHECK_THROWS_WITH(f.alloc.allocate(1024, 7), Catch::Contains("default stream only"));
  f.alloc.deallocate(a);
  fixture half(32 * MiB, "strategy:preallocate,fraction:0.5", 32 * MiB);
  CHECK(half.device.used() == 16 * MiB);
}

TEST_CASE("garbage_collection_threshold releases cache before growing past it", "[alloc]") {
  for (bool gc : {false, true}) {
    fixture f(100 * MiB, gc ? "garbage_collection_threshold:0.5" : "strategy:auto_growth");
    f.alloc.deallocate(f.alloc.allocate(30 * MiB));
    void* b = f.alloc.allocate(31 * MiB);  // does not fit the cached 30 MiB block
    const auto s = f.alloc.stats();
    CHECK(s.reserved_bytes.peak == static_cast<std::int64_t>(gc ? 32 * MiB : 62 * MiB));
    f.alloc.deallocate(b);
  }
}

TEST_CASE("max_split_size keeps oversize blocks whole", "[alloc]") {
  for (bool limit : {false, true}) {
    fixture f(256 * MiB, limit ? "max_split_size_mb:8" : "strategy:auto_growth");
    f.alloc.deallocate(f.alloc.allocate(32 * MiB));
    void* small = f.alloc.allocate(4 * MiB);
    CHECK(f.alloc.stats().segment.current == (limit ? 2 : 1));
    f.alloc.deallocate(small);
    f.alloc.check_invariants();
  }
}

TEST_CASE("pytorch_compat reproduces PyTorch's 20 MiB segments for mid-size requests", "[alloc]") {
  fixture compat(256 * MiB, "pytorch_compat:true");
  fixture ours(256 * MiB, "strategy:auto_growth");
  compat.alloc.deallocate(compat.alloc.allocate(3 * MiB));
  ours.alloc.deallocate(ours.alloc.allocate(3 * MiB));
  CHECK(compat.alloc.stats().reserved_bytes.current == static_cast<std::int64_t>(20 * MiB));
  CHECK(ours.alloc.stats().reserved_bytes.current == static_cast<std::int64_t>(4 * MiB));
}

TEST_CASE("a block used on another stream is not reused before that stream's work is done", "[alloc]") {
  fixture f(64 * MiB, "strategy:auto_growth");
  void* p = f.alloc.allocate(3 * MiB, 1);
  f.alloc.record_stream(p, 2);
  f.alloc.deallocate(p);
  CHECK(f.alloc.stats().active_bytes.current == static_cast<std::int64_t>(4 * MiB / 4 * 3));  // pending
  void* q = f.alloc.allocate(3 * MiB, 1);
  CHECK(q != p);  // still pending: not handed out again
  f.device.synchronize(2);
  void* r = f.alloc.allocate(3 * MiB, 1);
  CHECK(r == p);  // the event completed: the block came back
  CHECK(f.device.pending_events() == 0);
  CHECK(f.alloc.stats().active_bytes.current == static_cast<std::int64_t>(6 * MiB));
  f.alloc.deallocate(q);
  f.alloc.deallocate(r);
  f.alloc.check_invariants();
}

TEST_CASE("teardown returns everything and reports leaks", "[alloc]") {
  host_backend device(1ULL << 30);
  {
    caching_allocator a(std::make_unique<shared_host>(&device), 64 * MiB);
    a.allocate(1000);
    a.allocate(5 * MiB);
    a.deallocate(a.allocate(7 * MiB));
    auto s = a.release_all();
    CHECK(s.leaked_allocations == 2);
    CHECK(s.leaked_bytes == 1024 + 5 * MiB);
    CHECK(device.used() == 0);
  }
  {
    caching_allocator a(std::make_unique<shared_host>(&device), 64 * MiB, alloc_config::parse("strategy:expandable"));
    a.allocate(3 * MiB);
  }
  CHECK(device.used() == 0);
}

TEST_CASE("bad input gets a specific error", "[alloc]") {
  fixture f(64 * MiB, "strategy:auto_growth");
  CHECK_THROWS_WITH(f.alloc.allocate(0), Catch::Contains("zero-byte"));
  CHECK_THROWS_WITH(f.alloc.allocate(std::size_t{1} << 60), Catch::Contains("absurd"));
  void* p = f.alloc.allocate(100);
  f.alloc.deallocate(p);
  CHECK_THROWS_WITH(f.alloc.deallocate(p), Catch::Contains("already freed"));
  int local = 0;
  CHECK_THROWS_AS(f.alloc.deallocate(&local), std::invalid_argument);
  CHECK_THROWS_AS(f.alloc.record_stream(&local, 1), std::invalid_argument);
  host_backend d(1ULL << 30);
  CHECK_THROWS_WITH(caching_allocator(std::make_unique<shared_host>(&d), 1 * MiB),
                    Catch::Contains("cannot hold a single 2 MiB"));
  CHECK_THROWS_WITH(caching_allocator(std::make_unique<shared_host>(&d), 8 * MiB, alloc_config::parse("reserve_mb:8")),
                    Catch::Contains("leaves nothing"));
  f.alloc.check_invariants();
}

TEST_CASE("configuration strings: every knob, and precise errors", "[alloc][config]") {
  auto c = alloc_config::parse(
      "strategy:expandable, max_split_size_mb:128,garbage_collection_threshold:0.8,reserve_mb:256,"
      "debug_fill:0xA5,history:100,no_caching:false");
  CHECK(c.kind == strategy::expandable);
  CHECK(c.max_split_size == 128 * MiB);
  CHECK(c.garbage_collection_threshold == 0.8);
  CHECK(c.reserve == 256 * MiB);
  CHECK(c.debug_fill == 0xA5);
  CHECK(c.history == 100);
  CHECK(alloc_config::parse(c.to_string()).to_string() == c.to_string());
  CHECK(alloc_config::parse("expandable_segments:True").kind == strategy::expandable);
  CHECK(alloc_config::parse("").kind == strategy::auto_growth);
  auto p = alloc_config::parse("strategy:preallocate,fraction:0.9,initial_chunk_mb:512,regrowth_chunk_mb:64");
  CHECK(p.fraction == 0.9);
  const std::pair<const char*, const char*> bad[] = {
      {"strategy:greedy", "expected auto_growth, preallocate or expandable"},
      {"colour:blue", "unknown key 'colour'"},
      {"max_split_size_mb:lots", "whole number of MiB"},
      {"max_split_size_mb:1", "at least 2"},
      {"garbage_collection_threshold:1.5", "in (0, 1]"},
      {"no_caching:maybe", "true or false"},
      {"strategy:expandable,no_caching:true", "applies to strategy:auto_growth only"},
      {"debug_fill:300", "a byte"},
      {"strategy", "not key:value"},
      {"fraction:0.5", "strategy:preallocate only"},
  };
  for (auto [text, says] : bad) {
    INFO(text);
    CHECK_THROWS_AS(alloc_config::parse(text), config_error);
    CHECK_THROWS_WITH(alloc_config::parse(text), Catch::Contains(says));
  }
}

TEST_CASE("debug fill, history, mem_info, RAII buffers and container adaptor", "[alloc]") {
  fixture f(64 * MiB, "debug_fill:0xA5,history:8");
  {
    device_buffer buf(f.alloc, 4096);
    CHECK(buf.as<unsigned char>()[4095] == 0xA5);
    CHECK(f.alloc.mem_info().total == 64 * MiB);
    CHECK(f.alloc.mem_info().free == 64 * MiB - 4096);
  }
  CHECK(f.alloc.stats().allocated_bytes.current == 0);
  {
    std::vector<int, std_adaptor<int>> v{std_adaptor<int>(f.alloc)};
    for (int i = 0; i < 100000; ++i) v.push_back(i);
    CHECK(v[99999] == 99999);
    CHECK(f.alloc.stats().allocated_bytes.current > 0);
  }
  CHECK(f.alloc.stats().allocated_bytes.current == 0);
  const std::string h = f.alloc.history_json();
  CHECK_THAT(h, Catch::Contains("\"action\":\"free\""));
  CHECK(std::count(h.begin(), h.end(), '{') == 8);  // a ring buffer of 8
  CHECK_THAT(f.alloc.stats().to_json(), Catch::Contains("\"num_ooms\":0"));
}

namespace {

// Runs `touch` in a forked child; returns the signal that killed it (0 if it exited).
template <class F>
int dies_by(F touch) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::signal(SIGSEGV, SIG_DFL);  // die by the signal itself, not a sanitizer's report of it
    ::signal(SIGBUS, SIG_DFL);
    touch();
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFSIGNALED(status) ? WTERMSIG(status) : 0;
}

struct simulated_fixture {
  simulated_device* device;
  caching_allocator alloc;
  simulated_fixture(std::uint64_t cap, const char* conf, std::uint64_t capacity = 1ULL << 30)
      : device(new simulated_device(capacity)),
        alloc(std::unique_ptr<backend>(device), cap, alloc_config::parse(conf), "--mem-limit, simulated GPU") {}
};

}  // namespace

TEST_CASE("simulated device: host code that touches device memory dies as on a GPU", "[alloc][simulated]") {
  for (const char* conf : {"strategy:auto_growth", "strategy:expandable", "strategy:preallocate"}) {
    INFO(conf);
    simulated_fixture f(64 * MiB, conf);
    device_buffer buf(f.alloc, 4096);
    CHECK_FALSE(f.alloc.memory().host_accessible());
    CHECK(f.device->is_device_memory(buf.data(), 4096));
    CHECK(dies_by([&] { static_cast<volatile char*>(buf.data())[0] = 1; }) == SIGSEGV);
    CHECK(dies_by([&] { [[maybe_unused]] char c = static_cast<volatile char*>(buf.data())[100]; }) == SIGSEGV);
    // The way in and out is a copy, and it round-trips.
    std::vector<int> in(1024), out(1024, -1);
    std::iota(in.begin(), in.end(), 7);
    buf.copy_from_host(in.data(), in.size() * sizeof(int));
    buf.copy_to_host(out.data(), out.size() * sizeof(int));
    CHECK(out == in);
    device_buffer other = device_buffer::from_host(f.alloc, in.data(), 16);
    f.alloc.memory().copy(other.data(), buf.data(), 16, copy_kind::device_to_device);
    int back[4] = {};
    other.copy_to_host(back, sizeof back);
    CHECK(back[3] == 10);
  }
}

TEST_CASE("simulated device: a copy checks which side each pointer is on", "[alloc][simulated]") {
  simulated_fixture f(64 * MiB, "");
  device_buffer buf(f.alloc, 4096);
  std::vector<char> host(4096);
  auto& be = f.alloc.memory();
  // A host pointer where a device pointer belongs, and the reverse: what cudaMemcpy rejects.
  CHECK_THROWS_WITH(be.copy(host.data(), host.data(), 16, copy_kind::host_to_device),
                    Catch::Contains("not device memory"));
  CHECK_THROWS_WITH(be.copy(buf.data(), buf.data(), 16, copy_kind::device_to_host),
                    Catch::Contains("is device memory"));
  CHECK_THROWS_WITH(be.copy(buf.data(), host.data(), 16, copy_kind::device_to_device),
                    Catch::Contains("not device memory"));
  CHECK_THROWS_WITH(buf.copy_from_host(host.data(), 4097), Catch::Contains("exceed"));
  CHECK_THROWS_AS(std_adaptor<int>(f.alloc), std::invalid_argument);
}

TEST_CASE("simulated device: caps, expandable pages, debug fill and capacity behave as on a GPU",
          "[alloc][simulated]") {
  {
    simulated_fixture f(64 * MiB, "strategy:expandable,debug_fill:0xA5");
    std::vector<device_buffer> held;
    for (int i = 0; i < 8; ++i) held.emplace_back(f.alloc, 8 * MiB);
    CHECK_THROWS_AS(device_buffer(f.alloc, 8 * MiB), isorun::out_of_memory);
    unsigned char probe[8] = {};
    held[3].copy_to_host(probe, sizeof probe);
    CHECK(probe[7] == 0xA5);
    CHECK(f.device->used() == 64 * MiB);
    held.clear();
    f.alloc.empty_cache();
    CHECK(f.device->used() == 0);
    f.alloc.check_invariants();
  }
  {
    simulated_device device(16 * MiB);  // the GPU itself is full before the cap is
    void* a = device.allocate(16 * MiB);
    REQUIRE(a != nullptr);
    CHECK(device.allocate(2 * MiB) == nullptr);
    CHECK(device.device_memory().free == 0);
    device.deallocate(a, 16 * MiB);
    CHECK(device.device_memory().free == 16 * MiB);
  }
  {
    simulated_device device(64 * MiB);
    auto* range = static_cast<char*>(device.reserve_address(8 * MiB));
    REQUIRE(range != nullptr);
    char byte = 1;
    CHECK_THROWS_WITH(device.copy(range, &byte, 1, copy_kind::host_to_device), Catch::Contains("no memory mapped"));
    REQUIRE(device.map(range, 2 * MiB));
    CHECK_THROWS_WITH(device.map(range, 4 * MiB), Catch::Contains("already mapped"));  // as cuMemMap refuses it
    CHECK(device.used() == 2 * MiB);
    device.copy(range + 100, &byte, 1, copy_kind::host_to_device);
    device.unmap(range, 2 * MiB);
    REQUIRE(device.map(range, 2 * MiB));
    char back = 9;
    device.copy(&back, range + 100, 1, copy_kind::device_to_host);
    CHECK(back == 0);  // unmapped pages went back to the device
    device.unmap(range, 2 * MiB);
    device.release_address(range, 8 * MiB);
    CHECK(device.used() == 0);
  }
}

TEST_CASE("simulated device: chunk checksums computed where the bytes lie are libxxhash's XXH3, in every form",
          "[alloc][simulated]") {
  // The simulated device runs the CUDA kernel's decomposition (chunk_checksum.hpp) on the host.
  simulated_fixture f(64 * MiB, "");
  std::mt19937_64 rng(7);
  std::vector<unsigned char> bytes(3 * MiB + 77);
  for (auto& b : bytes) b = static_cast<unsigned char>(rng());
  device_buffer buf(f.alloc, bytes.size());
  buf.copy_from_host(bytes.data(), bytes.size());
  const auto t = isorun::test::check_chunk_checksums(f.alloc.memory(), buf.as<unsigned char>(), bytes);
  CHECK(t.declined == 0);
  CHECK(t.compared > 300);
  INFO(t.first_wrong);
  CHECK(t.wrong == 0);

  // Through a buffer, and the errors.
  std::uint64_t one = 0;
  const std::uint64_t length = 100;
  REQUIRE(buf.checksum_chunks(&length, sizeof length, 100, 4 << 20, &one));
  std::vector<unsigned char> expect(sizeof length + 100);
  std::memcpy(expect.data(), &length, sizeof length);
  std::memcpy(expect.data() + sizeof length, bytes.data(), 100);
  CHECK(one == XXH3_64bits(expect.data(), expect.size()));
  const unsigned char header[17] = {};
  CHECK_THROWS_WITH(buf.checksum_chunks(header, 17, 100, 4 << 20, &one),
                    Catch::Contains("a header of 17 bytes (at most 16)"));
  CHECK_THROWS_WITH(buf.checksum_chunks(header, 0, 100, 0, &one), Catch::Contains("a chunk of 0 bytes"));
  CHECK_THROWS_AS(buf.checksum_chunks(header, 0, bytes.size() + 1, 4 << 20, &one), std::out_of_range);
  CHECK_THROWS_WITH(f.alloc.memory().checksum_chunks(nullptr, 0, bytes.data(), 100, 4 << 20, &one),
                    Catch::Contains("not device memory"));
  // The host backend cannot (its caller hashes host memory itself): nothing is written.
  fixture host(64 * MiB, "");
  device_buffer on_host(host.alloc, 64);
  one = 42;
  CHECK_FALSE(on_host.checksum_chunks(nullptr, 0, 64, 4 << 20, &one));
  CHECK(one == 42);
}

TEST_CASE("the CUDA context counted against the cap: the device's delta when plausible", "[alloc][cuda]") {
  // H100, driver 580: NVML attributes 518 MiB to the process, the device's used memory grew 527.
  CHECK(counted_context_bytes(518 * MiB, 527 * MiB) == 527 * MiB);
  // Another process allocated (or freed) while the context was created: the delta says nothing.
  CHECK(counted_context_bytes(518 * MiB, 2048 * MiB) == 518 * MiB + context_margin);
  CHECK(counted_context_bytes(518 * MiB, 100 * MiB) == 518 * MiB + context_margin);
  CHECK(counted_context_bytes(518 * MiB, 0) == 518 * MiB + context_margin);
  // No per-process accounting (some vGPU and MIG setups): the delta is all there is.
  CHECK(counted_context_bytes(0, 530 * MiB) == 530 * MiB);
  CHECK(counted_context_bytes(0, 0) == 0);
}
