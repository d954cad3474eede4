// The `-- CMD` cap against a program that steps around it, by accident or on purpose: each case
// here got the whole stand-in device (16 GiB) before the cap failed closed, pinned its variables
// at load, sealed its limit, followed children started with a clean environment, grew its
// process slots and counted CUDA arrays. What the cap does for a cooperative program is in
// test_cli.cpp.
#include <fcntl.h>
#include <gnu/libc-version.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "isorun/preload/cap_region.hpp"
#include "test_support.hpp"

namespace cap = isorun::preload;

namespace {
constexpr const char* simulated = "ISORUN_SIMULATE_GPUS=1x16G";
const std::string fake_driver = std::string("LD_LIBRARY_PATH=") + FAKE_CUDA_DIR;

// `isorun --gpu 0 --mem-limit 256M -- PROGRAM ARGS...` against the stand-in libcuda.so.1.
isorun::test::captured capped(const std::vector<std::string>& command, const std::string& limit = "256M") {
  std::vector<std::string> args = {"--gpu", "0", "--mem-limit", limit, "--"};
  args.insert(args.end(), command.begin(), command.end());
  return isorun::test::run_captured(ISORUN_CLI, args, {simulated, fake_driver});
}
}  // namespace

TEST_CASE("the cap fails closed: a process that cannot reach it gets no device memory, and says why",
          "[cap][hostile]") {
  // The library preloaded without the variables that lead to the cap (as if a program removed
  // them before starting this one without the exec wrappers).
  auto r = isorun::test::run_captured(CAP_PROBE, {"fill", "64", "direct", "info"},
                                      {fake_driver, std::string("LD_PRELOAD=") + CAP_LIBRARY});
  REQUIRE(r.code == 0);
  CHECK(r.out == "filled 0 code 2\ninfo 0 0\n");
  CHECK_THAT(r.err, Catch::Contains("isorun: CUDA allocations refused in process") &&
                        Catch::Contains("ISORUN_CAP_REGION or ISORUN_CAP_TERMS is not set"));
  // Said once per process, not once per allocation.
  CHECK(r.err.find("refused in process") == r.err.rfind("refused in process"));
}

TEST_CASE("the cap's variables are read when the library loads: unsetting them later changes nothing",
          "[cap][hostile]") {
  for (const char* name : {"ISORUN_CAP_REGION", "ISORUN_CAP_TERMS"}) {
    auto r = capped({CAP_PROBE, "unset", name, "fill", "64", "direct"});
    INFO(name << ": " << r.err);
    REQUIRE(r.code == 0);
    CHECK(r.out == "filled 4 code 2\n");
  }
}

TEST_CASE("the limit is sealed: a process of the command cannot raise it", "[cap][hostile]") {
  auto r = capped({CAP_PROBE, "raise-limit", "fill", "64", "direct"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out == "raise-limit refused\nfilled 4 code 2\n");
}

TEST_CASE("a child started with a clean environment is capped too", "[cap][hostile]") {
  SECTION("posix_spawn with an environment of its own") {
    auto r = capped({CAP_PROBE, "spawn-clean", "fill", "64", "direct"});
    INFO(r.err);
    REQUIRE(r.code == 0);
    CHECK(r.out == "filled 4 code 2\n");
  }
  SECTION("execveat with an environment of its own") {
    auto r = capped({CAP_PROBE, "execveat-clean", "fill", "64", "direct"});
    INFO(r.err);
    REQUIRE(r.code == 0);
    CHECK(r.out == "filled 4 code 2\n");
  }
  SECTION("pidfd_spawn with an environment of its own") {
    auto r = capped({CAP_PROBE, "pidfd-spawn-clean", "fill", "64", "direct"});
    INFO(r.err);
    REQUIRE(r.code == 0);
    if (r.out == "pidfd_spawn absent\n") {
      WARN("skipped: this C library (glibc " << gnu_get_libc_version() << ") has no pidfd_spawn (glibc 2.39)");
      return;
    }
    CHECK(r.out == "filled 4 code 2\n");
  }
  SECTION("env -i: execvp from a program that is not CUDA's") {
    auto r = capped({"env", "-i", fake_driver, CAP_PROBE, "fill", "64", "direct"});
    INFO(r.err);
    REQUIRE(r.code == 0);
    CHECK(r.out == "filled 4 code 2\n");
  }
  SECTION("a shell that clears LD_PRELOAD before starting the program") {
    auto r = capped(
        {"/bin/sh", "-c", std::string("unset LD_PRELOAD ISORUN_CAP_REGION; exec ") + CAP_PROBE + " fill 64 direct"});
    INFO(r.err);
    REQUIRE(r.code == 0);
    CHECK(r.out == "filled 4 code 2\n");
  }
}

TEST_CASE("more processes than the old fixed 256 slots: every one is capped", "[cap][hostile]") {
  // 300 processes hold 1 MiB each under a 512 MiB cap: this one gets what they leave.
  auto r = capped({CAP_PROBE, "holders", "300", "1", "fill", "1", "direct"}, "512M");
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out == "holders 300\nfilled 212 code 2\n");
}

TEST_CASE("CUDA arrays count against the cap", "[cap]") {
  auto r = capped(
      {CAP_PROBE, "arrays", "64", "2d", "arrays", "64", "3d", "arrays", "64", "mip", "fill", "64", "direct"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  // A mipmapped array of two levels holds 64 + 8 MiB: three fit under 256 MiB. Destroying the
  // arrays gave their bytes back: the last fill gets the whole cap again.
  CHECK(r.out == "arrays 4 code 2\narrays 4 code 2\narrays 3 code 2\nfilled 4 code 2\n");
}

TEST_CASE("the ledger cannot be cut short: isorun reports the cap as usual", "[cap][hostile]") {
  // Cut to nothing under the supervisor's mapping, the ledger would have faulted in isorun
  // itself when it read the command's peak.
  auto r = capped({CAP_PROBE, "truncate-ledger", "fill", "64", "direct"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out == "truncate-ledger refused\nfilled 4 code 2\n");
  CHECK_THAT(r.err, Catch::Contains("reached its --mem-limit of 256.00 MiB") && Catch::Contains("peak 256.00 MiB"));
}

namespace {
// Terms and a ledger as the supervisor makes them (sealed), in this process: what a process
// under the cap is pointed at by `region()` and `terms()`.
class cap_files {
 public:
  cap_files(std::uint64_t limit, std::size_t slots) : bytes_{cap::cap_ledger::bytes_for(slots)} {
    terms_fd_ = ::memfd_create("terms", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    ledger_fd_ = ::memfd_create("ledger", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    REQUIRE(terms_fd_ >= 0);
    REQUIRE(ledger_fd_ >= 0);
    const cap::cap_terms terms{cap::terms_magic, limit, slots};
    REQUIRE(::pwrite(terms_fd_, &terms, sizeof terms, 0) == static_cast<ssize_t>(sizeof terms));
    REQUIRE(::fcntl(terms_fd_, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK) == 0);
    REQUIRE(::ftruncate(ledger_fd_, static_cast<off_t>(bytes_)) == 0);
    REQUIRE(::fcntl(ledger_fd_, F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK) == 0);
    void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, ledger_fd_, 0);
    REQUIRE(p != MAP_FAILED);
    ledger_ = static_cast<cap::cap_ledger*>(p);
    ledger_->magic = cap::ledger_magic;
  }
  ~cap_files() {
    ::munmap(ledger_, bytes_);
    ::close(terms_fd_);
    ::close(ledger_fd_);
  }
  cap_files(const cap_files&) = delete;
  cap_files& operator=(const cap_files&) = delete;

  cap::cap_ledger& ledger() { return *ledger_; }
  std::string region() const { return std::string(cap::region_env) + "=" + fd_path(ledger_fd_); }
  std::string terms() const { return std::string(cap::terms_env) + "=" + fd_path(terms_fd_); }

 private:
  static std::string fd_path(int fd) { return "/proc/" + std::to_string(::getpid()) + "/fd/" + std::to_string(fd); }
  std::size_t bytes_;
  int terms_fd_ = -1, ledger_fd_ = -1;
  cap::cap_ledger* ledger_ = nullptr;
};
}  // namespace

TEST_CASE("a process that finds every slot of the cap taken gets no device memory, and says why", "[cap][hostile]") {
  // One slot, held by a live process (this one).
  cap_files files(256ULL << 20, 1);
  REQUIRE(files.ledger().claim(static_cast<std::int32_t>(::getpid()), 1) != nullptr);
  auto r = isorun::test::run_captured(
      CAP_PROBE, {"fill", "64", "direct"},
      {fake_driver, std::string("LD_PRELOAD=") + CAP_LIBRARY, files.region(), files.terms()});
  REQUIRE(r.code == 0);
  CHECK(r.out == "filled 0 code 2\n");
  CHECK_THAT(r.err, Catch::Contains("all 1 process slots of the cap are taken by live processes"));
  CHECK(files.ledger().slotless.load() == 1);
}

TEST_CASE("a process whose region comes with its call stays within its cap until then, and is charged for it after",
          "[cap]") {
  // A standby interpreter's preload allocates before its call: 256 MiB, deferred, then the
  // call's region (512 MiB) counts those and gives the rest.
  cap_files files(512ULL << 20, 4);
  auto r = isorun::test::run_captured(
      CAP_PROBE, {"fill", "64", "direct", "set", files.region(), "set", files.terms(), "fill", "64", "direct"},
      {fake_driver, std::string("LD_PRELOAD=") + CAP_LIBRARY,
       std::string(cap::deferred_env) + "=" + std::to_string(256ULL << 20)});
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out == "filled 4 code 2\nfilled 4 code 2\n");
  CHECK(files.ledger().peak() == 512ULL << 20);
  CHECK(files.ledger().refusals() == 1);  // the second fill's; the first was refused before the region
  // Without the variable, the same process fails closed before its region comes.
  cap_files other(512ULL << 20, 4);
  auto closed = isorun::test::run_captured(
      CAP_PROBE, {"fill", "64", "direct", "set", other.region(), "set", other.terms(), "fill", "64", "direct"},
      {fake_driver, std::string("LD_PRELOAD=") + CAP_LIBRARY});
  REQUIRE(closed.code == 0);
  CHECK(closed.out == "filled 0 code 2\nfilled 0 code 2\n");
}

TEST_CASE("a process whose region comes with its call pins it when bound, before the call's code runs",
          "[cap][hostile]") {
  const std::string deferred = std::string(cap::deferred_env) + "=" + std::to_string(256ULL << 20);
  // Bound right after the call's variables are set: the call's code can no longer point them
  // at files of its own, and a child it starts with a clean environment shares the region.
  cap_files files(256ULL << 20, 4);
  auto r = isorun::test::run_captured(
      CAP_PROBE,
      {"set", files.region(), "set", files.terms(), "bind", "set", std::string(cap::region_env) + "=/nonexistent",
       "set", std::string(cap::terms_env) + "=/nonexistent", "create", "128", "spawn-clean", "fill", "64", "direct"},
      {fake_driver, std::string("LD_PRELOAD=") + CAP_LIBRARY, deferred});
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out == "bind 0\ncreate 0\nfilled 2 code 2\n");  // the child got what this process left of 256 MiB
  CHECK(files.ledger().peak() == 256ULL << 20);

  // Before its region comes, a child started with a clean environment gets no budget of its
  // own (which no ledger would see): its library fails closed.
  auto early = isorun::test::run_captured(CAP_PROBE, {"spawn-clean", "fill", "64", "direct"},
                                          {fake_driver, std::string("LD_PRELOAD=") + CAP_LIBRARY, deferred});
  REQUIRE(early.code == 0);
  CHECK(early.out == "filled 0 code 2\n");
  CHECK_THAT(early.err, Catch::Contains("isorun: CUDA allocations refused in process"));
}

TEST_CASE("the ledger: slots are handed out from the front, reclaimed from the dead, and refused when full",
          "[cap][ledger]") {
  constexpr std::size_t capacity = 3;
  const std::size_t bytes = cap::cap_ledger::bytes_for(capacity);
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  REQUIRE(p != MAP_FAILED);
  auto& ledger = *static_cast<cap::cap_ledger*>(p);

  // A process that has exited (reaped: its pid names nobody until it is reused), and one that
  // lives until its pipe closes.
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  REQUIRE(::waitpid(dead, nullptr, 0) == dead);
  int hold[2];
  REQUIRE(::pipe(hold) == 0);
  const pid_t alive = ::fork();
  if (alive == 0) {
    char c;
    ::close(hold[1]);
    while (::read(hold[0], &c, 1) > 0) {
    }
    ::_exit(0);
  }
  ::close(hold[0]);

  const auto self = static_cast<std::int32_t>(::getpid()), parent = static_cast<std::int32_t>(::getppid());
  cap::process_slot* a = ledger.claim(dead, capacity);
  cap::process_slot* b = ledger.claim(self, capacity);
  REQUIRE(a);
  REQUIRE(b);
  CHECK(b == a + 1);
  CHECK(ledger.slots_used.load() == 2);
  REQUIRE(ledger.reserve(*a, 0, 100, 1000));
  REQUIRE(ledger.reserve(*b, 0, 800, 1000));
  // Full: the dead process's 100 bytes come back when a reservation needs them.
  CHECK(ledger.reserve(*b, 0, 200, 1000));
  CHECK(ledger.devices[0].used.load() == 1000);
  CHECK(a->pid.load() == 0);  // its slot is free again
  CHECK_FALSE(ledger.reserve(*b, 0, 1, 1000));
  CHECK(ledger.refusals() == 1);
  // The freed slot first, then one from the untouched rest, then none: fail closed, counted.
  CHECK(ledger.claim(parent, capacity) == a);
  CHECK(ledger.claim(alive, capacity) == a + 2);
  CHECK(ledger.slots_used.load() == 3);
  CHECK(ledger.claim(1, capacity) == nullptr);
  CHECK(ledger.slotless.load() == 1);
  // The same pid again (an exec in the same process): its slot, emptied.
  CHECK(ledger.claim(self, capacity) == b);
  CHECK(b->bytes[0].load() == 0);
  CHECK(ledger.devices[0].used.load() == 0);
  ::close(hold[1]);
  ::waitpid(alive, nullptr, 0);
  ::munmap(p, bytes);
}

TEST_CASE("the ledger's ring keeps the last changes, each whole, when a memory timeline is asked for", "[cap]") {
  constexpr std::size_t slots = 4, events = 4;
  std::vector<std::uint64_t> storage(cap::cap_ledger::bytes_for(slots, events) / sizeof(std::uint64_t) + 1);
  auto* ledger = new (storage.data()) cap::cap_ledger{};
  const cap::event_ring ring = ledger->ring(slots, events);
  const std::int32_t self = ::getpid();  // alive: its slot is not taken back
  cap::process_slot* a = ledger->claim(self, slots, ring);
  REQUIRE(a);
  for (int i = 1; i <= 3; ++i) CHECK(ledger->reserve(*a, 0, i << 20, 8 << 20, ring));  // 1, 2, 3 MiB held
  CHECK_FALSE(ledger->reserve(*a, 0, 4 << 20, 8 << 20, ring));                         // 4 more: refused
  ledger->release(*a, 0, 2 << 20, ring);
  ledger->charge(*a, 0, 1 << 20);  // no ring: not kept
  REQUIRE(ledger->events_next.load() == 5);
  // Five written into four: the first was overwritten, the other four are there in order.
  const std::pair<cap::memory_event::kind_t, std::uint64_t> expected[] = {{cap::memory_event::held, 2 << 20},
                                                                          {cap::memory_event::held, 3 << 20},
                                                                          {cap::memory_event::refused, 4 << 20},
                                                                          {cap::memory_event::released, 2 << 20}};
  std::int64_t last = 0;
  for (std::uint64_t n = 1; n < 5; ++n) {
    const cap::memory_event& e = ring.at[n % events];
    INFO(n);
    CHECK(e.seq.load() == n + 1);
    CHECK(e.kind == expected[n - 1].first);
    CHECK(e.bytes == expected[n - 1].second);
    CHECK(e.pid == self);
    CHECK(e.t_ns >= last);
    last = e.t_ns;
  }
  ledger->~cap_ledger();
}

TEST_CASE("NVML says what the driver says: the cap as the total, the command's use, never negative", "[cap][nvml]") {
  // The stand-in NVML reports an 80 GiB device with 1 GiB used; under a 256 MiB cap on it (the
  // command's device 0, NVML index 0) a program looking it up with dlsym, as pynvml does, sees
  // the cap.
  cap_files files(256ULL << 20, 4);
  const std::vector<std::string> env = {std::string("LD_LIBRARY_PATH=") + FAKE_CUDA_DIR + ":" + FAKE_NVML_DIR,
                                        std::string("LD_PRELOAD=") + CAP_LIBRARY, files.region(), files.terms(),
                                        "ISORUN_GPU=0"};
  auto r = isorun::test::run_captured(CAP_PROBE, {"nvml", "fill", "64", "direct", "nvml"}, env);
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out == "nvml 256 0 256 v2 256 0 256\nfilled 4 code 2\nnvml 256 256 0 v2 256 256 0\n");
  // Past the cap (a context is counted even there): used stops at the total, free at 0.
  files.ledger().devices[0].used += 64ULL << 20;
  r = isorun::test::run_captured(CAP_PROBE, {"nvml"}, env);
  CHECK(r.out == "nvml 256 256 0 v2 256 256 0\n");
  // A device the command was not given is NVML's own figures.
  r = isorun::test::run_captured(CAP_PROBE, {"nvml"}, {env[0], env[1], env[2], env[3], "ISORUN_GPU=3"});
  CHECK(r.out == "nvml 81920 1024 80896 v2 81920 1024 80896\n");
}

TEST_CASE("a context made with cuCtxCreate is counted as a primary context is", "[cap]") {
  // The probe starts with device 0's primary context; then a context of its own on device 1,
  // where it allocates.
  cap_files files(256ULL << 20, 4);
  auto r = isorun::test::run_captured(
      CAP_PROBE, {"ctx-create", "1", "fill", "64", "direct"},
      {fake_driver, std::string("LD_PRELOAD=") + CAP_LIBRARY, files.region(), files.terms(), "ISORUN_GPU=0,1"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out == "ctx-create 1 0\nfilled 4 code 2\n");
  CHECK(files.ledger().contexts.load() == 2);  // one per device, however it was made
  CHECK(files.ledger().devices[1].used.load() == 256ULL << 20);
}

TEST_CASE("a child forked without exec neither takes its parent's share with it nor counts it twice", "[cap]") {
  // Under 256 MiB, the parent holds 192 MiB; a child forked after CUDA was initialised (a
  // DataLoader worker) frees what it inherited (its parent's memory, not its own) and ends with
  // exit(). Throughout, 64 MiB stay free, and after the child is gone the parent's 192 MiB are
  // still counted: 64 MiB more fit, not 256.
  auto r = capped({CAP_PROBE, "fill", "64", "direct", "free", "async", "192", "fork", "fill", "64", "direct"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out == "filled 4 code 2\nfreed\nasync 0\nfork 64 64\nfilled 1 code 2\n");
}

TEST_CASE("stream-ordered pools: what a pool keeps counts, the pool still serves from it, and trimming gives it back",
          "[cap][pools]") {
  // Under 256 MiB: 192 MiB allocated and freed into the device's pool stay on the device, so a
  // plain allocation gets only the 64 MiB left; the pool serves 192 MiB again from what it keeps
  // though the cap is full; trimmed, the pool's memory is the cap's again.
  auto r = capped({CAP_PROBE, "async", "192", "async-free", "fill", "64", "direct", "async", "192", "free",
                   "async-free", "trim", "0", "fill", "64", "direct"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out == "async 0\nasync-freed\nfilled 1 code 2\nasync 0\nfreed\nasync-freed\ntrimmed 0\nfilled 4 code 2\n");
}

TEST_CASE("stream-ordered pools: 100,000 async allocations and frees leave the accounting exact", "[cap][pools]") {
  // The pool keeps the last 1 MiB until a synchronization gives it back (release threshold 0).
  auto r = capped({CAP_PROBE, "cycles", "100000", "1", "info", "sync", "info"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out == "cycles 100000 0\ninfo 255 256\nsynced\ninfo 256 256\n");
}

TEST_CASE("memory shared by export and import, or by CUDA IPC, is counted once, to the handle that made it", "[cap]") {
  // 128 MiB made, exported and imported again, and an IPC pointer opened: the cap holds 128 MiB
  // of it, and gets it all back when the importer's handle and then the maker's are released.
  auto r = capped({CAP_PROBE, "share", "128", "fill", "64", "direct", "free", "unshare", "fill", "64", "direct"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out == "share 0 0 0 0\nfilled 2 code 2\nfreed\nunshared\nfilled 4 code 2\n");
}
