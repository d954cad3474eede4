// libisorun_cuda_cap.so: preloaded into a `-- CMD` command under --mem-limit, it enforces the
// cap on the CUDA driver API. Every allocation entry point (cuMemAlloc_v2, cuMemAllocPitch_v2,
// cuMemAllocManaged, cuMemAllocAsync, cuMemAllocFromPoolAsync and their per-thread-stream
// variants, cuMemCreate, cuArrayCreate_v2, cuArray3DCreate_v2, cuMipmappedArrayCreate) first
// reserves its bytes in the ledger the supervisor shares with all of the command's processes
// (cap_region.hpp), on the device it allocates on (the current context's, or the one cuMemCreate
// names: the cap is per device), and gives CUDA_ERROR_OUT_OF_MEMORY when the cap would be
// exceeded; frees give the bytes back; cuMemGetInfo_v2 reports the cap as the total and what is
// left of it on the current device as free, so frameworks size their pools to it.
//
// Programs reach the driver three ways, and all three lead here: by linking libcuda (the
// exported names below win over libcuda's by LD_PRELOAD), by dlsym on a libcuda handle (dlsym is
// interposed for these names), and through cuGetProcAddress / cuGetProcAddress_v2, which the
// CUDA runtime uses for everything (the pointers it hands out for these functions are swapped
// for ours).
//
// It fails closed: a process that loaded this library but cannot reach the cap (its variables
// were removed before it loaded, the ledger cannot be opened, every slot is taken) has its
// device allocations refused, and says why on stderr once. And it stays loaded down the process
// tree: the variables it needs are read when it loads, before the program runs (or, if they were
// not set then, when the worker that sets them calls isorun_cap_bind, before the call's code
// runs: a standby Python worker gets its call's cap with the call; one that was pinned cannot be
// changed afterwards), and handed on to
// every program a process of the command starts through exec*(), posix_spawn*() or pidfd_spawn*(), with itself
// put back into LD_PRELOAD, so a child started with a clean environment is capped too. What it
// does not stop (a program that sets out to escape) is said in cap_region.hpp.
#include <alloca.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "cap_env.hpp"
#include "isorun/preload/cap_region.hpp"

extern char** environ;

// The driver's figure for this process's context on a device (below, with the driver's functions).
extern "C" std::uint64_t context_bytes(int device);

namespace {

namespace cap = isorun::preload;
namespace env = isorun::preload::env;
using CUresult = int;
using CUdeviceptr = unsigned long long;
using handle_t = unsigned long long;  // CUmemGenericAllocationHandle
constexpr CUresult success = 0;
constexpr CUresult out_of_memory = 2;    // CUDA_ERROR_OUT_OF_MEMORY
constexpr CUresult not_found = 500;      // CUDA_ERROR_NOT_FOUND
constexpr CUresult not_permitted = 800;  // CUDA_ERROR_NOT_PERMITTED

// A zygote (zygote_env "1" at load) refuses every CUDA call until its forked child thaws it: the
// driver is never initialized there, so no child inherits its state. A child thawed without a
// cap (its call has no mem_limit) has the library step aside: nothing charged, nothing refused.
std::atomic<bool> frozen{false};
std::atomic<bool> uncapped{false};
std::atomic<bool> frozen_said{false};

CUresult refused_in_zygote(const char* what) {
  if (!frozen_said.exchange(true)) {
    const std::string line = "isorun: " + std::string(what) + " refused in zygote " + std::to_string(::getpid()) +
                             ": a zygote never initializes CUDA (its forked workers do, once assigned their GPU)\n";
    [[maybe_unused]] auto n = ::write(2, line.data(), line.size());
  }
  return not_permitted;
}

using dlsym_t = void* (*)(void*, const char*);

dlsym_t real_dlsym() {
  static dlsym_t real = [] {
    auto r = reinterpret_cast<dlsym_t>(::dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34"));
    if (!r) r = reinterpret_cast<dlsym_t>(::dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5"));
    return r;
  }();
  return real;
}

// The driver's own function of that exported name.
void* driver(const char* name) {
  static void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  return lib ? real_dlsym()(lib, name) : nullptr;
}

template <class F>
F real(const char* name) {
  return reinterpret_cast<F>(driver(name));
}

// ---- What the library pins when it loads ----------------------------------------------------
// Read before the program's main() runs, so a program that edits its environment afterwards
// cannot move itself off the cap, and put into the environment of every program a process of the
// command starts. Only read after loading: the exec wrappers may run in a vfork child, where
// nothing may allocate.

// The variables the cap depends on: where its files are, and which GPUs the command has.
// (isorun's own variables only: a launcher in the command may narrow CUDA_VISIBLE_DEVICES for
// its children, as torchrun does, and must keep doing so.)
constexpr const char* pinned_names[] = {cap::region_env, cap::terms_env, "ISORUN_GPU", cap::deferred_env};
constexpr std::size_t pinned_count = std::size(pinned_names);

struct load_time {
  // "NAME=value" as it was at load, or as it was at the first allocation if it was not set at
  // load (a standby interpreter gets its call's variables after it started); null while unset.
  std::atomic<const char*> entry[pinned_count] = {};
  const char* self = nullptr;       // this library's path, as LD_PRELOAD names it
  const char* no_budget = nullptr;  // deferred_env "=0": what a child of a process still deferred gets
  using execve_t = int (*)(const char*, char* const*, char* const*);
  using execveat_t = int (*)(int, const char*, char* const*, char* const*, int);
  using fexecve_t = int (*)(int, char* const*, char* const*);
  using spawn_t = int (*)(pid_t*, const char*, const posix_spawn_file_actions_t*, const posix_spawnattr_t*,
                          char* const*, char* const*);
  using pidfd_spawn_t = int (*)(int*, const char*, const posix_spawn_file_actions_t*, const posix_spawnattr_t*,
                                char* const*, char* const*);
  execve_t execve = nullptr, execvpe = nullptr;
  execveat_t execveat = nullptr;
  fexecve_t fexecve = nullptr;
  spawn_t posix_spawn = nullptr, posix_spawnp = nullptr;
  pidfd_spawn_t pidfd_spawn = nullptr, pidfd_spawnp = nullptr;  // (glibc 2.39 and later)
};
load_time loaded;

[[nodiscard]] const char* value_of(const char* entry) { return entry ? std::strchr(entry, '=') + 1 : nullptr; }

// Pins the variables that are set now and were not pinned yet.
void pin_unset() {
  for (std::size_t i = 0; i < pinned_count; ++i)
    if (const char* v = std::getenv(pinned_names[i]); v && !loaded.entry[i].load())
      loaded.entry[i] = ::strdup((std::string(pinned_names[i]) + "=" + v).c_str());
}

__attribute__((constructor)) void pin_at_load() {
  pin_unset();
  if (const char* z = std::getenv(cap::zygote_env); z && std::strcmp(z, "1") == 0) frozen = true;
  Dl_info self{};
  if (::dladdr(reinterpret_cast<void*>(&pin_at_load), &self) && self.dli_fname) loaded.self = ::strdup(self.dli_fname);
  auto next = [](const char* name) { return real_dlsym()(RTLD_NEXT, name); };
  loaded.execve = reinterpret_cast<load_time::execve_t>(next("execve"));
  loaded.execvpe = reinterpret_cast<load_time::execve_t>(next("execvpe"));
  loaded.execveat = reinterpret_cast<load_time::execveat_t>(next("execveat"));  // (glibc 2.34 and later)
  loaded.no_budget = ::strdup((std::string(cap::deferred_env) + "=0").c_str());
  loaded.fexecve = reinterpret_cast<load_time::fexecve_t>(next("fexecve"));
  loaded.posix_spawn = reinterpret_cast<load_time::spawn_t>(next("posix_spawn"));
  loaded.posix_spawnp = reinterpret_cast<load_time::spawn_t>(next("posix_spawnp"));
  loaded.pidfd_spawn = reinterpret_cast<load_time::pidfd_spawn_t>(next("pidfd_spawn"));
  loaded.pidfd_spawnp = reinterpret_cast<load_time::pidfd_spawn_t>(next("pidfd_spawnp"));
}

// Runs `start(env)` with `envp` changed as the cap needs (on this stack: no allocation). The
// pinned entries are read once, so the plan and what is written agree.
template <class Start>
int with_cap_env(char* const* envp, Start&& start) {
  if (uncapped.load(std::memory_order_relaxed)) return start(envp);  // no cap to hand on
  const char* entries[pinned_count];
  for (std::size_t i = 0; i < pinned_count; ++i) entries[i] = loaded.entry[i].load();
  // A process still waiting for its call's region hands on no budget: a child started now would
  // keep a private cap of its own for its whole life, which no ledger sees. Its library fails
  // closed instead (deferred_env 0 is no cap).
  if (entries[3] && !(entries[0] && entries[1])) entries[3] = loaded.no_budget;
  const env::pins pins{pinned_names, entries, pinned_count, loaded.self};
  const env::plan plan = env::make_plan(envp, pins);
  if (!plan.slots) return start(envp);
  auto** out = static_cast<char**>(alloca(plan.slots * sizeof(char*)));
  auto* buffer = static_cast<char*>(alloca(plan.buffer + 1));
  env::fill(envp, plan, pins, out, buffer);
  return start(out);
}

// ---- This process's share of the cap --------------------------------------------------------

// The device an allocation lands on: the current context's (its CUDA ordinal in this process),
// 0 when there is none (the driver then refuses the allocation anyway).
std::size_t current_device() {
  static auto get = real<CUresult (*)(int*)>("cuCtxGetDevice");
  int device = 0;
  if (!get || get(&device) != success) device = 0;
  return cap::ledger_of(device);
}

// What one allocation holds: on which device, how many bytes.
struct holding {
  std::size_t device = 0;
  std::uint64_t bytes = 0;
};

// This process's share of the cap, and what it holds.
struct account {
  cap::cap_terms terms{};
  cap::cap_ledger* ledger = nullptr;
  cap::process_slot* slot = nullptr;
  cap::event_ring ring;  // where this process's changes are kept for a memory timeline, if anywhere
  std::string refusal;   // why every allocation is refused (the cap cannot be reached), or ""
  std::atomic<bool> refusal_said{false};
  std::mutex mutex;
  std::unordered_map<CUdeviceptr, holding> pointers;
  std::unordered_map<handle_t, holding> handles;
  std::unordered_map<std::uintptr_t, holding> arrays;
  bool context_counted[cap::max_devices] = {};
  // Stream-ordered pools (cuMemAllocAsync, explicit pools): a pool keeps what is freed into it
  // until it releases it (at a synchronization, down to its release threshold) or is trimmed,
  // and that memory is on the device. So a pool is charged what the driver says it holds
  // (its reserved memory), brought up to date at each of this process's pool calls; `in_flight`
  // is what allocations being made now have reserved ahead of the pool's growth.
  struct pool_account {
    std::size_t device = 0;
    std::uint64_t charged = 0, in_use = 0, in_flight = 0;
  };
  std::unordered_map<void*, pool_account> pools;
  std::unordered_map<CUdeviceptr, std::pair<void*, std::uint64_t>> pool_pointers;  // -> pool, bytes

  // A process launched before its call (deferred_env): until the call's region comes, what it
  // allocates is kept here, within the cap it was launched with, and charged to the ledger
  // when the region is bound. Guarded by `mutex`; 0 once bound (or never deferred).
  std::atomic<std::uint64_t> deferred{0};
  std::uint64_t pending[cap::max_devices] = {};
  std::uint64_t pending_contexts = 0;

  account() {
    pin_unset();           // what was not there at load, if it is now
    if (uncapped) return;  // a zygote's child without a cap: nothing is charged
    if (region_given()) {
      open_region();
      return;
    }
    if (const char* limit = value_of(loaded.entry[3]); limit && std::strtoull(limit, nullptr, 10) > 0) {
      deferred = std::strtoull(limit, nullptr, 10);
      return;
    }
    refusal = std::string(cap::region_env) + " or " + cap::terms_env + " is not set";
  }
  static bool region_given() { return value_of(loaded.entry[0]) && value_of(loaded.entry[1]); }
  // Under `mutex`, while deferred: binds the call's region if it has come, charging what was
  // allocated before it. False while it has not.
  bool bind() {
    pin_unset();
    if (!region_given()) return false;
    deferred = 0;
    open_region();
    if (slot) {
      for (std::size_t d = 0; d < cap::max_devices; ++d)
        if (pending[d]) ledger->charge(*slot, d, pending[d], ring);  // it exists: counted even past the cap
      ledger->contexts += pending_contexts;
    }
    return true;
  }
  void open_region() {
    const char* terms_path = value_of(loaded.entry[1]);
    const char* ledger_path = value_of(loaded.entry[0]);
    const int tfd = ::open(terms_path, O_RDONLY | O_CLOEXEC);
    const bool read = tfd >= 0 && ::pread(tfd, &terms, sizeof terms, 0) == static_cast<ssize_t>(sizeof terms);
    const int seals = tfd >= 0 ? ::fcntl(tfd, F_GET_SEALS) : 0;
    if (tfd >= 0) ::close(tfd);
    if (!read || terms.magic != cap::terms_magic || seals < 0 || !(seals & F_SEAL_WRITE)) {
      refusal = std::string("the cap's terms (") + terms_path + ") cannot be read, or are not isorun's sealed terms";
      return;
    }
    const std::size_t bytes = cap::cap_ledger::bytes_for(terms.slot_capacity, terms.event_capacity);
    const int lfd = ::open(ledger_path, O_RDWR | O_CLOEXEC);
    // Sealed against resizing, as the supervisor made it: a ledger that could be cut short
    // under the mapping would fault in whichever process touched the lost pages.
    struct stat st {};
    const int lseals = lfd >= 0 ? ::fcntl(lfd, F_GET_SEALS) : -1;
    const bool sized = lfd >= 0 && ::fstat(lfd, &st) == 0 && static_cast<std::uint64_t>(st.st_size) >= bytes &&
                       lseals >= 0 && (lseals & F_SEAL_SHRINK);
    void* p = !sized ? MAP_FAILED : ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, lfd, 0);
    if (lfd >= 0) ::close(lfd);
    if (p == MAP_FAILED || static_cast<cap::cap_ledger*>(p)->magic != cap::ledger_magic) {
      refusal = std::string("the cap's ledger (") + ledger_path + ") cannot be opened";
      return;
    }
    ledger = static_cast<cap::cap_ledger*>(p);
    ring = ledger->ring(terms.slot_capacity, terms.event_capacity);
    take_slot();
  }
  void take_slot() {
    slot = ledger->claim(static_cast<std::int32_t>(::getpid()), terms.slot_capacity, ring);
    if (!slot)
      refusal = "all " + std::to_string(terms.slot_capacity) + " process slots of the cap are taken by live processes";
  }
  // After fork() the child is another process: its own slot, nothing held yet (CUDA cannot be
  // used in a forked child of a CUDA process anyway).
  void forked() {
    pointers.clear();
    handles.clear();
    arrays.clear();
    for (bool& c : context_counted) c = false;
    for (auto& p : pending) p = 0;
    pending_contexts = 0;
    pools.clear();
    pool_pointers.clear();
    if (ledger) take_slot();
  }
  bool reserve(const holding& h) {
    std::unique_lock lock(mutex);
    return reserve_locked(h);
  }
  // Under `mutex`.
  bool reserve_locked(const holding& h) {
    if (uncapped) return true;
    if (deferred && !bind()) {
      if (h.bytes > deferred || pending[h.device] > deferred - h.bytes) return false;  // over the cap already
      pending[h.device] += h.bytes;
      return true;
    }
    if (!refusal.empty()) {
      say_refusal();
      return false;
    }
    reconcile_pools();  // a pool may have given memory back since it was last asked
    return ledger->reserve(*slot, h.device, h.bytes, terms.limit, ring);
  }
  // Under `mutex`: bytes that exist on the device, counted even past the cap.
  void charge_locked(std::size_t device, std::uint64_t bytes) {
    if (deferred) pending[device] += bytes;
    else if (slot) ledger->charge(*slot, device, bytes, ring);
  }
  // Under `mutex`: bytes given back to the device.
  void release_locked(std::size_t device, std::uint64_t bytes) {
    if (deferred) pending[device] -= std::min(pending[device], bytes);
    else if (slot) ledger->release(*slot, device, bytes, ring);
  }
  // Under `mutex`: pool `pool`'s charge brought to what the driver says it holds (and what
  // allocations being made now reserved ahead of it). False if the driver cannot say.
  bool reconcile(void* pool, pool_account& pa);
  void reconcile_pools() {
    for (auto& [pool, pa] : pools) reconcile(pool, pa);
  }
  // The cap on ledger device `d` and what is held there now (the pools brought up to date):
  // before its call's region comes, the cap this process was launched with and what it holds
  // itself. False where no cap is reached. What cuMemGetInfo and NVML report.
  bool view(std::size_t d, std::uint64_t& limit, std::uint64_t& used) {
    std::lock_guard lock(mutex);
    reconcile_pools();
    if (deferred && !bind()) {
      limit = deferred;
      used = pending[d];
      return true;
    }
    if (!ledger) return false;
    limit = terms.limit;
    used = ledger->devices[d].used.load();
    return true;
  }
  void give_back(const holding& h) {
    std::lock_guard lock(mutex);
    release_locked(h.device, h.bytes);
  }
  // Under `mutex`: device `d`'s context exists now; counted once, even past the cap.
  void count_context(std::size_t d, int device) {
    if (context_counted[d]) return;
    if (deferred) {
      context_counted[d] = true;
      ++pending_contexts;
      pending[d] += context_bytes(device);
    } else if (slot) {
      context_counted[d] = true;
      ++ledger->contexts;
      if (const std::uint64_t bytes = context_bytes(device)) ledger->charge(*slot, d, bytes, ring);
    }
  }
  // Once per process: allocations are refused because the cap cannot be reached, and why.
  void say_refusal() {
    if (refusal_said.exchange(true)) return;
    const std::string line = "isorun: CUDA allocations refused in process " + std::to_string(::getpid()) + ": " +
                             refusal + " (the command runs under --mem-limit, and the cap fails closed)\n";
    [[maybe_unused]] auto n = ::write(2, line.data(), line.size());
  }
};

account& acct() {
  static account* a = [] {
    auto* created = new account;  // never destroyed: frees may come during static destruction
    ::pthread_atfork([] { acct().mutex.lock(); }, [] { acct().mutex.unlock(); },
                     [] {
                       acct().mutex.unlock();
                       acct().forked();
                     });
    return created;
  }();
  return *a;
}

// After the driver made (or retained) a context on `device` with `rc`: counted if it exists.
CUresult context_made(CUresult rc, int device) {
  if (rc == success) {
    auto& a = acct();
    std::lock_guard lock(a.mutex);
    a.count_context(cap::ledger_of(device), device);
  }
  return rc;
}

template <class Map, class Key>
void remember(Map& map, Key key, holding h) {
  std::lock_guard lock(acct().mutex);
  map[key] = h;
}

template <class Map, class Key>
void forget(Map& map, Key key) {
  holding h;
  {
    std::lock_guard lock(acct().mutex);
    auto it = map.find(key);
    if (it == map.end()) return;
    h = it->second;
    map.erase(it);
  }
  acct().give_back(h);
}

// One allocation of `h`: reserve, call the driver, keep (under the key it wrote to `*out`) or
// give back.
template <class Map, class Key, class Call>
CUresult charged(Map& map, holding h, Key* out, Call&& call) {
  auto& a = acct();
  if (!a.reserve(h)) return out_of_memory;
  const CUresult rc = call();
  if (rc != success || !out) {
    a.give_back(h);
    return rc;
  }
  remember(map, *out, h);
  return rc;
}

// One allocation on the current device.
template <class Call>
CUresult charged(std::uint64_t bytes, CUdeviceptr* dptr, Call&& call) {
  return charged(acct().pointers, holding{current_device(), bytes}, dptr, std::forward<Call>(call));
}

// ---- Stream-ordered pools --------------------------------------------------------------------

constexpr int pool_reserved_now = 5;  // CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT

// What the driver says `pool` holds on its device; nothing if it cannot say.
std::optional<std::uint64_t> pool_reserved(void* pool) {
  static auto get = real<CUresult (*)(void*, int, void*)>("cuMemPoolGetAttribute");
  std::uint64_t value = 0;
  if (!get || get(pool, pool_reserved_now, &value) != success) return std::nullopt;
  return value;
}

bool account::reconcile(void* pool, pool_account& pa) {
  const auto now = pool_reserved(pool);
  if (!now) return false;
  const std::uint64_t target = *now + pa.in_flight;
  if (target > pa.charged) charge_locked(pa.device, target - pa.charged);
  else if (target < pa.charged) release_locked(pa.device, pa.charged - target);
  pa.charged = target;
  return true;
}

// The current context's device as the driver numbers it (0 when there is none).
int current_ordinal() {
  static auto get = real<CUresult (*)(int*)>("cuCtxGetDevice");
  int device = 0;
  if (!get || get(&device) != success) device = 0;
  return device;
}

// One allocation of `bytes` from stream-ordered `pool` (null: the current device's pool) by
// `call`: reserved ahead only for what the pool's free memory cannot serve, then the pool's
// charge brought to what it holds. Where the driver cannot say what a pool holds, charged as a
// plain allocation.
template <class Call>
CUresult pool_allocation(CUdeviceptr* dptr, std::uint64_t bytes, void* pool, Call&& call) {
  if (!pool) {
    static auto current = real<CUresult (*)(void**, int)>("cuDeviceGetMemPool");
    if (!current || current(&pool, current_ordinal()) != success) pool = nullptr;
  }
  auto& a = acct();
  std::unique_lock lock(a.mutex);
  if (!pool || !pool_reserved(pool)) {
    lock.unlock();
    return charged(bytes, dptr, std::forward<Call>(call));
  }
  auto [it, added] = a.pools.try_emplace(pool);
  account::pool_account& pa = it->second;
  if (added) pa.device = current_device();
  a.reconcile(pool, pa);
  const std::uint64_t spare = pa.charged > pa.in_use + pa.in_flight ? pa.charged - pa.in_use - pa.in_flight : 0;
  const std::uint64_t ahead = bytes > spare ? bytes - spare : 0;
  if (ahead && !a.reserve_locked({pa.device, ahead})) return out_of_memory;
  pa.charged += ahead;
  pa.in_flight += ahead;
  lock.unlock();
  const CUresult rc = call();
  lock.lock();
  pa.in_flight -= ahead;
  if (rc == success && dptr) {
    pa.in_use += bytes;
    a.pool_pointers[*dptr] = {pool, bytes};
  }
  a.reconcile(pool, pa);
  return rc;
}

// After the driver freed `dptr` (rc == success): its bytes go back to the cap, or into its pool,
// which is charged what it still holds.
CUresult freed(CUresult rc, CUdeviceptr dptr) {
  if (rc != success) return rc;
  auto& a = acct();
  {
    std::lock_guard lock(a.mutex);
    if (auto it = a.pool_pointers.find(dptr); it != a.pool_pointers.end()) {
      auto pool = a.pools.find(it->second.first);
      if (pool != a.pools.end()) {
        pool->second.in_use -= std::min(pool->second.in_use, it->second.second);
        a.reconcile(pool->first, pool->second);
      }
      a.pool_pointers.erase(it);
      return rc;
    }
  }
  forget(a.pointers, dptr);
  return rc;
}

// ---- CUDA arrays ------------------------------------------------------------------------------
// Their layout is the driver's; what is charged is their texels' bytes: the element size of the
// format times the channels for the plain formats, and 8 bytes per texel (as much as any format
// takes) for the rest. Sparse and deferred-mapping arrays have no memory of their own (what is
// mapped into them comes from cuMemCreate, charged there).

struct array3d_descriptor {  // CUDA_ARRAY3D_DESCRIPTOR_v2
  std::size_t width, height, depth;
  int format;
  unsigned channels, flags;
};
struct array_descriptor {  // CUDA_ARRAY_DESCRIPTOR_v2
  std::size_t width, height;
  int format;
  unsigned channels;
};
constexpr unsigned array_sparse = 0x40, array_deferred_mapping = 0x80, array_layered = 0x01;

std::uint64_t texel_bytes(int format, unsigned channels) {
  switch (format) {
    case 0x01:
    case 0x08: return channels;  // 8-bit integers
    case 0x02:
    case 0x09:
    case 0x10: return 2ULL * channels;  // 16-bit integers, half
    case 0x03:
    case 0x0a:
    case 0x20: return 4ULL * channels;  // 32-bit integers, float
    case 0xc0:
    case 0xc6: return 1;  // (un)signed normalized 8-bit x1, x2, x4
    case 0xc1:
    case 0xc7: return 2;
    case 0xc2:
    case 0xc8: return 4;
    case 0xc3:
    case 0xc9: return 2;  // 16-bit x1, x2, x4
    case 0xc4:
    case 0xca: return 4;
    case 0xc5:
    case 0xcb: return 8;
    default: return 8;
  }
}

std::uint64_t array_bytes(const array3d_descriptor& d, unsigned levels) {
  if (d.flags & (array_sparse | array_deferred_mapping)) return 0;
  const std::uint64_t texel = texel_bytes(d.format, d.channels);
  std::uint64_t w = std::max<std::size_t>(d.width, 1), h = std::max<std::size_t>(d.height, 1),
                z = std::max<std::size_t>(d.depth, 1), all = 0;
  // Saturating: a descriptor whose size overflows is charged as too large for any cap (the
  // driver refuses it anyway). The driver allows no more levels than halvings of the largest
  // dimension, at most 64, so a larger count is not looped over.
  constexpr std::uint64_t too_large = ~std::uint64_t{0};
  for (unsigned l = 0; l < std::clamp(levels, 1U, 64U); ++l) {
    std::uint64_t level = texel;
    if (__builtin_mul_overflow(level, w, &level) || __builtin_mul_overflow(level, h, &level) ||
        __builtin_mul_overflow(level, z, &level) || __builtin_add_overflow(all, level, &all))
      return too_large;
    w = std::max<std::uint64_t>(w / 2, 1);
    h = std::max<std::uint64_t>(h / 2, 1);
    if (!(d.flags & array_layered)) z = std::max<std::uint64_t>(z / 2, 1);  // layers do not shrink
  }
  return all;
}

template <class Handle, class Call>
CUresult charged_array(Handle* out, std::uint64_t bytes, Call&& call) {
  std::uintptr_t key = 0;
  return charged(acct().arrays, holding{current_device(), bytes}, &key, [&] {
    const CUresult r = call();
    if (r == success && out) key = reinterpret_cast<std::uintptr_t>(*out);
    return r;
  });
}

// After the driver destroyed `array` (rc == success): its bytes go back to the cap.
CUresult destroyed(CUresult rc, void* array) {
  if (rc == success) forget(acct().arrays, reinterpret_cast<std::uintptr_t>(array));
  return rc;
}

}  // namespace

extern "C" {

CUresult cuMemAlloc_v2(CUdeviceptr* dptr, std::size_t bytes) {
  static auto f = real<CUresult (*)(CUdeviceptr*, std::size_t)>("cuMemAlloc_v2");
  if (!f) return not_found;
  return charged(bytes, dptr, [&] { return f(dptr, bytes); });
}

CUresult cuMemAllocManaged(CUdeviceptr* dptr, std::size_t bytes, unsigned flags) {
  static auto f = real<CUresult (*)(CUdeviceptr*, std::size_t, unsigned)>("cuMemAllocManaged");
  if (!f) return not_found;
  return charged(bytes, dptr, [&] { return f(dptr, bytes, flags); });
}

CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, std::size_t* pitch, std::size_t width, std::size_t height,
                            unsigned element) {
  static auto f = real<CUresult (*)(CUdeviceptr*, std::size_t*, std::size_t, std::size_t, unsigned)>(
      "cuMemAllocPitch_v2");
  if (!f) return not_found;
  // The pitch is known only afterwards: reserve with rows padded to 512 bytes, the usual
  // alignment, and charge any difference once it is known.
  const std::uint64_t guess = ((width + 511) / 512 * 512) * height;
  const CUresult rc = charged(guess, dptr, [&] { return f(dptr, pitch, width, height, element); });
  if (rc == success && pitch && *pitch * height != guess) {
    auto& a = acct();
    const std::uint64_t actual = *pitch * height;
    const std::size_t device = current_device();
    if (actual > guess) {
      std::lock_guard lock(a.mutex);
      a.charge_locked(device, actual - guess);  // (deferred: kept until the region comes)
    } else a.give_back({device, guess - actual});
    remember(a.pointers, *dptr, holding{device, actual});
  }
  return rc;
}

CUresult cuMemAllocAsync(CUdeviceptr* dptr, std::size_t bytes, void* stream) {
  static auto f = real<CUresult (*)(CUdeviceptr*, std::size_t, void*)>("cuMemAllocAsync");
  if (!f) return not_found;
  return pool_allocation(dptr, bytes, nullptr, [&] { return f(dptr, bytes, stream); });
}

CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, std::size_t bytes, void* stream) {
  static auto f = real<CUresult (*)(CUdeviceptr*, std::size_t, void*)>("cuMemAllocAsync_ptsz");
  if (!f) return not_found;
  return pool_allocation(dptr, bytes, nullptr, [&] { return f(dptr, bytes, stream); });
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, std::size_t bytes, void* pool, void* stream) {
  static auto f = real<CUresult (*)(CUdeviceptr*, std::size_t, void*, void*)>("cuMemAllocFromPoolAsync");
  if (!f) return not_found;
  return pool_allocation(dptr, bytes, pool, [&] { return f(dptr, bytes, pool, stream); });
}

CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, std::size_t bytes, void* pool, void* stream) {
  static auto f = real<CUresult (*)(CUdeviceptr*, std::size_t, void*, void*)>("cuMemAllocFromPoolAsync_ptsz");
  if (!f) return not_found;
  return pool_allocation(dptr, bytes, pool, [&] { return f(dptr, bytes, pool, stream); });
}

CUresult cuMemFree_v2(CUdeviceptr dptr) {
  static auto f = real<CUresult (*)(CUdeviceptr)>("cuMemFree_v2");
  if (!f) return not_found;
  return freed(f(dptr), dptr);
}

CUresult cuMemFreeAsync(CUdeviceptr dptr, void* stream) {
  static auto f = real<CUresult (*)(CUdeviceptr, void*)>("cuMemFreeAsync");
  if (!f) return not_found;
  return freed(f(dptr, stream), dptr);
}

CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, void* stream) {
  static auto f = real<CUresult (*)(CUdeviceptr, void*)>("cuMemFreeAsync_ptsz");
  if (!f) return not_found;
  return freed(f(dptr, stream), dptr);
}

// A pool the program trims, or destroys, gives memory back: its charge follows.
CUresult cuMemPoolTrimTo(void* pool, std::size_t keep) {
  static auto f = real<CUresult (*)(void*, std::size_t)>("cuMemPoolTrimTo");
  if (!f) return not_found;
  const CUresult rc = f(pool, keep);
  auto& a = acct();
  std::lock_guard lock(a.mutex);
  if (auto it = a.pools.find(pool); it != a.pools.end()) a.reconcile(pool, it->second);
  return rc;
}

CUresult cuMemPoolDestroy(void* pool) {
  static auto f = real<CUresult (*)(void*)>("cuMemPoolDestroy");
  if (!f) return not_found;
  const CUresult rc = f(pool);
  auto& a = acct();
  std::lock_guard lock(a.mutex);
  if (auto it = a.pools.find(pool); rc == success && it != a.pools.end()) {
    a.release_locked(it->second.device, it->second.charged);
    std::erase_if(a.pool_pointers, [&](const auto& p) { return p.second.first == pool; });
    a.pools.erase(it);
  }
  return rc;
}

// A pool made for a device other than the current one: its memory is on that device
// (CUmemPoolProps begins: allocation type, handle types, location {type, id}).
CUresult cuMemPoolCreate(void** pool, const void* props) {
  static auto f = real<CUresult (*)(void**, const void*)>("cuMemPoolCreate");
  if (!f) return not_found;
  const CUresult rc = f(pool, props);
  if (rc == success && pool && props) {
    const int* fields = static_cast<const int*>(props);
    auto& a = acct();
    std::lock_guard lock(a.mutex);
    a.pools[*pool].device = fields[2] == 1 ? cap::ledger_of(fields[3]) : current_device();
  }
  return rc;
}

// The virtual-memory API (PyTorch's expandable segments): physical memory is what counts.
CUresult cuMemCreate(handle_t* handle, std::size_t bytes, const void* prop, unsigned long long flags) {
  static auto f = real<CUresult (*)(handle_t*, std::size_t, const void*, unsigned long long)>("cuMemCreate");
  if (!f) return not_found;
  auto& a = acct();
  // The device is the one the properties name (CUmemAllocationProp begins: type, requested
  // handle types, location {type, id}; CU_MEM_LOCATION_TYPE_DEVICE is 1), else the current one.
  struct prop_head {
    int type, handle_types, location_type, location_id;
  };
  const auto* head = static_cast<const prop_head*>(prop);
  const std::size_t device = head && head->location_type == 1 ? cap::ledger_of(head->location_id) : current_device();
  return charged(a.handles, holding{device, bytes}, handle, [&] { return f(handle, bytes, prop, flags); });
}

CUresult cuMemRelease(handle_t handle) {
  static auto f = real<CUresult (*)(handle_t)>("cuMemRelease");
  if (!f) return not_found;
  const CUresult rc = f(handle);
  if (rc == success) forget(acct().handles, handle);
  return rc;
}

CUresult cuArrayCreate_v2(void** array, const array_descriptor* desc) {
  static auto f = real<CUresult (*)(void**, const array_descriptor*)>("cuArrayCreate_v2");
  if (!f) return not_found;
  const std::uint64_t bytes = desc ? array_bytes({desc->width, desc->height, 1, desc->format, desc->channels, 0}, 1)
                                   : 0;
  return charged_array(array, bytes, [&] { return f(array, desc); });
}

CUresult cuArray3DCreate_v2(void** array, const array3d_descriptor* desc) {
  static auto f = real<CUresult (*)(void**, const array3d_descriptor*)>("cuArray3DCreate_v2");
  if (!f) return not_found;
  return charged_array(array, desc ? array_bytes(*desc, 1) : 0, [&] { return f(array, desc); });
}

CUresult cuMipmappedArrayCreate(void** array, const array3d_descriptor* desc, unsigned levels) {
  static auto f = real<CUresult (*)(void**, const array3d_descriptor*, unsigned)>("cuMipmappedArrayCreate");
  if (!f) return not_found;
  return charged_array(array, desc ? array_bytes(*desc, levels) : 0, [&] { return f(array, desc, levels); });
}

CUresult cuArrayDestroy(void* array) {
  static auto f = real<CUresult (*)(void*)>("cuArrayDestroy");
  if (!f) return not_found;
  return destroyed(f(array), array);
}

CUresult cuMipmappedArrayDestroy(void* array) {
  static auto f = real<CUresult (*)(void*)>("cuMipmappedArrayDestroy");
  if (!f) return not_found;
  return destroyed(f(array), array);
}

CUresult cuMemGetInfo_v2(std::size_t* free, std::size_t* total) {
  static auto f = real<CUresult (*)(std::size_t*, std::size_t*)>("cuMemGetInfo_v2");
  if (!f) return not_found;
  const CUresult rc = f(free, total);
  auto& a = acct();
  if (rc != success || uncapped) return rc;
  std::uint64_t limit = 0, used = 0;
  if (!a.view(current_device(), limit, used)) used = limit = a.terms.limit;  // no cap reached: nothing left
  const std::uint64_t left = used >= limit ? 0 : limit - used;
  if (total && *total > limit) *total = limit;
  if (free && *free > left) *free = left;
  return rc;
}

}  // extern "C"

// ---- NVML's view: the cap's --------------------------------------------------------------------
// A program that sizes itself from NVML (vLLM, JAX's allocator, nvidia-smi, pynvml) sees what
// cuMemGetInfo shows: for a device of the command, the cap as the total, what the command's
// processes hold (contexts included) as used, and the rest as free; never negative, never above
// the cap, and never more than the device has.
namespace {

struct nvml_memory {  // nvmlMemory_t
  unsigned long long total, free, used;
};
struct nvml_memory_v2 {  // nvmlMemory_v2_t
  unsigned version;
  unsigned long long total, reserved, free, used;
};
constexpr int nvml_function_not_found = 13;

void* nvml(const char* name) {
  static void* lib = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  return lib ? real_dlsym()(lib, name) : nullptr;
}

// The ledger's index of NVML device `device` where the command has it (ISORUN_GPU lists its
// devices' NVML indices in CUDA ordinal order); -1 where it does not.
int ledger_index(void* device) {
  static auto index_of = reinterpret_cast<int (*)(void*, unsigned*)>(nvml("nvmlDeviceGetIndex"));
  unsigned index = 0;
  const char* list = value_of(loaded.entry[2].load());
  if (!index_of || !list || index_of(device, &index) != 0) return -1;
  std::size_t ordinal = 0;
  for (const char* p = list; *p; ++ordinal) {
    char* end = nullptr;
    const unsigned long n = std::strtoul(p, &end, 10);
    if (end == p) return -1;
    if (n == index) return static_cast<int>(cap::ledger_of(static_cast<int>(ordinal)));
    p = *end == ',' ? end + 1 : end;
  }
  return -1;
}

// `total`, `used` and `free` of a device as the cap has them: false where the cap is not in force
// for it (not the command's device, or no cap reached).
bool capped_view(void* device, unsigned long long& total, unsigned long long& used, unsigned long long& free) {
  const int d = ledger_index(device);
  if (d < 0) return false;
  auto& a = acct();
  std::uint64_t limit = 0, held = 0;
  if (!a.view(static_cast<std::size_t>(d), limit, held)) return false;
  const unsigned long long device_free = free;
  total = std::min<unsigned long long>(total, limit);
  used = std::min<unsigned long long>(held, total);
  free = std::min(device_free, total - used);
  return true;
}

}  // namespace

extern "C" {

int nvmlDeviceGetMemoryInfo(void* device, nvml_memory* memory) {
  static auto f = reinterpret_cast<int (*)(void*, nvml_memory*)>(nvml("nvmlDeviceGetMemoryInfo"));
  if (!f) return nvml_function_not_found;
  const int rc = f(device, memory);
  if (rc == 0 && memory) capped_view(device, memory->total, memory->used, memory->free);
  return rc;
}

int nvmlDeviceGetMemoryInfo_v2(void* device, nvml_memory_v2* memory) {
  static auto f = reinterpret_cast<int (*)(void*, nvml_memory_v2*)>(nvml("nvmlDeviceGetMemoryInfo_v2"));
  if (!f) return nvml_function_not_found;
  const int rc = f(device, memory);
  if (rc == 0 && memory && capped_view(device, memory->total, memory->used, memory->free))
    memory->reserved = 0;  // the driver's own reservation is not the command's to see under a cap
  return rc;
}

// A process's first context on a device is counted as its own memory there, as the core counts a
// worker's: the driver's per-process figure (NVML) right after the context exists; 0 where NVML
// cannot say. ISORUN_GPU lists the devices' NVML indices in CUDA ordinal order ("1,3").
std::uint64_t context_bytes(int device) {
  const char* list = std::getenv("ISORUN_GPU");
  if (!list || !*list) return 0;
  for (int i = 0; i < device && list; ++i) {
    list = std::strchr(list, ',');
    if (list) ++list;
  }
  if (!list || !*list) return 0;
  void* nvml = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!nvml) return 0;
  using init_t = int (*)();
  using by_index_t = int (*)(unsigned, void**);
  struct info {
    unsigned pid;
    unsigned long long used;
    unsigned gi, ci;
  };
  using procs_t = int (*)(void*, unsigned*, info*);
  auto init = reinterpret_cast<init_t>(real_dlsym()(nvml, "nvmlInit_v2"));
  auto by_index = reinterpret_cast<by_index_t>(real_dlsym()(nvml, "nvmlDeviceGetHandleByIndex_v2"));
  auto procs = reinterpret_cast<procs_t>(real_dlsym()(nvml, "nvmlDeviceGetComputeRunningProcesses_v3"));
  void* dev = nullptr;
  std::uint64_t bytes = 0;
  if (init && by_index && procs && init() == 0 && by_index(static_cast<unsigned>(std::atoi(list)), &dev) == 0) {
    info entries[256];
    unsigned n = 256;
    if (procs(dev, &n, entries) == 0)
      for (unsigned i = 0; i < n && i < 256; ++i)
        if (entries[i].pid == static_cast<unsigned>(::getpid())) bytes = entries[i].used;
  }
  return bytes;
}

// A context made with cuCtxCreate is counted as a primary context is (once per device and
// process): its memory is the driver's, on the device, whichever way it was made.
CUresult cuCtxCreate_v2(void** ctx, unsigned flags, int device) {
  static auto f = real<CUresult (*)(void**, unsigned, int)>("cuCtxCreate_v2");
  return f ? context_made(f(ctx, flags, device), device) : not_found;
}

CUresult cuCtxCreate_v3(void** ctx, void* params, int count, unsigned flags, int device) {
  static auto f = real<CUresult (*)(void**, void*, int, unsigned, int)>("cuCtxCreate_v3");
  return f ? context_made(f(ctx, params, count, flags, device), device) : not_found;
}

CUresult cuCtxCreate_v4(void** ctx, void* params, unsigned flags, int device) {
  static auto f = real<CUresult (*)(void**, void*, unsigned, int)>("cuCtxCreate_v4");
  return f ? context_made(f(ctx, params, flags, device), device) : not_found;
}

CUresult cuDevicePrimaryCtxRetain(void** ctx, int device) {
  static auto f = real<CUresult (*)(void**, int)>("cuDevicePrimaryCtxRetain");
  return f ? context_made(f(ctx, device), device) : not_found;
}

CUresult cuGetProcAddress(const char* symbol, void** pfn, int version, std::uint64_t flags);
CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version, std::uint64_t flags, void* status);

// Every use of the driver begins here: refused in a zygote, so the driver is never initialized
// in a process that forks workers.
CUresult cuInit(unsigned flags) {
  if (frozen.load()) return refused_in_zygote("cuInit");
  static auto f = real<CUresult (*)(unsigned)>("cuInit");
  return f ? f(flags) : not_found;
}

}  // extern "C"

namespace {

// What cuGetProcAddress and dlsym hand out instead of the driver's functions.
struct interposed {
  const char* name;  // the driver's exported name
  void* ours;
};
const interposed table[] = {
    {"cuMemAlloc_v2", reinterpret_cast<void*>(&cuMemAlloc_v2)},
    {"cuMemAllocManaged", reinterpret_cast<void*>(&cuMemAllocManaged)},
    {"cuMemAllocPitch_v2", reinterpret_cast<void*>(&cuMemAllocPitch_v2)},
    {"cuMemAllocAsync", reinterpret_cast<void*>(&cuMemAllocAsync)},
    {"cuMemAllocAsync_ptsz", reinterpret_cast<void*>(&cuMemAllocAsync_ptsz)},
    {"cuMemAllocFromPoolAsync", reinterpret_cast<void*>(&cuMemAllocFromPoolAsync)},
    {"cuMemAllocFromPoolAsync_ptsz", reinterpret_cast<void*>(&cuMemAllocFromPoolAsync_ptsz)},
    {"cuMemFree_v2", reinterpret_cast<void*>(&cuMemFree_v2)},
    {"cuMemFreeAsync", reinterpret_cast<void*>(&cuMemFreeAsync)},
    {"cuMemPoolTrimTo", reinterpret_cast<void*>(&cuMemPoolTrimTo)},
    {"cuMemPoolDestroy", reinterpret_cast<void*>(&cuMemPoolDestroy)},
    {"cuMemPoolCreate", reinterpret_cast<void*>(&cuMemPoolCreate)},
    {"cuMemFreeAsync_ptsz", reinterpret_cast<void*>(&cuMemFreeAsync_ptsz)},
    {"cuMemCreate", reinterpret_cast<void*>(&cuMemCreate)},
    {"cuMemRelease", reinterpret_cast<void*>(&cuMemRelease)},
    {"cuMemGetInfo_v2", reinterpret_cast<void*>(&cuMemGetInfo_v2)},
    {"cuArrayCreate_v2", reinterpret_cast<void*>(&cuArrayCreate_v2)},
    {"cuArray3DCreate_v2", reinterpret_cast<void*>(&cuArray3DCreate_v2)},
    {"cuMipmappedArrayCreate", reinterpret_cast<void*>(&cuMipmappedArrayCreate)},
    {"cuArrayDestroy", reinterpret_cast<void*>(&cuArrayDestroy)},
    {"cuMipmappedArrayDestroy", reinterpret_cast<void*>(&cuMipmappedArrayDestroy)},
    {"cuDevicePrimaryCtxRetain", reinterpret_cast<void*>(&cuDevicePrimaryCtxRetain)},
    {"cuCtxCreate_v2", reinterpret_cast<void*>(&cuCtxCreate_v2)},
    {"cuCtxCreate_v3", reinterpret_cast<void*>(&cuCtxCreate_v3)},
    {"cuCtxCreate_v4", reinterpret_cast<void*>(&cuCtxCreate_v4)},
    {"cuInit", reinterpret_cast<void*>(&cuInit)},
    // The lookups themselves: the runtime finds cuGetProcAddress_v2 with dlsym, then asks it for
    // everything, "cuGetProcAddress" included.
    {"cuGetProcAddress", reinterpret_cast<void*>(&cuGetProcAddress)},
    {"cuGetProcAddress_v2", reinterpret_cast<void*>(&cuGetProcAddress_v2)},
    // NVML's memory figures, for a program that finds them with dlsym (pynvml, through ctypes).
    {"nvmlDeviceGetMemoryInfo", reinterpret_cast<void*>(&nvmlDeviceGetMemoryInfo)},
    {"nvmlDeviceGetMemoryInfo_v2", reinterpret_cast<void*>(&nvmlDeviceGetMemoryInfo_v2)},
};

bool driver_name(const char* name) {
  return name && ((name[0] == 'c' && name[1] == 'u') || std::strncmp(name, "nvmlDeviceGetMemoryInfo", 23) == 0);
}

void* ours_by_name(const char* name) {
  for (const auto& e : table)
    if (std::strcmp(e.name, name) == 0) return e.ours;
  return nullptr;
}

// The driver handed out `fn`: ours instead if it is one of the functions above, in whichever
// version or variant the caller asked for (matched by address, so an older version we do not
// wrap is left alone).
void swap_in(void** pfn) {
  if (!pfn || !*pfn) return;
  for (const auto& e : table)
    if (driver(e.name) == *pfn) {
      *pfn = e.ours;
      return;
    }
}

}  // namespace

extern "C" {

CUresult cuGetProcAddress(const char* symbol, void** pfn, int version, std::uint64_t flags) {
  if (frozen.load()) return refused_in_zygote("cuGetProcAddress");
  static auto f = real<CUresult (*)(const char*, void**, int, std::uint64_t)>("cuGetProcAddress");
  if (!f) return not_found;
  const CUresult rc = f(symbol, pfn, version, flags);
  if (rc == success) swap_in(pfn);
  return rc;
}

CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version, std::uint64_t flags, void* status) {
  if (frozen.load()) return refused_in_zygote("cuGetProcAddress_v2");
  static auto f = real<CUresult (*)(const char*, void**, int, std::uint64_t, void*)>("cuGetProcAddress_v2");
  if (!f) return not_found;
  const CUresult rc = f(symbol, pfn, version, flags, status);
  if (rc == success) swap_in(pfn);
  return rc;
}

// dlsym on a libcuda handle for one of these names gets ours: the CUDA runtime finds
// cuGetProcAddress that way. (glibc declares `name` nonnull; a caller that passes null anyway
// gets the C library's answer, hence the check in a function of its own.)
void* dlsym(void* handle, const char* name) {
  if (driver_name(name))
    if (void* ours = ours_by_name(name); ours && real_dlsym()(handle, name)) return ours;
  return real_dlsym()(handle, name);
}

}  // extern "C"

// ---- A deferred process's call: its region pinned before the call's code runs ---------------------
// A standby interpreter learns its call's region when the call comes (the worker sets the
// variables): the worker calls this right after, before any code of the call runs, so the
// region is pinned then, not at the first CUDA call. Until then the function's code could point
// the variables at terms of its own, and its children would get no region to hand on.
// @return 0 once the region is bound, -1 if this process is capped but cannot reach it (its
//         allocations are refused, saying why).
extern "C" __attribute__((visibility("default"))) int isorun_cap_bind() {
  pin_unset();
  account& a = acct();
  std::lock_guard lock(a.mutex);
  if (a.deferred) a.bind();
  return a.ledger && a.slot && a.refusal.empty() ? 0 : -1;
}

// ---- A zygote's child: CUDA allowed once its environment is its call's -------------------------
// A zygote (an interpreter that forks each worker) refuses every CUDA call; each forked child
// calls this once its environment is its call's (its GPU, the deferred cap of a capped call,
// the zygote's variable gone), before any code of the call runs. `capped`: the child stays
// within the deferred cap the zygote was launched with and binds its call's region as a standby
// interpreter does; 0: its call has no cap, and the library steps aside (nothing charged or
// refused, nothing handed on to the programs it starts).
extern "C" __attribute__((visibility("default"))) void isorun_cap_thaw(int capped) {
  if (!capped) uncapped = true;
  frozen = false;
}

// ---- Starting programs: the cap goes with them --------------------------------------------------
// Every exec*(), posix_spawn*() and pidfd_spawn*() of the C library, so a child started with a clean or edited
// environment (subprocess with env=..., `env -i`) is capped too (with_cap_env). The C library's
// own internal starts (system(), popen()) pass the caller's environment as it is.
extern "C" {

int execve(const char* path, char* const argv[], char* const envp[]) {
  return with_cap_env(envp, [&](char* const* env) { return loaded.execve(path, argv, env); });
}

int execvpe(const char* file, char* const argv[], char* const envp[]) {
  return with_cap_env(envp, [&](char* const* env) { return loaded.execvpe(file, argv, env); });
}

int execveat(int dirfd, const char* path, char* const argv[], char* const envp[], int flags) {
  if (!loaded.execveat) {  // a C library without it: as if it were not there
    errno = ENOSYS;
    return -1;
  }
  return with_cap_env(envp, [&](char* const* env) { return loaded.execveat(dirfd, path, argv, env, flags); });
}

int fexecve(int fd, char* const argv[], char* const envp[]) {
  return with_cap_env(envp, [&](char* const* env) { return loaded.fexecve(fd, argv, env); });
}

int execv(const char* path, char* const argv[]) { return execve(path, argv, environ); }

int execvp(const char* file, char* const argv[]) { return execvpe(file, argv, environ); }

int posix_spawn(pid_t* pid, const char* path, const posix_spawn_file_actions_t* actions, const posix_spawnattr_t* attr,
                char* const argv[], char* const envp[]) {
  return with_cap_env(envp, [&](char* const* env) { return loaded.posix_spawn(pid, path, actions, attr, argv, env); });
}

int posix_spawnp(pid_t* pid, const char* file, const posix_spawn_file_actions_t* actions, const posix_spawnattr_t* attr,
                 char* const argv[], char* const envp[]) {
  return with_cap_env(envp, [&](char* const* env) { return loaded.posix_spawnp(pid, file, actions, attr, argv, env); });
}

// glibc 2.39's posix_spawn that returns a pidfd (Python 3.13's subprocess may use it). On an older
// C library the program that calls it could not have loaded: answered as it would be there.
int pidfd_spawn(int* pidfd, const char* path, const posix_spawn_file_actions_t* actions, const posix_spawnattr_t* attr,
                char* const argv[], char* const envp[]) {
  if (!loaded.pidfd_spawn) return ENOSYS;  // (an error number, as posix_spawn returns its errors)
  return with_cap_env(envp,
                      [&](char* const* env) { return loaded.pidfd_spawn(pidfd, path, actions, attr, argv, env); });
}

int pidfd_spawnp(int* pidfd, const char* file, const posix_spawn_file_actions_t* actions, const posix_spawnattr_t* attr,
                 char* const argv[], char* const envp[]) {
  if (!loaded.pidfd_spawnp) return ENOSYS;
  return with_cap_env(envp,
                      [&](char* const* env) { return loaded.pidfd_spawnp(pidfd, file, actions, attr, argv, env); });
}

}  // extern "C"

// The execl family: the arguments gathered on this stack (they may run in a vfork child), then
// the vector forms above. `with_env`: execle's environment follows the arguments' null.
#define ISORUN_GATHER_ARGS(first, with_env)                            \
  va_list count;                                                       \
  va_start(count, first);                                              \
  std::size_t n = 1;                                                   \
  while (va_arg(count, char*)) ++n;                                    \
  va_end(count);                                                       \
  auto** argv = static_cast<char**>(alloca((n + 1) * sizeof(char*)));  \
  argv[0] = const_cast<char*>(first);                                  \
  va_list args;                                                        \
  va_start(args, first);                                               \
  for (std::size_t i = 1; i <= n; ++i) argv[i] = va_arg(args, char*);  \
  char* const* envp = with_env ? va_arg(args, char* const*) : environ; \
  va_end(args)

extern "C" {

int execl(const char* path, const char* arg, ...) {
  ISORUN_GATHER_ARGS(arg, false);
  return execve(path, argv, envp);
}

int execlp(const char* file, const char* arg, ...) {
  ISORUN_GATHER_ARGS(arg, false);
  return execvpe(file, argv, envp);
}

int execle(const char* path, const char* arg, ...) {
  ISORUN_GATHER_ARGS(arg, true);
  return execve(path, argv, envp);
}

}  // extern "C"
