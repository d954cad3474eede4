// Runner: real worker processes, real shared memory. Calls, placement on (simulated) GPUs,
// launching ahead of the work, map(), a job's times and the allocator's cap. Results, failures
// and standby workers have files of their own; the tasks are in runner_tasks.hpp.
#include <catch2/catch.hpp>

#include "isorun/serialization/control.hpp"
#include "runner_tasks.hpp"

using namespace runner_tests;

TEST_CASE("structs, strings and vectors round-trip through a worker", "[runner]") {
  auto f = isorun::isolated(echo_point);
  point p{41, 2.5, "hi", {7, 8}};
  point q = f(p);
  CHECK(q == point{42, 2.5, "hi!", {7, 8, 2}});

  CHECK(isorun::isolated(concat)("ab", "c", 3) == "abcabcabc");
  CHECK(isorun::isolated(scale)(std::vector<double>{1, -2, 3.5}, 2.0) == std::vector<double>{2, -4, 7});
}

TEST_CASE("void tasks return normally", "[runner]") { CHECK_NOTHROW(isorun::isolated(no_result)(1)); }

TEST_CASE("the worker sees exactly its assigned GPU (simulated inventory)", "[runner]") {
  REQUIRE(isorun::gpus().source == isorun::runner::gpu_inventory::origin::simulated);
  REQUIRE(isorun::gpus().gpus.size() == 2);
  CHECK(isorun::isolated(visible_devices, {.gpu = 1, .mem_limit = 6_GiB})(0) ==
        "GPU-sim-1|PCI_BUS_ID|1|" + std::to_string(6_GiB));
  CHECK(isorun::isolated(visible_devices)(0) == "|PCI_BUS_ID|-1|0");  // CPU: no GPU visible
}

TEST_CASE("a worker on several GPUs sees exactly them, in PCI bus order, each with its own capped allocator",
          "[runner][multi-gpu]") {
  REQUIRE(isorun::gpus().gpus.size() == 2);
  const std::string both = "GPU-sim-0,GPU-sim-1|simulated|0@0:GPU-sim-0:6G|1@1:GPU-sim-1:6G|peak 5G";
  // 5 GiB held on each of two GPUs under a 6 GiB cap: 10 GiB in all, within the cap on each.
  CHECK(isorun::isolated(on_devices, {.gpus = {1, 0}, .mem_limit = 6_GiB})(5_GiB) == both);
  CHECK(isorun::isolated(on_devices, {.gpu_count = 2, .mem_limit = 6_GiB})(5_GiB) == both);
  CHECK(isorun::isolated(on_devices, {.gpus = {1}, .mem_limit = 6_GiB})(1_GiB) ==
        "GPU-sim-1|simulated|1@0:GPU-sim-1:6G|peak 1G");
  // Past the cap on one device: that device's OOM, named.
  auto over = isorun::isolated(on_devices, {.gpus = {0, 1}, .mem_limit = 6_GiB}).try_call(7_GiB);
  REQUIRE_FALSE(over.ok());
  CHECK(over.status().kind == isorun::outcome_kind::out_of_memory);
  CHECK_THAT(over.status().message, Catch::Contains("--mem-limit 6144 MiB on GPU 0"));
  CHECK(over.status().device == "GPU-sim-0,GPU-sim-1");
}

TEST_CASE("impossible requests for several GPUs are usage errors and start nothing", "[runner][multi-gpu]") {
  const int fds = isorun::test::open_fds();
  CHECK_THROWS_WITH(isorun::isolated(on_devices, {.gpu_count = 3, .mem_limit = 1_GiB})(0),
                    Catch::Contains("3 GPUs asked for, but there are 2"));
  CHECK_THROWS_WITH(isorun::isolated(on_devices, {.gpus = {1, 1}})(0), Catch::Contains("GPU 1 is listed twice"));
  CHECK_THROWS_WITH(isorun::isolated(on_devices, {.gpus = {0, 2}})(0), Catch::Contains("GPU 2 does not exist"));
  CHECK_THROWS_WITH(isorun::isolated(on_devices, {.gpus = {0, 1}, .mem_limit = 17_GiB})(0),
                    Catch::Contains("exceeds GPU 0"));
  CHECK_THROWS_WITH(isorun::isolated(on_devices, {.gpu = 0, .gpus = {1}})(0), Catch::Contains("give one of gpu"));
  CHECK(::waitpid(-1, nullptr, WNOHANG) == -1);  // no child was started
  CHECK(isorun::test::open_fds() == fds);
}

TEST_CASE("impossible requests are usage errors and start nothing", "[runner]") {
  const int fds = isorun::test::open_fds();
  CHECK_THROWS_AS(isorun::isolated(visible_devices, {.gpu = 5})(0), isorun::usage_error);
  CHECK_THROWS_WITH(isorun::isolated(visible_devices, {.gpu = 5})(0), Catch::Contains("available: 0..1"));
  CHECK_THROWS_WITH(isorun::isolated(visible_devices, {.gpu = 0, .mem_limit = 32_GiB})(0),
                    Catch::Contains("exceeds GPU 0"));
  int (*unregistered)(int) = [](int x) { return x; };
  CHECK_THROWS_WITH(isorun::isolated(unregistered)(1), Catch::Contains("not a registered task"));
  CHECK(::waitpid(-1, nullptr, WNOHANG) == -1);  // no child was started
  CHECK(isorun::test::open_fds() == fds);
}

TEST_CASE("a worker launched before its work waits for it, and takes its GPU from the assignment", "[runner]") {
  namespace r = isorun::runner;
  r::local_launcher launcher;
  {
    // Launched and never assigned: stopped with its handle, nothing left.
    r::launched_worker idle = launcher.launch({.label = "idle"});
    const pid_t pid = idle.process.pid();
    idle = {};
    CHECK(isorun::test::process_gone(pid));
  }
  r::launched_worker w = launcher.launch({.label = "standby"});
  const pid_t pid = w.process.pid();
  r::job_spec spec;
  spec.task = "visible_devices";
  spec.args = isorun::detail::encode_args(0);
  spec.gpus = {isorun::gpus().gpus.at(1)};
  spec.mem_limit = 6_GiB;
  auto job = r::job::start(std::move(spec), std::move(w));
  CHECK(job->pid() == pid);
  const auto& res = job->wait();
  REQUIRE(res.status.kind == isorun::outcome_kind::success);
  // It was exec'd seeing no GPU; the assignment brought GPU 1 and the cap.
  CHECK(isorun::detail::to_result<std::string>(res).value() == "GPU-sim-1|PCI_BUS_ID|1|" + std::to_string(6_GiB));
}

TEST_CASE("a call's pid stays its worker's once the worker is reaped", "[runner]") {
  auto h = isorun::isolated(pid_and_calls).async(0);
  auto r = h.try_get();  // the worker is gone by now
  REQUIRE(r.ok());
  CHECK(h.pid() == std::stoi(r.value()));
}

TEST_CASE("a job's times: the worker's encoding, then its reaping, then the validation", "[runner]") {
  // (Not with early_result: its exit would finish behind, on a thread still holding descriptors
  // while the next test counts them.)
  namespace r = isorun::runner;
  r::job_spec spec;
  spec.task = "make_pattern";
  spec.args = isorun::detail::encode_args(std::uint64_t{40_MiB}, std::uint64_t{5});
  auto job = r::job::start(std::move(spec));
  const auto& res = job->wait();
  REQUIRE(res.status.kind == isorun::outcome_kind::success);
  const std::int64_t encoded = res.encode_begin_ns + static_cast<std::int64_t>(res.encode_ns);
  CHECK(res.encode_begin_ns > 0);
  CHECK(encoded <= res.reaped_ns);
  CHECK(res.reaped_ns <= res.received_ns);
}

TEST_CASE("a small result comes back in the worker's done, a larger one through shared memory", "[runner]") {
  namespace r = isorun::runner;
  namespace ser = isorun::serialization;
  // The largest payload sent inline: its length prefix and its bytes fill the limit.
  const std::uint64_t largest_inline = ser::inline_limit - ser::header_size - sizeof(std::uint64_t);
  for (const bool early : {false, true}) {
    for (const std::uint64_t size : {std::uint64_t{0}, std::uint64_t{104}, largest_inline, largest_inline + 8, 1_MiB}) {
      INFO(size << " bytes" << (early ? ", early_result" : ""));
      auto spec = r::job_spec_for("make_pattern", ser::encoding::binary,
                                  isorun::detail::encode_args(size, std::uint64_t{3}), {}, {.early_result = early});
      auto job = r::job::start(std::move(spec));
      const auto& res = job->wait();
      REQUIRE(res.status.kind == isorun::outcome_kind::success);
      if (early) CHECK(isorun::test::process_gone(job->pid()));  // (its exit finishes behind the call)
      CHECK(res.sent_inline == (size <= largest_inline));
      // Early, a result sent inline needs no seal: it is handed over before the exit either way.
      CHECK(res.status.exit_pending == early);
      const auto b = isorun::detail::to_result<isorun::blob>(res).value();
      REQUIRE(b.size() == size);
      bool intact = true;
      for (std::uint64_t i = 0; i < size; ++i) intact &= b.data()[i] == pattern_byte(i, 3);
      CHECK(intact);
    }
  }
}

TEST_CASE("the worker's allocator enforces the cap and reports its peaks", "[runner][alloc]") {
  auto f = isorun::isolated(hold, {.mem_limit = 32_MiB});
  auto r = f.try_call(20);
  REQUIRE(r.ok());
  CHECK(r.value() == 32_MiB);
  CHECK(r.status().peak_allocated == 20_MiB);
  CHECK(r.status().peak_reserved >= 20_MiB);
  CHECK(r.status().peak_reserved <= 32_MiB);
  try {
    f(40);
    FAIL("expected out_of_memory");
  } catch (const isorun::out_of_memory& e) {
    CHECK_THAT(e.what(), Catch::Contains("cap 32.00 MiB"));
  }
  CHECK_THROWS_AS(isorun::isolated(hold, {.alloc_conf = "strategy:nope"})(1), isorun::usage_error);
}

TEST_CASE("map runs a task over inputs on packed slots and keeps input order", "[runner][map]") {
  std::vector<int> inputs = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  auto results = isorun::map(exits_early, inputs, {.cpu_slots = 3, .echo_stderr = false});
  REQUIRE(results.size() == inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    CHECK(results[i].status().kind == isorun::outcome_kind::crashed);
    CHECK(results[i].status().exit.code == static_cast<int>(i));  // each result is its own input's
  }
  auto on_gpus = isorun::map(visible_devices, std::vector<int>(6, 0), {.all_gpus = true, .mem_limit = 8_GiB});
  std::map<std::string, int> seen;
  for (auto& r : on_gpus) seen[r.value().substr(0, 9)]++;
  CHECK(seen.size() == 2);  // both simulated GPUs were used
  CHECK_THROWS_AS(isorun::map(visible_devices, std::vector<int>{0}, {.all_gpus = true, .mem_limit = 64_GiB}),
                  isorun::usage_error);
  // Parameter sets as inputs: typed results with outcomes.
  std::vector<point> configs = {{1, 0.5, "a", {}}, {2, 1.5, "b", {}}};
  auto trials = isorun::map(echo_point, configs, {.mem_limit = 64_MiB, .cpu_slots = 2});
  REQUIRE(trials.size() == 2);
  CHECK(trials[1].value().label == "b!");
  CHECK(trials[0].value().x == 2);
}
