// Standby workers and early results: launched before their work, one call each, results handed
// over sealed before the worker has exited.
#include <catch2/catch.hpp>

#include <fstream>
#include <iterator>
#include <optional>
#include <thread>

#include "isorun/runner/admission.hpp"
#include "isorun/runner/driver_cap.hpp"
#include "isorun/runner/zygote.hpp"
#include "runner_tasks.hpp"

using namespace runner_tests;

TEST_CASE("a standby worker serves exactly one call, and calls take standby workers", "[runner][standby]") {
  stop_standby_at_end guard;
  auto& pool = isorun::runner::standby_for(plain_standby(), 2);  // the pool isolated() uses below
  std::set<std::string> pids;
  for (int i = 0; i < 6; ++i) {
    pool.fill();
    const auto waiting = pool.snapshot().waiting;
    REQUIRE(waiting.size() >= 2);
    const std::string got = isorun::isolated(pid_and_calls, {.standby = 2})(0);
    const auto space = got.find(' ');
    CHECK(got.substr(space + 1) == "1");                             // a process that ran nothing before
    CHECK(got.substr(0, space) == std::to_string(waiting.front()));  // the oldest waiting worker
    pids.insert(got.substr(0, space));
  }
  CHECK(pids.size() == 6);  // one process per call
}

TEST_CASE("a standby worker binds its symbols at load, while it waits; its task sees the caller's environment",
          "[runner][standby]") {
  stop_standby_at_end guard;
  ::unsetenv("LD_BIND_NOW");  // (the user's own would be kept, and nothing added)
  auto& pool = isorun::runner::standby_for(plain_standby(), 2);
  pool.fill();
  // Read by each task from its own /proc/self/environ: a worker's process is exec'd by then (read
  // from here, /proc/PID/environ can be empty between the launch's return and the new image's setup).
  // The first was launched while none waited, as quickly as it can; the one after it is bound.
  CHECK(isorun::isolated(bind_vars, {.standby = 2})(0) == "- - -");
  CHECK(isorun::isolated(bind_vars, {.standby = 2})(0) == "- - 1");
}

TEST_CASE("a standby worker is woken on its caller's CPU, and every thread of its task runs on every CPU it had",
          "[runner][standby]") {
  stop_standby_at_end guard;
  namespace r = isorun::runner;
  const std::string all = cpu_list(0);
  const bool several = all.find(',') != std::string::npos;
  if (!several) WARN("one CPU only: the hand-over of the caller's CPU is not made");
  // Through isolated(): the call's waiter starts it on a worker of the pool.
  auto& pool = r::standby_for(plain_standby(), 2);
  for (int i = 0; i < 3; ++i) {
    pool.fill();
    CHECK(isorun::isolated(threads_cpus, {.standby = 2})(0) == all);
  }
  // At the job level, on workers just launched, so still starting: a hand-over lands before the
  // worker waits, and the thread its start makes next (the supervisor watch) inherits the one CPU
  // until the worker widens it too. Handed over only where the starting thread waits next and the
  // worker was launched ahead; every thread of the task on every CPU either way.
  r::local_launcher launcher;
  const auto spec = r::job_spec_for("threads_cpus", isorun::serialization::encoding::binary,
                                    isorun::detail::encode_args(0), {}, {});
  for (const bool waits : {true, false}) {
    for (const bool ahead : {true, false}) {
      auto worker = launcher.launch(r::launch_spec_for(spec));
      worker.waiting = ahead;
      auto s = spec;
      s.caller_waits = waits;
      auto job = r::job::start(std::move(s), std::move(worker));
      const auto& res = job->wait();
      REQUIRE(res.status.ok());
      CHECK(res.trace.cpu_handed == (several && waits && ahead));
      CHECK(isorun::detail::decode_result<std::string>(res) == all);
    }
  }
  // A caller narrowed to one CPU hands over that one; the worker's own mask is unchanged.
  cpu_set_t mine, one;
  REQUIRE(::sched_getaffinity(0, sizeof mine, &mine) == 0);
  CPU_ZERO(&one);
  CPU_SET(::sched_getcpu(), &one);
  REQUIRE(::sched_setaffinity(0, sizeof one, &one) == 0);
  struct widen_again {
    cpu_set_t& to;
    ~widen_again() { ::sched_setaffinity(0, sizeof to, &to); }
  } restore{mine};
  pool.fill();
  CHECK(isorun::isolated(threads_cpus, {.standby = 2})(0) == all);
}

TEST_CASE("a standby pool launches like any launcher: waiting workers for its spec, fresh ones otherwise",
          "[runner][standby]") {
  stop_standby_at_end guard;
  auto& pool = isorun::runner::standby_for(plain_standby(), 2);
  pool.fill();
  const auto waiting = pool.snapshot().waiting;
  // Another spec (an extra variable): launched now, the waiting workers untouched.
  auto other = pool.launch({.label = "other", .extra_env = {"ISORUN_TEST_OTHER=1"}});
  CHECK(std::find(waiting.begin(), waiting.end(), other.process.pid()) == waiting.end());
  CHECK(pool.snapshot().waiting == waiting);
  // The pool's own spec, whatever the label: the oldest waiting worker.
  auto same_spec = plain_standby();
  same_spec.label = "some_task";
  auto same = pool.launch(same_spec);
  CHECK(same.process.pid() == waiting.front());
}

TEST_CASE("a standby worker that died while waiting is skipped, and the call still runs", "[runner][standby]") {
  stop_standby_at_end guard;
  auto& pool = isorun::runner::standby_for(plain_standby(), 2);
  pool.fill();
  const pid_t victim = pool.snapshot().waiting.front();
  ::kill(victim, SIGKILL);
  REQUIRE(process_gone(victim));  // exited (a zombie until the pool reaps it)
  const std::string got = isorun::isolated(pid_and_calls, {.standby = 2})(0);
  CHECK(got.substr(0, got.find(' ')) != std::to_string(victim));
  CHECK(got.substr(got.find(' ') + 1) == "1");
}

TEST_CASE("a call on a standby worker can be cancelled as it is handed over", "[runner][standby]") {
  stop_standby_at_end guard;
  auto& pool = isorun::runner::standby_for(plain_standby(), 1);
  pool.fill();
  auto h = isorun::isolated(sleeps_long, {.standby = 1}).async(0);
  const pid_t pid = h.pid();
  h.cancel();
  auto r = h.try_get();
  CHECK(r.status().kind == isorun::outcome_kind::cancelled);
  CHECK(process_gone(pid));
}

TEST_CASE("a warm standby worker has its GPU and capped allocator ready before its task arrives", "[runner][standby]") {
  stop_standby_at_end guard;
  namespace r = isorun::runner;
  const isorun::isolated_options warm{.gpu = 1, .mem_limit = 6_GiB, .standby = 1, .warm_context = true};
  auto launched = warm;  // as isolated() launches it: with its share of the cores as thread limits
  launched.cpus_per_call = r::admission::process().share(r::admission_request_for(warm));
  auto probe = r::job_spec_for("warm_state", isorun::serialization::encoding::binary, {}, {isorun::gpus().gpus.at(1)},
                               launched);
  auto& pool = r::standby_for(r::launch_spec_for(probe), 1);  // the pool isolated() uses below
  pool.fill();
  const pid_t waiting = pool.snapshot().waiting.front();
  CHECK(isorun::isolated(warm_state, warm)(0) == "ready|GPU-sim-1|" + std::to_string(6_GiB));
  CHECK(isorun::test::process_gone(waiting));  // it served that call and exited

  // Another cap cannot use a worker prepared for this one: a worker is launched for it, and the
  // prepared one keeps waiting.
  pool.fill();
  const auto before = pool.snapshot().waiting;
  CHECK(isorun::isolated(warm_state, {.gpu = 1, .mem_limit = 4_GiB})(0) == "cold|GPU-sim-1|" + std::to_string(4_GiB));
  CHECK(pool.snapshot().waiting == before);

  // A worker prepared for one GPU refuses an assignment for another (the supervisor never makes
  // one; a worker checks anyway): it stops, and the job is classified, not run on the wrong GPU.
  r::local_launcher launcher;
  auto on_gpu_0 = launcher.launch(r::launch_spec_for(
      r::job_spec_for("warm_state", isorun::serialization::encoding::binary, {}, {isorun::gpus().gpus.at(0)}, warm)));
  auto spec = r::job_spec_for("warm_state", isorun::serialization::encoding::binary, isorun::detail::encode_args(0),
                              {isorun::gpus().gpus.at(1)}, warm);
  spec.stderr_echo_fd = -1;
  auto job = r::job::start(std::move(spec), std::move(on_gpu_0));
  const auto& res = job->wait();
  CHECK(res.status.kind == isorun::outcome_kind::crashed);
  REQUIRE_FALSE(res.status.stderr_tail.empty());
  CHECK_THAT(res.status.stderr_tail.back(), Catch::Contains("prepared GPU GPU-sim-0"));
}

TEST_CASE("a job on a standby worker: its time counts from its assignment, its stdout goes to its own file",
          "[runner][standby]") {
  stop_standby_at_end guard;
  namespace r = isorun::runner;
  auto& pool = r::standby_for(plain_standby(), 2);
  pool.fill();
  const auto filled = std::chrono::steady_clock::now();
  char dir[] = "/tmp/isorun-standby-XXXXXX";
  REQUIRE(::mkdtemp(dir));
  std::vector<std::shared_ptr<r::job>> jobs;
  for (const char* text : {"first", "second"}) {
    r::job_spec spec;
    spec.task = "prints";
    spec.args = isorun::detail::encode_args(std::string(text));
    spec.stdout_to = r::stdout_mode::file;
    spec.stdout_path = std::string(dir) + "/" + text + ".out";
    jobs.push_back(r::job::start(std::move(spec), pool));
  }
  for (auto& j : jobs) {
    const auto& res = j->wait();
    REQUIRE(res.status.kind == isorun::outcome_kind::success);
    // Launched before `filled`, assigned after it: the wall time is the job's, not the worker's.
    CHECK(res.status.wall < std::chrono::steady_clock::now() - filled);
  }
  for (const char* text : {"first", "second"}) {
    std::ifstream in(std::string(dir) + "/" + text + ".out");
    std::string line;
    CHECK(std::getline(in, line));
    CHECK(line == text);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("an early result is handed over sealed: no process can change it afterwards", "[runner][early]") {
  // A process that escaped the worker's group must still be there to try: the seal is what stops it.
  process_group_containment pinned;
  // A large result first: result segments come from the pool largest first, so the escapee's
  // is a large one, the kind a CPU worker maps ahead of a task (and of its fork) for a result
  // that is not early.
  REQUIRE(isorun::isolated(make_pattern)(64_MiB, 3).size() == 64_MiB);
  char dir[] = "/tmp/isorun-early-XXXXXX";
  REQUIRE(::mkdtemp(dir));
  const std::string d = dir;
  REQUIRE(::mkfifo((d + "/go").c_str(), 0600) == 0);
  REQUIRE(::mkfifo((d + "/report").c_str(), 0600) == 0);
  auto r = isorun::isolated(escapee, {.early_result = true}).try_call(d);
  REQUIRE(r.ok());
  CHECK(r.status().exit_pending);   // handed over on `done`, not at the exit
  { std::ofstream go(d + "/go"); }  // the escaped process now tries its three changes
  int refused = -1, changed = -1;
  std::ifstream(d + "/report") >> refused >> changed;
  CHECK(refused == 3);
  CHECK(changed == 0);
  const auto& b = r.value();
  CHECK(std::all_of(b.bytes().begin(), b.bytes().end(), [](std::byte c) { return c == std::byte{'a'}; }));
  std::filesystem::remove_all(d);
}

TEST_CASE("a descendant that left the worker's group is killed with its cgroup before the result is validated",
          "[runner][containment]") {
  const auto* found = cgroup_containment();
  if (!found) return;
  const auto& contained = *found;
  char dir[] = "/tmp/isorun-contain-XXXXXX";
  REQUIRE(::mkdtemp(dir));
  const std::string d = dir;
  REQUIRE(::mkfifo((d + "/go").c_str(), 0600) == 0);
  auto cgroups_here = [&] {
    std::size_t n = 0;
    for (const auto& e : std::filesystem::directory_iterator(contained.where)) n += e.is_directory();
    return n;
  };
  const std::size_t cgroups_before = cgroups_here();
  auto r = isorun::isolated(escapes_to_rewrite).try_call(d);
  REQUIRE(r.ok());
  const pid_t escaped = std::stoi(r.value());
  // Already gone when the call returned (no waiting here): nothing is left to change the result.
  CHECK(process_gone(escaped, 0));
  const int go = ::open((d + "/go").c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  CHECK(go < 0);
  CHECK(errno == ENXIO);  // no reader: nobody waits to rewrite the segment
  if (go >= 0) ::close(go);
  CHECK(r.value().substr(r.value().find(' ') + 1) == std::string(1000, 'a'));
  // Its cgroup is gone too (others may still be there: standby workers, exits finishing behind).
  CHECK(cgroups_here() <= cgroups_before);
  std::filesystem::remove_all(d);
}

TEST_CASE("an early result still mapped writable by the task's child waits for the worker's group to go",
          "[runner][early]") {
  auto r = isorun::isolated(clings, {.early_result = true}).try_call(0);
  REQUIRE(r.ok());
  CHECK_FALSE(r.status().exit_pending);
  CHECK(r.status().exit.success());
  const auto& b = r.value();
  CHECK(std::all_of(b.bytes().begin(), b.bytes().end(), [](std::byte c) { return c == std::byte{'b'}; }));
}

TEST_CASE("an early result is handed over before the worker frees the task's result value, which it then does",
          "[runner][early]") {
  char dir[] = "/tmp/isorun-free-XXXXXX";
  REQUIRE(::mkdtemp(dir));
  const std::string d = dir;
  REQUIRE(::mkfifo((d + "/free").c_str(), 0600) == 0);
  // A long grace: the worker is not to be killed while its result's destructor waits for the test.
  auto h = isorun::isolated(frees_slowly, {.grace = std::chrono::hours(1), .early_result = true}).async(d);
  const pid_t pid = h.pid();
  auto r = h.try_get();  // would never return if the value were freed before `done`
  REQUIRE(r.ok());
  CHECK(r.status().exit_pending);
  CHECK(r.value().dir == d);
  CHECK_FALSE(std::filesystem::exists(d + "/freed"));
  { std::ofstream free(d + "/free"); }  // the destructor goes on
  CHECK(process_gone(pid));
  CHECK(std::filesystem::exists(d + "/freed"));
  std::filesystem::remove_all(d);
}

// (A ctest of its own, `[reaper]`: in a process where no earlier call left the reaper's alarm
// armed, the shorter grace is found only by an alarm armed for it.)
TEST_CASE("after an early hand-over, a worker that does not exit is killed at the end of its grace, or at a cancel",
          "[runner][early][reaper]") {
  char dir[] = "/tmp/isorun-grace-XXXXXX";
  REQUIRE(::mkdtemp(dir));
  const std::string d = dir;
  for (const char* name : {"/long", "/short"}) {
    REQUIRE(std::filesystem::create_directory(d + name));
    REQUIRE(::mkfifo((d + name + "/free").c_str(), 0600) == 0);
  }
  // Each result's destructor, in its worker, waits for a FIFO nobody opens: neither exits.
  auto long_grace =
      isorun::isolated(frees_slowly, {.grace = std::chrono::hours(1), .early_result = true}).async(d + "/long");
  REQUIRE(long_grace.try_get().ok());
  // A shorter grace after a longer one: the first is not the one to wait for.
  auto short_grace = isorun::isolated(frees_slowly, {.grace = std::chrono::milliseconds(200), .early_result = true})
                         .async(d + "/short");
  auto r = short_grace.try_get();
  REQUIRE(r.ok());
  CHECK(r.status().exit_pending);
  CHECK(process_gone(short_grace.pid()));
  CHECK_FALSE(process_gone(long_grace.pid(), 0));
  long_grace.cancel();  // its result was handed over: what is left of it goes now
  CHECK(process_gone(long_grace.pid()));
  std::filesystem::remove_all(d);
}

TEST_CASE("after an early hand-over, the worker's request segment is reused only once the worker is reaped",
          "[runner][early]") {
  // A worker still exiting maps its request (read-only, but shared: the kernel refuses to seal a
  // file so mapped). Were its segment handed to the next call as the result segment, that
  // result could not be sealed, and its early hand-over would quietly wait for the exit.
  isorun::stop_standby();
  isorun::serialization::segment_pool::instance().clear();
  char dir[] = "/tmp/isorun-reuse-XXXXXX";
  REQUIRE(::mkdtemp(dir));
  const std::string d = dir;
  REQUIRE(::mkfifo((d + "/free").c_str(), 0600) == 0);
  auto slow = isorun::isolated(frees_slowly_after_large_request, {.grace = std::chrono::hours(1), .early_result = true})
                  .async(d, isorun::blob(2_MiB));
  const pid_t slow_pid = slow.pid();
  auto first = slow.try_get();
  REQUIRE(first.ok());
  REQUIRE(first.status().exit_pending);  // its worker now waits in the result's destructor
  // A small request passes over a large idle segment; a result takes the largest one there is.
  auto next = isorun::isolated(pid_and_calls, {.early_result = true}).try_call(0);
  REQUIRE(next.ok());
  CHECK(next.status().exit_pending);
  { std::ofstream free(d + "/free"); }
  CHECK(process_gone(slow_pid));
  std::filesystem::remove_all(d);
}

TEST_CASE("a streamed result is handed over early with no seal: the bytes are the supervisor's already",
          "[runner][early][stream]") {
  auto early = isorun::isolated(from_device, {.gpu = 0, .early_result = true}).try_call(20_MiB, 9);
  REQUIRE(early.ok());
  CHECK(early.status().exit_pending);
  CHECK(early.value().size() == 20_MiB);
  CHECK(early.value().data()[20_MiB - 1] == pattern_byte(20_MiB - 1, 9));
}

TEST_CASE("early results on standby workers: each call's worker is gone afterwards, failures are as usual",
          "[runner][early][standby]") {
  stop_standby_at_end guard;
  const isorun::isolated_options opts{.standby = 2, .early_result = true};
  for (int i = 0; i < 5; ++i) {
    auto h = isorun::isolated(pid_and_calls, opts).async(0);
    const pid_t pid = h.pid();
    auto r = h.try_get();
    REQUIRE(r.ok());
    CHECK(r.status().exit_pending);
    CHECK(r.value() == std::to_string(pid) + " 1");
    CHECK(process_gone(pid));  // reaped behind the caller's back
  }
  auto failed = isorun::isolated(throws, opts).try_call(3);
  CHECK(failed.status().kind == isorun::outcome_kind::task_error);
  CHECK_FALSE(failed.status().exit_pending);  // only a result is handed over early
  auto crashed = isorun::isolated(segfaults, {.echo_stderr = false, .early_result = true}).try_call(0);
  CHECK(crashed.status().kind == isorun::outcome_kind::crashed);
}

TEST_CASE("killing a supervisor with standby workers waiting leaves nothing behind", "[runner][standby]") {
  const int shm = isorun::test::shm_entries();
  auto victim = start_victim({"standby"});
  std::vector<int> waiting(3);
  REQUIRE(std::fscanf(victim.out.get(), "%d %d %d", &waiting[0], &waiting[1], &waiting[2]) == 3);
  victim.out.reset();
  ::kill(victim.process.pid(), SIGKILL);
  for (int pid : waiting) CHECK(process_gone(pid));
  CHECK(victim.process.reap().signal == SIGKILL);
  CHECK(isorun::test::shm_entries() == shm);
}

TEST_CASE("a standby worker's replacement is launched once the worker taken has exited, not during its call",
          "[runner][standby]") {
  stop_standby_at_end guard;
  temp_fifo pids;
  REQUIRE(::mkfifo((pids.dir + "/go").c_str(), 0600) == 0);
  auto& pool = isorun::runner::standby_for(plain_standby(), 2);
  pool.fill();
  const auto waiting = pool.snapshot().waiting;
  REQUIRE(waiting.size() == 2);
  auto h = isorun::isolated(runs_until_told, {.standby = 2}).async(pids.dir);
  long running = 0;
  std::ifstream(pids.path) >> running;  // the task runs now
  CHECK(running == waiting[0]);
  // While the call runs, the pool keeps the worker it has left and launches nothing that would
  // compete with the call for the cores.
  CHECK(pool.snapshot().waiting == std::vector<pid_t>{waiting[1]});
  std::ofstream(pids.dir + "/go") << 7 << std::endl;
  CHECK(h.get() == 7);
  pool.fill();  // the replacement, launched after the exit
  const auto after = pool.snapshot().waiting;
  REQUIRE(after.size() == 2);
  CHECK(after[0] == waiting[1]);
  CHECK(after[1] != waiting[0]);
  ::unlink((pids.dir + "/go").c_str());
}

TEST_CASE("a standby pool with no worker left waiting launches the replacement at once", "[runner][standby]") {
  stop_standby_at_end guard;
  temp_fifo pids;
  REQUIRE(::mkfifo((pids.dir + "/go").c_str(), 0600) == 0);
  auto& pool = isorun::runner::standby_for(plain_standby(), 1);
  pool.fill();
  const pid_t first = pool.snapshot().waiting.at(0);
  auto h = isorun::isolated(runs_until_told, {.standby = 1}).async(pids.dir);
  long running = 0;
  std::ifstream(pids.path) >> running;
  CHECK(running == first);
  pool.fill();  // returns while the call still runs: the next call would otherwise launch cold
  const auto waiting = pool.snapshot().waiting;
  REQUIRE(waiting.size() == 1);
  CHECK(waiting[0] != first);
  std::ofstream(pids.dir + "/go") << 1 << std::endl;
  CHECK(h.get() == 1);
  ::unlink((pids.dir + "/go").c_str());
}

TEST_CASE("a call on a standby worker succeeds when its replacement cannot be launched", "[runner][standby]") {
  stop_standby_at_end guard;
  namespace r = isorun::runner;
  // The workers' program under a name that goes away once the pool is full: every launch after
  // that fails (ENOENT), the replacement of the worker the call takes included.
  char dir[] = "/tmp/isorun-standby-XXXXXX";
  REQUIRE(::mkdtemp(dir));
  const std::string link = std::string(dir) + "/worker";
  REQUIRE(::symlink(std::filesystem::read_symlink("/proc/self/exe").c_str(), link.c_str()) == 0);
  auto spec = r::job_spec_for("pid_and_calls", isorun::serialization::encoding::binary, isorun::detail::encode_args(0),
                              {}, {});
  spec.executable = link;
  auto& pool = r::standby_for(r::launch_spec_for(spec), 1);
  pool.fill();
  const auto waiting = pool.snapshot().waiting;
  REQUIRE(waiting.size() == 1);
  REQUIRE(::unlink(link.c_str()) == 0);

  auto j = r::job::start(spec, pool);
  const auto& result = j->wait();
  REQUIRE(result.status.kind == isorun::outcome_kind::success);
  CHECK(j->pid() == waiting[0]);
  pool.fill();  // returns: launching failed, and the pool stopped trying
  CHECK(pool.snapshot().waiting.empty());
  // The next call has no worker to take and none can be launched: it says so.
  CHECK_THROWS_AS(r::job::start(spec, pool), isorun::internal_error);
  ::rmdir(dir);
}

TEST_CASE("a standby worker's cgroup, made when it was launched, goes with it when it is never used",
          "[runner][standby][containment]") {
  const auto* found = cgroup_containment();
  if (!found) return;
  const auto& contained = *found;
  std::vector<std::string> cgroups;
  {
    stop_standby_at_end guard;
    auto& pool = isorun::runner::standby_for(plain_standby(), 2);
    pool.fill();
    // Each waiting worker's cgroup: the directory under `where` whose cgroup.procs lists it.
    for (pid_t pid : pool.snapshot().waiting)
      for (const auto& e : std::filesystem::directory_iterator(contained.where)) {
        if (!e.is_directory()) continue;
        std::ifstream procs(e.path() / "cgroup.procs");
        for (long p = 0; procs >> p;)
          if (p == pid) cgroups.push_back(e.path());
      }
  }
  REQUIRE(cgroups.size() == 2);
  for (const auto& dir : cgroups) {
    INFO(dir);
    CHECK_FALSE(std::filesystem::exists(dir));
  }
}

TEST_CASE("a standby pool grows while calls come back to back, and shrinks back when idle", "[runner][standby]") {
  namespace r = isorun::runner;
  r::standby_pool pool(plain_standby(), 1, 3, std::chrono::hours(1));  // idle: trim() below, not a timer
  pool.fill();
  std::vector<r::launched_worker> taken;
  taken.push_back(pool.take());  // spaced so far: its replacement waits for its exit
  CHECK(pool.target() == 1);
  taken.push_back(pool.take());  // the first still runs: back to back
  CHECK(pool.target() == 2);
  taken.push_back(pool.take());
  taken.push_back(pool.take());
  CHECK(pool.target() == 3);  // up to its maximum
  taken.clear();              // those calls end (each worker stopped and reaped)
  pool.fill();
  CHECK(pool.snapshot().waiting.size() == 3);
  pool.trim();  // what an idle period does
  CHECK(pool.target() == 1);
  CHECK(pool.snapshot().waiting.size() == 1);
}

TEST_CASE("an adaptive pool starts once its first call's worker has exited, and holds nothing after its linger",
          "[runner][standby]") {
  namespace r = isorun::runner;
  r::standby_pool pool(plain_standby(), 1, 0, std::chrono::hours(1), std::chrono::milliseconds(300));
  auto s = pool.snapshot();
  CHECK((s.adaptive && s.dormant && s.waiting.empty() && s.misses == 0));
  pid_t first_pid = -1;
  {
    r::launched_worker first = pool.take();  // launched for it: nothing was waiting
    first_pid = first.process.pid();
    CHECK_FALSE(first.waiting);
    s = pool.snapshot();
    CHECK((!s.dormant && s.misses == 1));
    CHECK(s.waiting.empty());  // nothing launched beside the first call while it runs
  }                            // that call is over (its worker stopped and reaped): the pool starts
  pool.fill();
  s = pool.snapshot();
  REQUIRE(s.waiting.size() == 1);
  CHECK(s.waiting.front() != first_pid);
  CHECK(process_gone(s.waiting.front()));  // stopped 300 ms after the last call (the fill)
  s = pool.snapshot();
  CHECK((s.dormant && s.waiting.empty()));
  r::launched_worker again = pool.take();  // the next call wakes it as the first did
  CHECK_FALSE(again.waiting);
  CHECK(pool.snapshot().misses == 2);
}

TEST_CASE("an adaptive pool is kept while a call runs longer than its linger, and lets go after the call",
          "[runner][standby]") {
  namespace r = isorun::runner;
  const auto linger = std::chrono::milliseconds(200);
  r::standby_pool pool(plain_standby(), 1, 0, std::chrono::hours(1), linger);
  { r::launched_worker first = pool.take(); }  // the first call: the pool starts after it
  pool.fill();
  std::optional<r::launched_worker> call = pool.take();  // a call on the waiting worker...
  pool.fill();                                           // ...whose replacement waits beside it
  const pid_t waiting = pool.snapshot().waiting.at(0);
  std::this_thread::sleep_for(3 * linger);  // the call's work: longer than the linger
  CHECK(::kill(waiting, 0) == 0);           // still waiting: the pool is not idle while a call runs
  CHECK_FALSE(pool.snapshot().dormant);
  call.reset();                                // the call ends
  CHECK(isorun::test::process_gone(waiting));  // and the linger after it stops the pool
  CHECK(pool.snapshot().dormant);
}

TEST_CASE("a zygote is launched with the cap library preloaded to refuse CUDA, its children told what to restore",
          "[runner][standby][zygote]") {
  namespace wire = isorun::runner::zygote_wire;
  auto has = [](const isorun::runner::launch_spec& s, const std::string& entry) {
    return std::find(s.extra_env.begin(), s.extra_env.end(), entry) != s.extra_env.end();
  };
  auto value_of = [](const isorun::runner::launch_spec& s, const std::string& key) -> std::string {
    for (const auto& e : s.extra_env)
      if (e.rfind(key + "=", 0) == 0) return e.substr(key.size() + 1);
    return "(unset)";
  };
  const std::string cap = isorun::runner::driver_cap::library();
  ::unsetenv("LD_PRELOAD");
  auto spec = plain_standby();
  auto z = isorun::runner::zygote_spec(spec);
  CHECK(z.zygote);
  CHECK(has(z, std::string(wire::zygote_env) + "=1"));
  CHECK(has(z, "ISORUN_CAP_ZYGOTE=1"));
  CHECK(value_of(z, "LD_PRELOAD") == cap);
  CHECK(value_of(z, wire::child_preload_env) == "-");  // the children have none
  spec.extra_env.push_back("LD_PRELOAD=/some/lib.so");
  z = isorun::runner::zygote_spec(spec);
  CHECK(value_of(z, "LD_PRELOAD") == cap + ":/some/lib.so");
  CHECK(value_of(z, wire::child_preload_env) == "/some/lib.so");
  // A capped call's workers preload the library themselves: the zygote's children keep it.
  spec.extra_env.back() = "LD_PRELOAD=" + cap + ":/some/lib.so";
  z = isorun::runner::zygote_spec(spec);
  CHECK(value_of(z, "LD_PRELOAD") == cap + ":/some/lib.so");
  CHECK(value_of(z, wire::child_preload_env) == "(unset)");
}

TEST_CASE("a zygote pool whose zygote is not ready launches exec'd workers, each serving one call",
          "[runner][standby][zygote]") {
  // This test program as a worker is no zygote: it never says it is ready (it waits for an
  // assignment), so calls get exec'd workers rather than wait, and stopping the pool ends the
  // filler's wait for it. (In a sanitizer build it cannot even start with the cap library
  // preloaded before the sanitizer's runtime: the pool then gives up on it, and execs.)
  stop_standby_at_end guard;
  namespace r = isorun::runner;
  auto spec = r::job_spec_for("pid_and_calls", isorun::serialization::encoding::binary, isorun::detail::encode_args(0),
                              {}, {});
  auto launch = r::launch_spec_for(spec);
  launch.zygote = true;
  auto& pool = r::standby_for(launch, 1);
  std::set<pid_t> pids;
  for (int i = 0; i < 3; ++i) {
    auto j = r::job::start(spec, pool);  // a job asks for its own spec: this pool's workers
    const auto& result = j->wait();
    REQUIRE(result.status.kind == isorun::outcome_kind::success);
    pids.insert(j->pid());
  }
  CHECK(pids.size() == 3);  // one process per call
}
