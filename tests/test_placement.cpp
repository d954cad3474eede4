// Placement of jobs on several GPUs: place_job's choices and errors, and gpu_packer's promises
// (never over-committed, first come first served, no starvation), with real threads.
#include <catch2/catch.hpp>

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "isorun/runner/errors.hpp"
#include "isorun/runner/gpu_packer.hpp"
#include "isorun/runner/placement.hpp"

namespace r = isorun::runner;

namespace {

constexpr std::uint64_t GiB = 1ULL << 30;

// `places[i]` slots on simulated GPU i.
std::vector<r::slot> slots_on(const std::vector<int>& places) {
  std::vector<r::slot> slots;
  for (std::size_t g = 0; g < places.size(); ++g)
    for (int i = 0; i < places[g]; ++i)
      slots.push_back({{{.index = static_cast<int>(g), .uuid = "GPU-sim-" + std::to_string(g), .simulated = true}},
                       static_cast<int>(slots.size())});
  return slots;
}

std::vector<int> indices(const std::vector<r::gpu_info>& gpus) {
  std::vector<int> out;
  for (const auto& g : gpus) out.push_back(g.index);
  return out;
}

// Spins (yielding) until `done()`: waits on state another thread changes, without a clock.
template <class F>
void until(F&& done) {
  while (!done()) std::this_thread::yield();
}

}  // namespace

TEST_CASE("place_job: listed GPUs in PCI bus order, any N with room, and what it refuses", "[placement]") {
  auto inv = r::gpu_inventory::simulated("16G,24G,16G,24G");
  inv.gpus[1].free_memory = 2 * GiB;  // GPU 1 is nearly full
  CHECK(indices(r::place_job(inv, {.indices = {3, 0}}, false, 8 * GiB)) == std::vector<int>{0, 3});
  CHECK(indices(r::place_job(inv, {.count = 2}, false, 8 * GiB)) ==
        std::vector<int>{0, 3});  // the freest: 24G, then 16G
  CHECK(indices(r::place_job(inv, {.count = 3}, false, 8 * GiB)) == std::vector<int>{0, 2, 3});  // not GPU 1: no room
  CHECK(indices(r::place_job(inv, {}, true, 0)) == std::vector<int>{0});
  CHECK(r::place_job(inv, {}, false, 0).empty());
  CHECK_THROWS_WITH(r::place_job(inv, {.count = 4}, false, 8 * GiB),
                    Catch::Contains("4 GPUs asked for, but only 3 of the 4 have 8.00 GiB free"));
  CHECK_THROWS_WITH(r::place_job(inv, {.count = 5}, false, 0), Catch::Contains("5 GPUs asked for, but there are 4"));
  CHECK_THROWS_WITH(r::place_job(inv, {.indices = {2, 2}}, false, 0), Catch::Contains("GPU 2 is listed twice"));
  CHECK_THROWS_WITH(r::place_job(inv, {.indices = {1, 7}}, false, 0), Catch::Contains("GPU 7 does not exist"));
  // The cap is per GPU: it must fit the smallest listed one.
  CHECK_THROWS_WITH(r::place_job(inv, {.indices = {1, 2}}, false, 20 * GiB),
                    Catch::Contains("exceeds GPU 2's 16.00 GiB"));
  CHECK_THROWS_AS(r::gpu_request_for({.gpu = 0, .gpus = {1}}), isorun::usage_error);
  CHECK_THROWS_WITH(r::gpu_request_for({.gpus = {1}, .gpu_count = 2}), Catch::Contains("give one of gpu"));
  CHECK(r::gpu_request_for({.gpu = 2}).indices == std::vector<int>{2});
}

TEST_CASE("gpu_packer serves in order: a waiting wide job holds the GPUs it waits for", "[placement]") {
  r::gpu_packer packer(slots_on({1, 1}));
  REQUIRE(packer.gpus() == 2);
  auto first = packer.acquire(1);
  REQUIRE(first);
  CHECK(indices(*first) == std::vector<int>{0});

  std::optional<std::vector<r::gpu_info>> wide, narrow;
  std::thread w([&] { wide = packer.acquire(2); });
  until([&] { return packer.waiting() == 1; });
  std::thread n([&] { narrow = packer.acquire(1); });
  until([&] { return packer.waiting() == 2; });  // GPU 1 is free, but held for the wide job
  packer.release(*first);
  w.join();  // the wide job goes first
  REQUIRE(wide);
  CHECK(indices(*wide) == std::vector<int>{0, 1});
  CHECK(packer.waiting() == 1);  // the narrow one still waits: nothing is free
  packer.release(*wide);
  n.join();
  REQUIRE(narrow);
  CHECK(narrow->size() == 1);
  packer.release(*narrow);

  // close() wakes whoever waits, empty-handed, and refuses what comes after.
  auto all = packer.acquire(2);
  std::optional<std::vector<r::gpu_info>> late = std::vector<r::gpu_info>{};
  std::thread l([&] { late = packer.acquire(1); });
  until([&] { return packer.waiting() == 1; });
  packer.close();
  l.join();
  CHECK_FALSE(late);
  CHECK_FALSE(packer.acquire(1));
  CHECK_THROWS_AS(packer.acquire(3), std::invalid_argument);
}

TEST_CASE("gpu_packer, random mixes of 1-, 2- and 4-GPU jobs: no GPU over-committed, every job served", "[placement]") {
  const std::vector<int> places = {2, 1, 3, 2};
  r::gpu_packer packer(slots_on(places));
  std::vector<std::atomic<int>> in_use(places.size());
  std::atomic<int> over{0}, wrong{0}, served{0};
  constexpr int threads = 8, jobs = 300;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(1234 + t));
      const std::size_t widths[] = {1, 1, 1, 2, 4};
      for (int j = 0; j < jobs; ++j) {
        const std::size_t k = widths[rng() % 5];
        auto got = packer.acquire(k);
        if (!got) return;
        std::set<int> distinct;
        for (const auto& g : *got) {
          distinct.insert(g.index);
          if (++in_use[static_cast<std::size_t>(g.index)] > places[static_cast<std::size_t>(g.index)]) ++over;
        }
        if (got->size() != k || distinct.size() != k) ++wrong;
        for (int spin = static_cast<int>(rng() % 50); spin > 0; --spin) std::this_thread::yield();
        for (const auto& g : *got) --in_use[static_cast<std::size_t>(g.index)];
        packer.release(*got);
        ++served;
      }
    });
  for (auto& th : pool) th.join();
  CHECK(over == 0);
  CHECK(wrong == 0);
  CHECK(served == threads * jobs);
  CHECK(packer.waiting() == 0);
}

TEST_CASE("gpu_packer: a 4-GPU job is served while 1-GPU jobs keep coming", "[placement]") {
  r::gpu_packer packer(slots_on({1, 1, 1, 1}));
  std::atomic<bool> wide_served{false};
  std::atomic<int> narrow_cycles{0};
  std::vector<std::thread> narrow;
  for (int t = 0; t < 4; ++t)
    narrow.emplace_back([&] {
      // Back-to-back 1-GPU jobs: without the reservation, some GPU would always be busy.
      while (!wide_served) {
        auto got = packer.acquire(1);
        if (!got) return;
        ++narrow_cycles;
        std::this_thread::yield();
        packer.release(*got);
      }
    });
  until([&] { return narrow_cycles >= 100; });  // they are all busy now
  auto wide = packer.acquire(4);                // would never return if narrow jobs could starve it
  REQUIRE(wide);
  CHECK(wide->size() == 4);
  wide_served = true;
  packer.release(*wide);
  for (auto& th : narrow) th.join();
}

TEST_CASE("gpu_packer with memory: caps that differ never add up to more than a GPU has", "[placement]") {
  // GPU 0 has 3 GiB for caps, GPU 1 only 1 GiB; two places each.
  r::gpu_packer packer(slots_on({2, 2}), {{0, 3 * GiB}, {1, 1 * GiB}});
  auto big = packer.acquire(1, 2 * GiB);  // only GPU 0 could ever hold it
  REQUIRE(big);
  CHECK(indices(*big) == std::vector<int>{0});
  // A second 2 GiB job waits though GPU 0 has a free place: 2 + 2 GiB is more than its 3 GiB.
  std::optional<std::vector<r::gpu_info>> second;
  std::thread w([&] { second = packer.acquire(1, 2 * GiB); });
  until([&] { return packer.waiting() == 1; });
  // GPU 1 is not held for it (it could never hold 2 GiB): a 1 GiB job takes it meanwhile.
  auto small = packer.acquire(1, 1 * GiB);
  REQUIRE(small);
  CHECK(indices(*small) == std::vector<int>{1});
  CHECK(packer.waiting() == 1);
  packer.release(*big, 2 * GiB);
  w.join();
  REQUIRE(second);
  CHECK(indices(*second) == std::vector<int>{0});
  // 1 GiB still fits beside it on GPU 0 (2 + 1 = 3 GiB), in its second place.
  auto beside = packer.acquire(1, 1 * GiB);
  REQUIRE(beside);
  CHECK(indices(*beside) == std::vector<int>{0});
  packer.release(*second, 2 * GiB);
  packer.release(*beside, 1 * GiB);
  packer.release(*small, 1 * GiB);
  // More than any GPU has is refused at once, not waited for.
  CHECK_THROWS_AS(packer.acquire(1, 4 * GiB), std::invalid_argument);
  CHECK_THROWS_AS(packer.acquire(2, 2 * GiB), std::invalid_argument);  // only one GPU could hold 2 GiB
}
