// Calls as users make them (issue "fast path"; figures in bench/README.md, "Calls"): a trivial
// task through isolated() and map() only, nothing prepared or refilled outside the timed region,
// each figure beside its floor from the same run, rounds interleaved so noise hits all alike.
//
//   cold       isolated(noop)                        floors: posix_spawn+waitpid of a static C
//                                                    program; of this executable returning from
//                                                    isorun::init at once; and the same call
//                                                    under process-group containment (the
//                                                    cgroup's cost), where cgroups are used
//   standby    isolated(noop, {.standby = 2})        the exit waited for; floors: the exit of a
//                                                    started static C program and of this
//                                                    executable, from a signal to the reap
//   early      ... {.standby = 2, .early_result}     handed over before the exit; floors: round
//                                                    trips of a pipe, of a memfd passed and
//                                                    mapped, of futex wakes (ipc_floors.hpp)
//   python     multiprocessing's reused Pool(1) round trip (python3 -c), the IPC reference
//   init cost  a minimal C++ main with isorun::init against the same main without libisorun, and
//              against one that uses the C++ standard library (and so loads it)
//   tasks/s    map() of trivial tasks, 4 in flight: cold, standby = 4; the static C spawn ceiling
//   cli        isorun --cpu -q -- tiny against tiny; isorun --cpu -q hello
//
// Each latency is measured back to back and with calls 5 ms apart. Usage: bench_calls [--quick]
// bench_calls --breakdown: where a call's time goes, step by step (the internal job API, for the
// timestamps the protocol carries).
// bench_calls --queued N: N calls queued on an executor of one slot behind one running call:
// threads, the caller's CPU while they wait, each submit, memory per queued call, the cancel.
#include <dirent.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "ipc_floors.hpp"
#include "isorun/isorun.hpp"
#include "isorun/runner/containment.hpp"
#include "isorun/runner/job.hpp"
#include "isorun/runner/launcher.hpp"
#include "isorun/runner/standby.hpp"
#include "isorun/serialization/control.hpp"
#include "spawn.hpp"
#include "stats.hpp"

extern char** environ;
using namespace isorun;
using bench::exit_ms;
using bench::spawn_ms;
using bench::summarize;
using bench::summary;
using clk = std::chrono::steady_clock;

namespace {
int noop(int x) { return x; }
// Runs until `path` (a FIFO) is opened for writing: the call the queue waits behind.
int hold(std::string path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  char c;
  const bool told = fd >= 0 && ::read(fd, &c, 1) >= 0;
  if (fd >= 0) ::close(fd);
  return told ? 0 : 1;
}
}  // namespace
ISORUN_TASK(noop);
ISORUN_TASK(hold);

namespace {

std::string self_path;

double ms_since(clk::time_point t0) { return std::chrono::duration<double, std::milli>(clk::now() - t0).count(); }

double call_ms(const isolated_function<int, int>& f) {
  const auto t0 = clk::now();
  if (f(7) != 7) std::abort();
  return ms_since(t0);
}

// multiprocessing's reused Pool(1): apply() round trips of a trivial function, pickling both
// ways, n of them after 20 to warm up; the pause as for the other figures. Empty if no python3.
std::vector<double> python_pool_ms(int n, int pause_ms) {
  const std::string script =
      "import multiprocessing as mp, time, sys\n"
      "def f(x): return x\n"
      "if __name__ == '__main__':\n"
      "    n, pause = int(sys.argv[1]), int(sys.argv[2]) / 1000\n"
      "    with mp.get_context('forkserver').Pool(1) as p:\n"
      "        for _ in range(20): p.apply(f, (7,))\n"
      "        for _ in range(n):\n"
      "            if pause: time.sleep(pause)\n"
      "            t = time.perf_counter(); p.apply(f, (7,)); print((time.perf_counter() - t) * 1e3)\n";
  char path[] = "/tmp/bench_calls_pool_XXXXXX.py";
  const int fd = ::mkstemps(path, 3);
  std::vector<double> v;
  if (fd < 0) return v;
  const bool written = ::write(fd, script.data(), script.size()) == static_cast<ssize_t>(script.size());
  ::close(fd);
  FILE* p = written ? ::popen(("python3 " + std::string(path) + " " + std::to_string(n) + " " +
                               std::to_string(pause_ms) + " 2>/dev/null")
                                  .c_str(),
                              "r")
                    : nullptr;
  if (p) {
    double ms;
    while (std::fscanf(p, "%lf", &ms) == 1) v.push_back(ms);
    ::pclose(p);
  }
  ::unlink(path);
  return v;
}

// Tasks per second: `tasks` calls with `in_flight` running, through map() on that many CPU slots.
double map_rate(int tasks, int in_flight, std::size_t standby) {
  std::vector<int> inputs(static_cast<std::size_t>(tasks), 7);
  const auto t0 = clk::now();
  auto results = map(noop, inputs, {.cpu_slots = in_flight, .standby = standby});
  const double s = ms_since(t0) / 1e3;
  for (auto& r : results)
    if (!r.ok() || r.value() != 7) std::abort();
  return tasks / s;
}

void line(const char* what, const summary& s, const summary* floor = nullptr, const char* goal = "") {
  std::printf("  %-44s %7.3f ms  [%6.3f, %6.3f]", what, s.median, s.p10, s.p90);
  if (floor) std::printf("  %5.2fx", s.median / floor->median);
  std::printf("  %s\n", goal);
}

// One latency table, calls `pause` apart. Rounds interleave the figures so that noise hits all
// alike; within a round each figure makes a block of calls of its own kind, the first two of
// which are not counted: they would meet what the block before left running (a standby pool's
// replacement launches).
// The IPC floors' peers, made first thing in main(): before any call has a worker, a socket or
// a thread that a fork would copy into them.
struct ipc_peers {
  bench::ipc_peer pipe{bench::ipc_peer::pipe_trip}, memfd{bench::ipc_peer::memfd_trip},
      futex{bench::ipc_peer::futex_trip}, across{bench::ipc_peer::pipe_across};
};
std::unique_ptr<ipc_peers> peers;

void latencies(int n, int pause_ms) {
  const auto cold = isolated(noop);
  const auto standby = isolated(noop, {.standby = 2});
  const auto early = isolated(noop, {.standby = 2, .early_result = true});
  // The cold call once more under process-group containment: what its cgroup (made, joined at
  // birth, killed and removed) costs on the path. Only where children get cgroups at all.
  const bool cgroups = isorun::runner::containment().cgroup;
  std::vector<double> tiny, same, c, cpg, s, e, pipe_rt, across_rt, memfd_rt, futex_rt, tiny_exit, same_exit;
  auto& [pipe_peer, memfd_peer, futex_peer, across_peer] = *peers;
  constexpr int block = 10, skipped = 2;
  const auto run_block = [&](std::vector<double>& into, const std::function<double()>& call) {
    for (int i = 0; i < block + skipped; ++i) {
      if (pause_ms) std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
      const double ms = call();
      if (i >= skipped) into.push_back(ms);
    }
  };
  for (int round = 0; round < (n + block - 1) / block; ++round) {
    run_block(tiny, [] { return spawn_ms({BENCH_TINY}); });
    run_block(pipe_rt, [&] { return pipe_peer.round_trip_ms(); });
    if (across_peer.available()) run_block(across_rt, [&] { return across_peer.round_trip_ms(); });
    run_block(memfd_rt, [&] { return memfd_peer.round_trip_ms(); });
    run_block(futex_rt, [&] { return futex_peer.round_trip_ms(); });
    run_block(same, [] { return spawn_ms({self_path, "--exit-at-once"}); });
    run_block(tiny_exit, [] { return exit_ms({BENCH_TINY, "wait"}); });
    run_block(same_exit, [] { return exit_ms({self_path, "--wait-for-signal"}); });
    run_block(c, [&] { return call_ms(cold); });
    if (cgroups) {
      ::setenv("ISORUN_CONTAINMENT", "process-group", 1);  // read at each call
      run_block(cpg, [&] { return call_ms(cold); });
      ::unsetenv("ISORUN_CONTAINMENT");
    }
    run_block(s, [&] { return call_ms(standby); });
    run_block(e, [&] { return call_ms(early); });
  }
  const auto py = python_pool_ms(n, pause_ms);
  const summary t = summarize(tiny), x = summarize(same);
  if (pause_ms) std::printf("\ncalls %d ms apart (n=%zu each)\n", pause_ms, c.size());
  else std::printf("\nback to back (n=%zu each)\n", c.size());
  line("floor: static C program, spawn+waitpid", t);
  const summary pipe_floor = summarize(pipe_rt), memfd_floor = summarize(memfd_rt);
  line("floor: pipe round trip", pipe_floor);
  if (!across_rt.empty()) line("floor: the same, its ends pinned to two CPUs", summarize(across_rt));
  line("floor: memfd + SCM_RIGHTS, mapped, round trip", memfd_floor);
  line("floor: futex wake each way, shared memory", summarize(futex_rt));
  line("floor: this executable, spawn+exit", x, &t);
  line("cold call, isolated(noop)", summarize(c), &x, "goal <= 1.2x the same executable");
  std::printf("  %-44s %7s     %16s  %5.2fx  (to the static C program)\n", "", "", "", summarize(c).median / t.median);
  if (cgroups) line("cold call, process-group containment only", summarize(cpg), &x, "(what the cgroup costs)");
  line("floor: static C program started, its exit", summarize(tiny_exit), &t);
  line("floor: this executable started, its exit", summarize(same_exit), &t);
  line("standby = 2, exit waited for", summarize(s), &t, "goal <= 0.6x the static C program");
  std::printf("  %-44s %7s     %16s  %5.2fx  (to early_result + this executable's exit)\n", "", "", "",
              summarize(s).median / (summarize(e).median + summarize(same_exit).median));
  line("standby = 2, early_result", summarize(e), &t, "goal <= 0.25x the static C program");
  std::printf("  %-44s %7s     %16s  %5.2fx  (to the memfd round trip; goal <= 3x)\n", "", "", "",
              summarize(e).median / memfd_floor.median);
  {
    const std::string at = pause_ms ? "spaced" : "back_to_back";
    bench::guard(("calls.cold_over_same_executable." + at).c_str(), summarize(c).median / x.median, "<=", 1.2);
    bench::guard(("calls.standby_waited_over_static_c." + at).c_str(), summarize(s).median / t.median, "<=", 0.6);
    bench::guard(("calls.standby_early_over_static_c." + at).c_str(), summarize(e).median / t.median, "<=", 0.25);
    bench::guard(("calls.standby_early_over_memfd_round_trip." + at).c_str(), summarize(e).median / memfd_floor.median,
                 "<=", 3);
  }
  if (!py.empty()) {
    const summary p = summarize(py);
    line("python multiprocessing Pool(1) round trip", p, &t);
    std::printf("  %-44s %5.2fx the Python pool   goal <= 1\n", "early_result", summarize(e).median / p.median);
  } else {
    std::printf("  python3 with multiprocessing: not found, reference skipped\n");
  }
}

}  // namespace

// Where a call's time goes, step by step, cold and on a standby worker, by the timestamps both
// processes take (CLOCK_MONOTONIC is system-wide; runner::call_trace and the protocol's done):
// each step's median beside the floors measured in the same run (a wake-up is half a spaced pipe
// round trip; the memfd round trip is all a standby call must do between two processes). Calls
// 5 ms apart, as users space calls.
void breakdown(int n) {
  namespace r = isorun::runner;
  auto& [pipe_peer, memfd_peer, futex_peer, across_peer] = *peers;
  std::vector<double> pipe_rt, across_rt, memfd_rt;
  for (int i = 0; i < n; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    pipe_rt.push_back(pipe_peer.round_trip_ms() * 1e3);
    if (across_peer.available()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      across_rt.push_back(across_peer.round_trip_ms() * 1e3);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    memfd_rt.push_back(memfd_peer.round_trip_ms() * 1e3);
  }
  const double wake = summarize(pipe_rt).median / 2, memfd = summarize(memfd_rt).median;
  const double idle_wake = across_rt.empty() ? 0 : summarize(across_rt).median / 2;
  static constexpr const char* steps[] = {"prepare: request written, result segment ready",
                                          "take a worker (cold: assign it before its start)",
                                          "assign: the message and 2 descriptors sent",
                                          "to the worker: it has its assignment (cold: spawn)",
                                          "worker: request mapped",
                                          "worker: to the task (devices, result sink)",
                                          "task",
                                          "encode",
                                          "worker: result let go (early), done sent",
                                          "to the caller: done read",
                                          "exit and reap (exit waited for)",
                                          "validate and hand over",
                                          "return to the caller",
                                          "total"};
  constexpr std::size_t rows = std::size(steps);
  std::vector<std::array<std::vector<double>, rows>> kinds(3);
  for (int kind = 0; kind < 3; ++kind) {  // cold; standby, exit waited for; standby, early_result
    const bool early = kind == 2;
    auto spec = r::job_spec_for("noop", serialization::encoding::binary, detail::encode_args(7), {},
                                {.standby = kind ? 2u : 0u, .early_result = early});
    spec.caller_waits = true;  // as a call's waiter starts it
    r::local_launcher cold;
    r::launcher& from = kind ? static_cast<r::launcher&>(r::standby_for(r::launch_spec_for(spec), 2)) : cold;
    auto& v = kinds[static_cast<std::size_t>(kind)];
    for (int i = 0; i < n + 2; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      auto j = r::job::start(spec, from);
      const auto& res = j->wait();
      const std::int64_t returned = serialization::monotonic_ns();
      if (!res.status.ok()) std::abort();
      if (i < 2) continue;  // (the first meet a pool still filling)
      const r::call_trace& t = res.trace;
      const std::int64_t run_begin = res.encode_begin_ns - res.status.run.count();
      const std::int64_t encoded = res.encode_begin_ns + static_cast<std::int64_t>(res.encode_ns);
      const std::int64_t handed = std::max(t.done_seen_ns, res.reaped_ns);
      // A cold worker is assigned before its start: its spawn and start are the way to it.
      const std::int64_t taken = t.assigned_ns < t.launched_ns ? t.assigned_ns : t.launched_ns;
      const std::int64_t at[] = {t.begin_ns,
                                 t.prepared_ns,
                                 taken,
                                 t.assigned_ns,
                                 t.worker_assigned_ns,
                                 t.worker_request_ns,
                                 run_begin,
                                 res.encode_begin_ns,
                                 encoded,
                                 t.worker_sent_ns,
                                 t.done_seen_ns,
                                 handed,
                                 res.received_ns,
                                 returned};
      for (std::size_t k = 0; k + 1 < rows; ++k) v[k].push_back(static_cast<double>(at[k + 1] - at[k]) / 1e3);
      v[rows - 1].push_back(static_cast<double>(returned - t.begin_ns) / 1e3);
    }
  }
  isorun::stop_standby();
  std::printf("where a call's time goes, calls 5 ms apart, n=%d, median us (timestamps of both processes)\n", n);
  std::printf("  %-52s %9s %9s %9s\n", "", "cold", "waited", "early");
  for (std::size_t k = 0; k < rows; ++k) {
    std::printf("  %-52s", steps[k]);
    for (const auto& v : kinds) std::printf(" %9.1f", summarize(v[k]).median);
    std::printf("\n");
  }
  std::printf(
      "  floors, same run: a wake-up (half a spaced pipe round trip) %.1f us, of an idle CPU (the same,\n"
      "  its ends on two CPUs) %.1f us; a memfd + SCM_RIGHTS round trip, mapped and written, %.1f us;\n"
      "  early_result's total is %.1fx that round trip\n",
      wake, idle_wake, memfd, summarize(kinds[2][rows - 1]).median / memfd);
}

// What the process holds now, from /proc/self: threads and resident bytes.
std::size_t threads_now() {
  std::size_t n = 0;
  if (DIR* d = ::opendir("/proc/self/task")) {
    while (const dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
    ::closedir(d);
  }
  return n;
}
double rss_mib() {
  std::ifstream statm("/proc/self/statm");
  double size = 0, resident = 0;
  statm >> size >> resident;
  return resident * static_cast<double>(::sysconf(_SC_PAGESIZE)) / (1 << 20);
}
double cpu_s() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

void queued(std::size_t n) {
  const std::string fifo = "/tmp/bench_calls-hold-" + std::to_string(::getpid());
  ::mkfifo(fifo.c_str(), 0600);
  std::printf("%zu calls queued behind one running call, executor({.cpu_slots = 1}), %ld cores\n", n,
              ::sysconf(_SC_NPROCESSORS_ONLN));
  const std::size_t threads_before = threads_now();
  const double rss_before = rss_mib();
  {
    executor pool({.cpu_slots = 1, .call = {.echo_stderr = false}});
    auto running = pool.submit(hold, fifo);
    std::vector<call_handle<int>> calls;
    calls.reserve(n);
    std::vector<double> submit_us;
    submit_us.reserve(n);
    const auto t0 = clk::now();
    for (std::size_t i = 0; i < n; ++i) {
      const auto t = clk::now();
      calls.push_back(pool.submit(noop, static_cast<int>(i)));
      submit_us.push_back(std::chrono::duration<double, std::micro>(clk::now() - t).count());
    }
    const double all_ms = ms_since(t0);
    const std::size_t threads = threads_now();
    const double rss = rss_mib();
    // The caller's CPU over a second of waiting (nothing polls: the loop sleeps in epoll).
    const double c0 = cpu_s();
    const auto w0 = clk::now();
    std::this_thread::sleep_for(std::chrono::seconds(1));
    const double idle_cpu = (cpu_s() - c0) / (ms_since(w0) / 1e3);
    const auto s0 = clk::now();
    pool.shutdown(true);
    const double cancel_ms = ms_since(s0);
    std::size_t cancelled = 0;
    for (auto& c : calls) cancelled += c.try_get().status().kind == outcome_kind::cancelled;
    { std::ofstream(fifo) << 'x'; }
    running.get();
    const summary su = summarize(submit_us);
    std::printf("  threads in the caller          %zu before, %zu with them queued   goal <= cores + 16\n",
                threads_before, threads);
    std::printf("  each submit                    median %.2f us (p10 %.2f, p90 %.2f); all %.0f ms   goal <= 50 us\n",
                su.median, su.p10, su.p90, all_ms);
    std::printf("  memory per queued call         %.0f bytes (RSS +%.1f MiB)   goal <= 2 KiB\n",
                (rss - rss_before) * (1 << 20) / static_cast<double>(n), rss - rss_before);
    std::printf("  caller CPU while they wait     %.2f%% of a core   goal <= 1%%\n", idle_cpu * 100);
    std::printf("  shutdown(cancel_waiting)       %.1f ms, %zu of %zu cancelled   goal <= 1 s\n", cancel_ms, cancelled,
                n);
  }
  std::remove(fifo.c_str());
}

int main(int argc, char** argv) {
  isorun::init(argc, argv);
  if (argc == 3 && std::strcmp(argv[1], "--queued") == 0) {
    queued(static_cast<std::size_t>(std::atoll(argv[2])));
    return 0;
  }
  if (argc == 2 && std::strcmp(argv[1], "--breakdown") == 0) {
    peers = std::make_unique<ipc_peers>();  // (first: a fork copies the whole process)
    breakdown(200);
    return 0;
  }
  if (argc == 2 && std::strcmp(argv[1], "--exit-at-once") == 0) return 0;  // the cold call's floor
  if (argc == 2 && std::strcmp(argv[1], "--wait-for-signal") == 0) {       // the waited-for exit's floor
    if (::write(1, "r", 1) != 1) return 1;
    ::pause();
  }
  self_path = "/proc/self/exe";
  {
    char buf[4096];
    const ssize_t k = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (k > 0) self_path.assign(buf, static_cast<std::size_t>(k));
  }
  peers = std::make_unique<ipc_peers>();
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const int n = quick ? 40 : 200;
  std::printf("isorun calls as users make them (%ld cores)\n", ::sysconf(_SC_NPROCESSORS_ONLN));

  latencies(n, 0);
  latencies(n, 5);

  {
    std::vector<double> plain, std_only, with;
    for (int i = 0; i < n; ++i) {
      plain.push_back(spawn_ms({BENCH_MIN_PLAIN}));
      std_only.push_back(spawn_ms({BENCH_MIN_STD}));
      with.push_back(spawn_ms({BENCH_MIN_INIT}));
    }
    const summary p = summarize(plain), s = summarize(std_only), w = summarize(with);
    std::printf("\nwhat linking libisorun adds to a program's start (n=%d)\n", n);
    line("minimal C++ main, spawn+exit", p);
    line("the same using the standard library", s, &p);
    line("the same calling isorun::init", w, &p);
    std::printf("  %-44s %7.3f ms   goal <= 0.3 ms\n", "difference to the minimal main", w.median - p.median);
    std::printf("  %-44s %7.3f ms\n", "difference to the main using the std library", w.median - s.median);
  }

  {
    std::vector<double> cold, warm, ceil;
    const int tasks = quick ? 200 : 1000;
    for (int r = 0; r < (quick ? 3 : 5); ++r) {
      cold.push_back(map_rate(tasks, 4, 0));
      warm.push_back(map_rate(tasks, 4, 4));
      ceil.push_back(bench::spawn_rate(BENCH_TINY, tasks, 4));
    }
    const summary c = summarize(cold), w = summarize(warm), s = summarize(ceil);
    std::printf("\ntasks per second, map() with 4 in flight (%d tasks, %zu rounds)\n", tasks, c.n);
    std::printf("  %-44s %7.0f /s  [%6.0f, %6.0f]\n", "cold", c.median, c.p10, c.p90);
    std::printf("  %-44s %7.0f /s  [%6.0f, %6.0f]  %.2fx cold   goal >= 1.2x\n", "standby = 4", w.median, w.p10, w.p90,
                w.median / c.median);
    bench::guard("calls.map_standby_over_cold", w.median / c.median, ">=", 1.2);
    std::printf("  %-44s %7.0f /s  [%6.0f, %6.0f]  standby %.2fx of it\n", "static C program spawns (ceiling)",
                s.median, s.p10, s.p90, w.median / s.median);
  }

  {
    std::vector<double> bare, cmd, hello;
    for (int i = 0; i < n; ++i) {
      bare.push_back(spawn_ms({BENCH_TINY}));
      cmd.push_back(spawn_ms({ISORUN_CLI, "--cpu", "-q", "--", BENCH_TINY}));
      hello.push_back(spawn_ms({ISORUN_CLI, "--cpu", "-q", "hello"}));
    }
    const summary b = summarize(bare), c = summarize(cmd), h = summarize(hello);
    std::printf("\nthe CLI's fixed cost (n=%d)\n", n);
    line("static C program alone", b);
    line("isorun --cpu -q -- it", c, &b);
    std::printf("  %-44s %7.3f ms   goal <= 2 ms\n", "difference of medians", c.median - b.median);
    bench::guard("calls.cli_fixed_cost_ms", c.median - b.median, "<=", 2);
    line("isorun --cpu -q hello", h, &b);
  }
  return 0;
}
