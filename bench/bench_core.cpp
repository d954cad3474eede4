// Core benchmarks, side by side in one run (see bench/README.md):
//  (a) cold round trip of a trivial isolated task vs posix_spawn+waitpid of a C++ hello
//  (b) the same from a parent with 4 GiB resident
//  (c) isolated trivial tasks per second on all cores
//  (d) result bandwidth through shared memory vs memcpy and vs a pipe
//  (e) the same trivial task on a standby worker (launched ahead, used once) that the pool had
//      ready, refilled between calls outside the timed region (an internal figure: bench_calls
//      measures standby calls as users make them), and tasks per second with standby workers
//  (f) starting a child in a cgroup of its own (clone3) vs none, and vs moving it there
// Usage: bench_core [--quick] [--resident-gib N]
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "isorun/isorun.hpp"
#include "isorun/runner/containment.hpp"
#include "isorun/runner/job.hpp"
#include "isorun/runner/process.hpp"
#include "isorun/runner/standby.hpp"
#include "spawn.hpp"
#include "stats.hpp"

extern char** environ;
using namespace isorun;
using bench::show;
using bench::spawn_ms;
using bench::summarize;
using clk = std::chrono::steady_clock;

namespace {

int noop(int x) { return x; }

isorun::blob produce(std::uint64_t size) {
  isorun::blob b(size);
  std::memset(b.mutable_data(), 0x5a, size);  // touched before the clock starts
  return b;
}

// The same bytes, written where the result goes (worker_context::output_blob): no copy.
isorun::blob produce_in_place(std::uint64_t size) {
  isorun::blob b = isorun::this_worker().output_blob(size);
  std::memset(b.mutable_data(), 0x5a, size);
  return b;
}

// An ordinary container result: encoded into shared memory, decoded into the caller's vector.
std::vector<float> produce_vector(std::uint64_t size) { return std::vector<float>(size / sizeof(float), 1.5f); }

}  // namespace
ISORUN_TASK(noop);
ISORUN_TASK(produce_vector);
ISORUN_TASK(produce);
ISORUN_TASK(produce_in_place);

namespace {

std::int64_t now_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

double isolated_ms(const isolated_function<int, int>& f) {
  auto t0 = clk::now();
  if (f(7) != 7) std::abort();
  return std::chrono::duration<double, std::milli>(clk::now() - t0).count();
}

// (f): spawn+reap of the hello through isorun's spawn, in a cgroup of its own ("cgroup" true:
// made, born in with clone3, killed and removed at the reap) or in none.
double spawn_contained_ms(bool cgroup, int devnull) {
  runner::spawn_options o;
  o.executable = BENCH_HELLO;
  o.fds = {{1, devnull}};
  const auto t0 = clk::now();
  o.cgroup = cgroup ? runner::new_child_cgroup() : "";
  runner::spawn(o).reap();
  return std::chrono::duration<double, std::milli>(clk::now() - t0).count();
}

// The way before clone3: the vfork child moves itself into the cgroup (a write to its
// cgroup.procs, which takes the kernel's cgroup threadgroup lock for writing), then execs.
double spawn_moved_ms(int devnull) {
  const auto t0 = clk::now();
  const std::string dir = runner::new_child_cgroup();
  const int procs = ::open((dir + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC);
  char* argv[] = {const_cast<char*>(BENCH_HELLO), nullptr};
  const pid_t pid = ::vfork();
  if (pid == 0) {
    if (::write(procs, "0", 1) != 1 || ::dup2(devnull, 1) < 0) ::_exit(126);
    ::execve(BENCH_HELLO, argv, environ);
    ::_exit(127);
  }
  int st;
  ::waitpid(pid, &st, 0);
  ::close(procs);
  runner::kill_and_remove_cgroup(dir);
  return std::chrono::duration<double, std::milli>(clk::now() - t0).count();
}

struct pair_result {
  bench::summary isolated, hello;
};

pair_result round_trips(int n) {
  auto f = isolated(noop);
  f(0);  // warm the segment pool and page cache
  spawn_ms({BENCH_HELLO});
  std::vector<double> a, b;
  for (int i = 0; i < n; ++i) {  // interleaved, so noise hits both alike
    a.push_back(isolated_ms(f));
    b.push_back(spawn_ms({BENCH_HELLO}));
  }
  return {summarize(a), summarize(b)};
}

// (e): each call on a standby worker that is ready (the pool is refilled between calls, untimed),
// waiting for the worker's exit as every call does by default, and with early_result; side by
// side with a bare spawn. Back to back, and at intervals (`pause`): back to back, the newest
// replacement's start-up and an early call's exit share 2 cores with the next timed call; at
// intervals they are done, but idle cores take longer to wake.
struct standby_result {
  bench::summary waited, early, hello;
};
standby_result standby_round_trips(int n, std::chrono::milliseconds pause = {}) {
  auto waited = isolated(noop, {.standby = 2});
  auto early = isolated(noop, {.standby = 2, .early_result = true});
  auto& pool = runner::standby_for({.label = "standby"}, 2);  // the pool both use
  auto settle = [&] {
    pool.fill();
    if (pause.count()) std::this_thread::sleep_for(pause);
  };
  std::vector<double> a, e, b;
  for (int i = 0; i < n; ++i) {
    settle();
    a.push_back(isolated_ms(waited));
    settle();
    e.push_back(isolated_ms(early));
    b.push_back(spawn_ms({BENCH_HELLO}));
  }
  return {summarize(a), summarize(e), summarize(b)};
}

double throughput(int tasks, int in_flight, std::size_t standby = 0) {
  auto f = isolated(noop, {.standby = standby});
  std::deque<call_handle<int>> running;
  auto t0 = clk::now();
  for (int i = 0; i < tasks; ++i) {
    if (static_cast<int>(running.size()) >= in_flight) {
      running.front().get();
      running.pop_front();
    }
    running.push_back(f.async(i));
  }
  while (!running.empty()) {
    running.front().get();
    running.pop_front();
  }
  return tasks / std::chrono::duration<double>(clk::now() - t0).count();
}

// Worker began encoding -> supervisor holds a validated view.
double channel_gbps(std::uint64_t size, const char* task = "produce", bool place_blobs = true) {
  runner::job_spec spec;
  spec.task = task;
  if (!place_blobs) spec.extra_env = {"ISORUN_PLACE_BLOBS=0"};  // the blob in pages of its own, copied
  spec.args = detail::encode_args(size);
  const std::int64_t called = now_ns();
  auto job = runner::job::start(std::move(spec));
  const auto& r = job->wait();
  if (!r.status.ok() || r.payload.size() < size) std::abort();
  if (std::getenv("BENCH_BREAKDOWN")) {  // the worker's exit includes freeing the task's memory
    const std::int64_t encoded = r.encode_begin_ns + static_cast<std::int64_t>(r.encode_ns);
    std::printf(
        "      %s: worker encode %.1f ms, supervisor side %.1f ms: the worker's exit %.1f ms, validation %.1f ms; "
        "the whole call (start, task, result) %.1f ms\n",
        place_blobs ? task : "copied", r.encode_ns / 1e6, (r.received_ns - encoded) / 1e6,
        (r.reaped_ns - encoded) / 1e6, (r.received_ns - r.reaped_ns) / 1e6, (r.received_ns - called) / 1e6);
  }
  return static_cast<double>(size) / static_cast<double>(r.received_ns - r.encode_begin_ns);
}

// Worker began encoding -> the caller holds the decoded std::vector<float>.
double vector_gbps(std::uint64_t size) {
  runner::job_spec spec;
  spec.task = "produce_vector";
  spec.args = detail::encode_args(size);
  auto job = runner::job::start(std::move(spec));
  const auto& r = job->wait();
  if (!r.status.ok()) std::abort();
  const auto v = detail::decode_result<std::vector<float>>(r);
  const std::int64_t done = now_ns();
  if (v.size() != size / sizeof(float) || v.back() != 1.5f) std::abort();
  return static_cast<double>(size) / static_cast<double>(done - r.encode_begin_ns);
}

double memcpy_gbps(std::uint64_t size) {
  static std::vector<char> src, dst;
  if (src.size() < size) {
    src.assign(size, 1);
    dst.assign(size, 2);
  }
  auto t0 = now_ns();
  std::memcpy(dst.data(), src.data(), size);
  auto t1 = now_ns();
  if (dst[size / 2] != 1) std::abort();
  return static_cast<double>(size) / static_cast<double>(t1 - t0);
}

// A fresh process (this program, re-executed) writes `size` bytes already in its memory into a
// pipe; the parent reads them into a warm buffer. The writer sends its start time first.
int pipe_writer(std::uint64_t size) {
  std::vector<char> data(size, 7);
  std::int64_t t0 = now_ns();
  if (::write(1, &t0, sizeof t0) != sizeof t0) return 1;
  for (std::uint64_t off = 0; off < size;) {
    ssize_t n = ::write(1, data.data() + off, size - off);
    if (n <= 0) return 1;
    off += static_cast<std::uint64_t>(n);
  }
  return 0;
}

double pipe_gbps(std::uint64_t size) {
  static std::vector<char> sink;
  if (sink.size() < size) sink.assign(size, 0);
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) std::abort();
  ::fcntl(p[1], F_SETPIPE_SZ, 1 << 20);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, p[1], 1);
  const std::string n = std::to_string(size);
  char* argv[] = {const_cast<char*>("bench_core"), const_cast<char*>("--pipe-writer"), const_cast<char*>(n.c_str()),
                  nullptr};
  pid_t pid;
  if (posix_spawn(&pid, "/proc/self/exe", &fa, nullptr, argv, environ) != 0) std::abort();
  posix_spawn_file_actions_destroy(&fa);
  ::close(p[1]);
  std::int64_t t0 = 0;
  if (::read(p[0], &t0, sizeof t0) != sizeof t0) std::abort();
  for (std::uint64_t off = 0; off < size;) {
    ssize_t r = ::read(p[0], sink.data() + off, size - off);
    if (r <= 0) std::abort();
    off += static_cast<std::uint64_t>(r);
  }
  std::int64_t t1 = now_ns();
  ::close(p[0]);
  ::waitpid(pid, nullptr, 0);
  return static_cast<double>(size) / static_cast<double>(t1 - t0);
}

}  // namespace

int main(int argc, char** argv) {
  isorun::init(argc, argv);
  if (argc == 3 && std::string(argv[1]) == "--pipe-writer") return pipe_writer(std::strtoull(argv[2], nullptr, 10));
  bool quick = false;
  std::uint64_t resident_gib = 4;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--quick") quick = true;
    if (std::string(argv[i]) == "--resident-gib" && i + 1 < argc) resident_gib = std::strtoull(argv[++i], nullptr, 10);
  }
  const int n = quick ? 30 : 200;
  std::printf("isorun core benchmarks (%ld cores)\n\n", ::sysconf(_SC_NPROCESSORS_ONLN));

  auto small = round_trips(n);
  std::printf("(a) cold round trip, trivial isolated task  %s\n", show(small.isolated, "ms").c_str());
  std::printf("    posix_spawn+waitpid of a C++ hello      %s\n", show(small.hello, "ms").c_str());
  std::printf("    ratio isolated / hello (medians)        %.2f   goal <= 1.3\n\n",
              small.isolated.median / small.hello.median);
  bench::guard("core.cold_round_trip_over_hello", small.isolated.median / small.hello.median, "<=", 1.3);

  {
    std::vector<char> ballast(resident_gib << 30);
    std::memset(ballast.data(), 1, ballast.size());  // resident, not just reserved
    auto big = round_trips(n);
    std::printf("(b) same with %llu GiB resident in the parent %s\n", static_cast<unsigned long long>(resident_gib),
                show(big.isolated, "ms").c_str());
    std::printf("    posix_spawn hello from that parent      %s\n", show(big.hello, "ms").c_str());
    std::printf("    ratio (b) / (a) isolated medians        %.2f   goal <= 1.3\n\n",
                big.isolated.median / small.isolated.median);
    bench::guard("core.resident_parent_over_small", big.isolated.median / small.isolated.median, "<=", 1.3);
    if (!ballast.empty() && ballast[ballast.size() / 2] != 1) return 1;
  }

  std::vector<double> rates, hello_rates;
  for (int rep = 0; rep < (quick ? 2 : 5); ++rep) {
    rates.push_back(throughput(quick ? 300 : 1000, 4));
    hello_rates.push_back(bench::spawn_rate(BENCH_HELLO, quick ? 300 : 1000, 4));
  }
  auto tr = summarize(rates), hr = summarize(hello_rates);
  std::printf("(c) isolated trivial tasks per second       %s   goal >= 800\n", show(tr, "tasks/s").c_str());
  std::printf("    posix_spawn'd C++ hellos per second     %s   (the ceiling on this machine)\n",
              show(hr, "procs/s").c_str());
  std::printf("    ratio isolated / hello                  %.2f\n\n", tr.median / hr.median);

  {
    auto sb = standby_round_trips(quick ? 30 : 200);
    // Not what a user gets: the pool is refilled between calls outside the timed region (the
    // refill is an internal call). bench_calls measures standby calls as users make them.
    std::printf("(e) ready standby worker, pool refilled untimed (internal; users: bench_calls)\n");
    std::printf("    trivial task, exit waited for           %s\n", show(sb.waited, "ms").c_str());
    std::printf("    the same with early_result              %s   (handed over sealed; the exit finishes behind)\n",
                show(sb.early, "ms").c_str());
    std::printf("    posix_spawn+waitpid of a C++ hello      %s\n", show(sb.hello, "ms").c_str());
    auto spaced = standby_round_trips(quick ? 30 : 100, std::chrono::milliseconds(10));
    std::printf("    calls 10 ms apart: exit waited for      %s\n", show(spaced.waited, "ms").c_str());
    std::printf("                       early_result         %s\n", show(spaced.early, "ms").c_str());
    std::vector<double> srates;
    for (int rep = 0; rep < (quick ? 2 : 5); ++rep) srates.push_back(throughput(quick ? 300 : 1000, 4, 8));
    const auto st = summarize(srates);
    std::printf("    tasks per second, 8 standby, 4 in flight %s\n", show(st, "tasks/s").c_str());
    std::printf("    ratio to the bare hellos of (c)         %.2f\n\n", st.median / hr.median);
    runner::stop_standby();
  }

  if (runner::containment().cgroup) {
    const int devnull = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
    std::vector<double> none_ms, born_ms, moved_ms;
    for (int i = 0; i < n; ++i) {  // interleaved, so that drift hits all three alike
      none_ms.push_back(spawn_contained_ms(false, devnull));
      born_ms.push_back(spawn_contained_ms(true, devnull));
      moved_ms.push_back(spawn_moved_ms(devnull));
    }
    ::close(devnull);
    const auto none = summarize(none_ms), born = summarize(born_ms), moved = summarize(moved_ms);
    std::printf("(f) spawn+reap of the hello, no cgroup      %s\n", show(none, "ms").c_str());
    std::printf("    in a cgroup of its own (clone3)        %s   ratio %.2f\n", show(born, "ms").c_str(),
                born.median / none.median);
    std::printf("    moved there by the child (the old way)  %s   ratio %.2f\n\n", show(moved, "ms").c_str(),
                moved.median / none.median);
  } else {
    std::printf("(f) skipped: no cgroup containment here (%s)\n\n", runner::containment().why_not.c_str());
  }

  std::printf("(d) result bandwidth (GB/s = bytes/ns; worker starts encoding -> parent holds a validated view)\n");
  bench::summary small_first{};
  for (std::uint64_t size : {1ULL << 20, 64ULL << 20, 1ULL << 30}) {
    std::vector<double> ch, pl, ip, vc, mc, pp;
    const int reps = size >= (1ULL << 30) ? (quick ? 3 : 5) : (quick ? 5 : 15);
    channel_gbps(size);  // warm the pooled segment
    for (int i = 0; i < reps; ++i) {
      ch.push_back(channel_gbps(size, "produce", false));
      pl.push_back(channel_gbps(size));
      ip.push_back(channel_gbps(size, "produce_in_place"));
      vc.push_back(vector_gbps(size));
      mc.push_back(memcpy_gbps(size));
      pp.push_back(pipe_gbps(size));
    }
    auto c = summarize(ch), placed = summarize(pl), in_place = summarize(ip), vec = summarize(vc), m = summarize(mc),
         p = summarize(pp);
    if (size == 1ULL << 20) small_first = placed;
    std::printf("    %5llu MiB  isorun %s   (blob result: made in the result segment from 32 MiB, by default)\n",
                static_cast<unsigned long long>(size >> 20), show(placed, "GB/s").c_str());
    std::printf(
        "               isorun %s   (blob result in pages of its own, copied into shared memory: "
        "ISORUN_PLACE_BLOBS=0)\n",
        show(c, "GB/s").c_str());
    std::printf("               isorun %s   (output_blob, written in place)\n", show(in_place, "GB/s").c_str());
    std::printf("               isorun %s   (std::vector<float>, decoded into the caller's memory)\n",
                show(vec, "GB/s").c_str());
    std::printf("               memcpy %s\n", show(m, "GB/s").c_str());
    std::printf("               pipe   %s\n", show(p, "GB/s").c_str());
    std::printf(
        "               isorun/memcpy: blob %.2f, copied %.2f, output_blob %.2f (goal >= 0.5 at 1 GiB); "
        "isorun/pipe: blob %.1f, copied %.1f (goal >= 10)\n",
        placed.median / m.median, c.median / m.median, in_place.median / m.median, placed.median / p.median,
        c.median / p.median);
    if (size == 1ULL << 30) bench::guard("core.result_1gib_over_memcpy", placed.median / m.median, ">=", 0.5);
  }
  // The pool now hands its 1 GiB segment to every result: a small one must not pay for it.
  std::vector<double> after;
  for (int i = 0; i < (quick ? 5 : 15); ++i) after.push_back(channel_gbps(1ULL << 20));
  const auto a = summarize(after);
  std::printf("        1 MiB  isorun %s   (blob result, after the 1 GiB results; ratio to before them %.2f)\n",
              show(a, "GB/s").c_str(), a.median / small_first.median);
  return 0;
}
