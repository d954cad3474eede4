// Admission (which calls run now, and where), executors, the host memory cap and thread limits.
#include <catch2/catch.hpp>

#include <thread>

#include "isorun/runner/admission.hpp"
#include "isorun/runner/executor.hpp"
#include "isorun/runner/host_memory.hpp"
#include "isorun/serialization/machine.hpp"
#include "runner_tasks.hpp"

using namespace runner_tests;
using isorun::runner::admission;
using isorun::runner::admission_request;
using namespace isorun::literals;

namespace {

std::shared_ptr<admission> one_gpu_of(std::uint64_t bytes, std::size_t cpu_slots = 2) {
  isorun::runner::gpu_info g{
      .index = 0, .uuid = "GPU-sim-0", .total_memory = bytes, .free_memory = bytes, .simulated = true};
  return std::make_shared<admission>(admission::limits{.gpus = {g}, .cpu_slots = cpu_slots, .name = "the test"});
}

admission_request on_gpu0(std::uint64_t cap) { return {.gpus = {0}, .mem_limit = cap}; }

// Whether `w` is admitted now, without waiting.
bool admitted(const std::shared_ptr<admission::waiter>& w) { return w->wait_for(std::chrono::milliseconds(0)); }

}  // namespace

TEST_CASE("admission puts no more caps on a GPU than its memory, and admits the rest in order", "[runner][admission]") {
  auto a = one_gpu_of(16_GiB);
  std::vector<std::shared_ptr<admission::waiter>> calls;
  for (int i = 0; i < 6; ++i) calls.push_back(a->enqueue(on_gpu0(6_GiB)));
  CHECK(a->running() == 2);
  CHECK(a->waiting() == 4);
  CHECK(admitted(calls[0]));
  CHECK(admitted(calls[1]));
  CHECK_FALSE(admitted(calls[2]));
  auto first = calls[0]->get();
  auto second = calls[1]->get();
  REQUIRE(first->gpus().size() == 1);
  CHECK(first->gpus().front().index == 0);
  first.reset();  // the first call's worker is gone: the third comes in, not a later one
  CHECK(admitted(calls[2]));
  CHECK_FALSE(admitted(calls[3]));
  CHECK(a->running() == 2);
  // A smaller call behind larger ones waits its turn on that GPU (no overtaking, no starvation).
  auto small = a->enqueue(on_gpu0(1_GiB));
  CHECK_FALSE(admitted(small));
  // A CPU call does not wait behind GPU calls.
  auto cpu = a->enqueue({});
  CHECK(admitted(cpu));
}

TEST_CASE("a call that can never fit is refused at once, saying why", "[runner][admission]") {
  auto a = one_gpu_of(16_GiB, 2);
  CHECK_THROWS_WITH(a->enqueue(on_gpu0(20_GiB)),
                    Catch::Contains("exceeds GPU 0") && Catch::Contains("lower mem_limit"));
  CHECK_THROWS_WITH(a->enqueue({.gpus = {3}, .mem_limit = 1_GiB}),
                    Catch::Contains("GPU 3 is not one of the test's GPUs (0)"));
  CHECK_THROWS_WITH(a->enqueue({.gpu_count = 2, .mem_limit = 1_GiB}), Catch::Contains("2 GPUs asked for"));
  CHECK_THROWS_WITH(a->enqueue({.cpus = 3}), Catch::Contains("3 CPU slots") && Catch::Contains("2 CPU slots"));
  CHECK(a->waiting() == 0);
  CHECK(a->running() == 0);
}

TEST_CASE("a waiting call can be cancelled; the calls behind it move up", "[runner][admission]") {
  auto a = one_gpu_of(16_GiB, 1);
  auto running = a->enqueue({});
  auto second = a->enqueue({});
  auto third = a->enqueue({});
  CHECK(a->waiting() == 2);
  second->cancel();
  CHECK(a->waiting() == 1);
  CHECK(second->wait_for(std::chrono::milliseconds(0)));  // ended: get() answers at once
  CHECK_THROWS_AS(second->get(), isorun::cancelled);
  running->get().reset();  // the first call ends
  CHECK(admitted(third));
  // A waiter dropped before its grant leaves the queue too.
  { auto dropped = a->enqueue({}); }
  CHECK(a->waiting() == 0);
}

TEST_CASE("CPU slots given beyond the admission's are there while their lease lives", "[runner][admission]") {
  auto a = one_gpu_of(16_GiB, 2);
  std::vector<std::shared_ptr<admission::waiter>> calls;
  for (int i = 0; i < 4; ++i) calls.push_back(a->enqueue({}));
  CHECK(a->running() == 2);
  {
    auto lease = a->widen_cpu_slots(3);  // an executor or sweep given 3 slots on purpose
    CHECK(a->running() == 3);            // the first waiting call came in at once
    CHECK(admitted(calls[2]));
    CHECK_NOTHROW(a->enqueue({.cpus = 3}));  // no longer more than there are
  }
  calls[0]->get().reset();
  CHECK_FALSE(admitted(calls[3]));  // the lease is gone: 2 slots again, both taken
  calls[1]->get().reset();
  CHECK(admitted(calls[3]));
}

TEST_CASE("a call waiting on another thread is admitted when a running call ends", "[runner][admission]") {
  auto a = one_gpu_of(16_GiB, 1);
  auto ticket = a->admit({});
  auto later = a->enqueue({});
  std::shared_ptr<admission::ticket> got;
  std::thread waiter([&] { got = later->get(); });
  ticket.reset();
  waiter.join();
  CHECK(got != nullptr);
  CHECK(a->running() == 1);
}

TEST_CASE("any N GPUs go to the freest; a whole GPU for a call without a cap", "[runner][admission]") {
  std::vector<isorun::runner::gpu_info> two;
  for (int i = 0; i < 2; ++i)
    two.push_back({.index = i, .uuid = "GPU-sim-" + std::to_string(i), .total_memory = 16_GiB, .free_memory = 16_GiB});
  auto a = std::make_shared<admission>(admission::limits{.gpus = two, .cpu_slots = 1});
  auto on0 = a->admit({.gpus = {0}, .mem_limit = 10_GiB});
  auto any = a->admit({.gpu_count = 1, .mem_limit = 4_GiB});
  CHECK(any->gpus().front().index == 1);   // the freer one
  auto whole = a->enqueue({.gpus = {1}});  // no cap: GPU 1 to itself, once it is empty
  CHECK_FALSE(admitted(whole));
  any.reset();
  CHECK(admitted(whole));
}

TEST_CASE("an executor's calls wait for its slots and all succeed; cancel and shutdown while waiting",
          "[runner][admission][executor]") {
  // One GPU of 16 GiB (runner_tasks.cpp pins two), caps of 6 GiB: two at once.
  isorun::executor pool({.gpus = {0}, .mem_limit = 6_GiB, .per_gpu = 0});
  const std::size_t slots = std::min<std::size_t>(2, isorun::serialization::usable_cores());
  temp_fifo fifo;
  std::vector<isorun::call_handle<int>> calls;
  for (int i = 0; i < 6; ++i) calls.push_back(pool.submit(sleeps_long, 0));
  CHECK(pool.running() == slots);
  CHECK(pool.waiting() == 6 - slots);
  for (std::size_t i = 0; i < calls.size(); ++i) CHECK(calls[i].started() == (i < slots));
  // One waiting call cancelled: no worker, the outcome says so.
  calls[5].cancel();
  auto waited = calls[5].try_get();
  CHECK(waited.status().kind == isorun::outcome_kind::cancelled);
  CHECK(waited.status().message.find("waiting for admission") != std::string::npos);
  CHECK(calls[5].pid() == 0);
  // A running call stopped: the next one in line starts.
  calls[0].cancel();
  CHECK(calls[0].try_get().status().kind == isorun::outcome_kind::cancelled);
  calls[slots].wait_for(std::chrono::milliseconds(0));
  CHECK(pool.waiting() == 6 - slots - 2);
  // shutdown(cancel_waiting): the waiting ones end cancelled; no new call is taken.
  pool.shutdown(true);
  CHECK_THROWS_AS(pool.submit(sleeps_long, 0), isorun::usage_error);
  for (auto& c : calls) c.cancel();
  for (auto& c : calls) CHECK(c.try_get().status().kind == isorun::outcome_kind::cancelled);
  CHECK(pool.running() == 0);
}

TEST_CASE("calls made from many threads all succeed under the process's admission", "[runner][admission]") {
  std::vector<std::thread> threads;
  std::vector<std::uint64_t> caps(6);
  for (int i = 0; i < 6; ++i)
    threads.emplace_back([&, i] { caps[i] = isorun::isolated(hold, {.gpu = 0, .mem_limit = 6_GiB})(8); });
  for (auto& t : threads) t.join();
  for (auto c : caps) CHECK(c == 6_GiB);
  // An executor's map: every input, in order.
  isorun::executor pool({.cpu_slots = 2});
  auto results = pool.map(twice, std::vector<std::string>{"a", "b", "c"});
  REQUIRE(results.size() == 3);
  CHECK(results[2].value() == "cc");
}

TEST_CASE("an executor refuses what cannot work, naming the option", "[runner][admission][executor]") {
  CHECK_THROWS_WITH(isorun::executor({.cpu_slots = -1}), Catch::Contains("cpu_slots"));
  CHECK_THROWS_WITH(isorun::executor({.call = {.gpu = 0}}), Catch::Contains("places its calls itself"));
  CHECK_THROWS_WITH(isorun::executor({.gpus = {0}, .mem_limit = 20_GiB}), Catch::Contains("exceeds GPU 0"));
}

TEST_CASE("each worker gets its share of the cores as thread limits; a user's own value is kept", "[runner][threads]") {
  // A call of the process's admission: one CPU slot of one per core, one thread.
  CHECK(isorun::isolated(thread_vars)(0) == "1 1 1 1 1");
  const auto cores = std::to_string(isorun::serialization::usable_cores());
  CHECK(isorun::isolated(thread_vars, {.cpus_per_call = 1})(0) == "1 1 1 1 1");
  CHECK(isorun::isolated(thread_vars, {.env = {"OMP_NUM_THREADS=7"}})(0) == "7 7 7 7 7");  // the user's, for all
  CHECK(isorun::isolated(thread_vars, {.env = {"MKL_NUM_THREADS=5", "OMP_NUM_THREADS=2"}})(0) == "2 2 5 2 2");
  // An executor of one slot: all the cores.
  isorun::executor pool({.cpu_slots = 1});
  CHECK(pool.submit(thread_vars, 0).get() == cores + " " + cores + " " + cores + " " + cores + " " + cores);
}

TEST_CASE("a worker past its host memory cap ends out of memory; the caller and other workers live on",
          "[runner][host-memory]") {
  if (!cgroup_containment()) return;
  if (const std::string why = isorun::runner::host_memory_cap::unavailable(); !why.empty()) {
    WARN("skipped: " << why);
    return;
  }
  auto beside = isorun::isolated(sleeps_long).async(0);  // another worker, running meanwhile
  auto r = isorun::isolated(eats_host, {.host_mem_limit = 64_MiB}).try_call(512);
  CHECK(r.status().kind == isorun::outcome_kind::out_of_memory);
  CHECK(r.status().error_type == "host_memory");
  INFO(r.status().message);
  CHECK(r.status().message.find("host_mem_limit of 64") != std::string::npos);
  CHECK(r.status().host_memory_peak >= 32_MiB);
  CHECK(r.status().host_memory_peak <= 64_MiB + 4_MiB);
  CHECK_THROWS_AS(isorun::isolated(eats_host, {.host_mem_limit = 64_MiB})(512), isorun::out_of_memory);
  // Under the cap: it succeeds, and its peak is reported.
  // Room for a sanitizer build's worker too (its shadow memory and quarantine count).
  auto fine = isorun::isolated(eats_host, {.host_mem_limit = 1_GiB}).try_call(64);
  CHECK(fine.ok());
  CHECK(fine.status().host_memory_peak >= 64_MiB);
  CHECK_FALSE(beside.wait_for(std::chrono::milliseconds(0)));  // untouched
  beside.cancel();
  CHECK(beside.try_get().status().kind == isorun::outcome_kind::cancelled);
}

TEST_CASE("every outcome reports the worker's host memory peak", "[runner][host-memory]") {
  auto r = isorun::isolated(eats_host).try_call(48);
  REQUIRE(r.ok());
  CHECK(r.status().host_memory_peak >= 48_MiB);
}

TEST_CASE("a host memory cap is refused where it cannot be enforced, and below 16 MiB", "[runner][host-memory]") {
  CHECK_THROWS_WITH(isorun::isolated(eats_host, {.host_mem_limit = 1_MiB})(1), Catch::Contains("below the smallest"));
  ::setenv("ISORUN_CONTAINMENT", "process-group", 1);
  CHECK_THROWS_WITH(isorun::isolated(eats_host, {.host_mem_limit = 64_MiB})(1),
                    Catch::Contains("host-mem-limit cannot be enforced here") && Catch::Contains("cgroup"));
  ::unsetenv("ISORUN_CONTAINMENT");
}

TEST_CASE("a call cancelled while it waits behind an executor gives the executor's slot back", "[runner][admission]") {
  auto process = one_gpu_of(16_GiB, 1);
  auto executor = one_gpu_of(16_GiB, 1);
  auto busy = process->admit({});  // the process's one CPU slot is taken
  auto first = executor->enqueue({}, process.get());
  auto second = executor->enqueue({}, process.get());
  CHECK_FALSE(first->wait_for(std::chrono::milliseconds(0)));  // admitted by the executor, queued at the process
  CHECK(executor->running() == 1);
  CHECK(process->waiting() == 1);
  first->cancel();
  CHECK_THROWS_AS(first->get(), isorun::cancelled);
  CHECK(process->waiting() == 0);
  CHECK(executor->running() == 1);  // the second call has the slot now
  CHECK(executor->waiting() == 0);
  busy.reset();
  auto ticket = second->get();  // and then the process's
  CHECK(ticket != nullptr);
  CHECK(process->running() == 1);
}

TEST_CASE("calls outlive the executor that queued them", "[runner][admission][executor]") {
  std::vector<isorun::call_handle<std::string>> calls;
  {
    isorun::executor pool({.cpu_slots = 1});
    calls.push_back(pool.submit(twice, std::string("a")));
    calls.push_back(pool.submit(twice, std::string("b")));
  }  // cancels what still waits, waits for what runs
  CHECK(calls[0].get() == "aa");
  const auto second = calls[1].try_get();
  CHECK((second.ok() || second.status().kind == isorun::outcome_kind::cancelled));
  calls.clear();  // their places in the (gone) executor's queue go with them
}

TEST_CASE("with per_gpu, a call without a cap takes its share of the GPU, not all of it", "[runner][admission]") {
  isorun::runner::gpu_info g{.index = 0, .uuid = "GPU-sim-0", .total_memory = 16_GiB, .free_memory = 16_GiB};
  auto a = std::make_shared<admission>(admission::limits{.gpus = {g}, .per_gpu = 2, .cpu_slots = 1});
  auto one = a->enqueue({.gpus = {0}});
  auto two = a->enqueue({.gpus = {0}});
  auto three = a->enqueue({.gpus = {0}});
  CHECK(admitted(one));
  CHECK(admitted(two));
  CHECK_FALSE(admitted(three));
}
