// libisorun_cuda_cap.so: preloaded into a `-- CMD` command under --mem-limit, it enforces the
// cap on the CUDA driver API. Every allocation entry point (cuMemAlloc_v2, cuMemAllocPitch_v2,
// cuMemAllocManaged, cuMemAllocAsync, cuMemAllocFromPoolAsync and their per-thread-stream
// variants, cuMemCreate) first reserves its bytes in the region the supervisor shares with all
// of the command's processes (cap_region.hpp), on the device it allocates on (the current
// context's, or the one cuMemCreate names: the cap is per device), and gives
// CUDA_ERROR_OUT_OF_MEMORY when the cap would be exceeded; frees give the bytes back;
// cuMemGetInfo_v2 reports the cap as the total and what is left of it on the current device as
// free, so frameworks size their pools to it.
//
// Programs reach the driver three ways, and all three lead here: by linking libcuda (the
// exported names below win over libcuda's by LD_PRELOAD), by dlsym on a libcuda handle (dlsym is
// interposed for these names), and through cuGetProcAddress / cuGetProcAddress_v2, which the
// CUDA runtime uses for everything (the pointers it hands out for these functions are swapped
// for ours). Without ISORUN_CAP_REGION, or if the region cannot be opened, nothing is charged.
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "isorun/preload/cap_region.hpp"

namespace {

using CUresult = int;
using CUdeviceptr = unsigned long long;
using handle_t = unsigned long long;  // CUmemGenericAllocationHandle
constexpr CUresult success = 0;
constexpr CUresult out_of_memory = 2;  // CUDA_ERROR_OUT_OF_MEMORY
constexpr CUresult not_found = 500;    // CUDA_ERROR_NOT_FOUND

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

// The device an allocation lands on: the current context's (its CUDA ordinal in this process),
// 0 when there is none (the driver then refuses the allocation anyway).
std::size_t current_device() {
  static auto get = real<CUresult (*)(int*)>("cuCtxGetDevice");
  int device = 0;
  if (!get || get(&device) != success) device = 0;
  return isorun::preload::ledger_of(device);
}

// What one allocation holds: on which device, how many bytes.
struct holding {
  std::size_t device = 0;
  std::uint64_t bytes = 0;
};

// This process's share of the cap, and what it holds.
struct account {
  isorun::preload::cap_region* region = nullptr;
  isorun::preload::process_slot* slot = nullptr;
  std::mutex mutex;
  std::unordered_map<CUdeviceptr, holding> pointers;
  std::unordered_map<handle_t, holding> handles;
  bool context_counted[isorun::preload::max_devices] = {};

  account() {
    const char* path = std::getenv(isorun::preload::region_env);
    if (!path) return;
    const int fd = ::open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return;
    void* p = ::mmap(nullptr, sizeof(isorun::preload::cap_region), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) return;
    auto* r = static_cast<isorun::preload::cap_region*>(p);
    if (r->magic != isorun::preload::region_magic) return;
    slot = r->claim(static_cast<std::int32_t>(::getpid()));
    if (slot) region = r;
  }
  // After fork() the child is another process: its own slot, nothing held yet (CUDA cannot be
  // used in a forked child of a CUDA process anyway).
  void forked() {
    pointers.clear();
    handles.clear();
    for (bool& c : context_counted) c = false;
    slot = region ? region->claim(static_cast<std::int32_t>(::getpid())) : nullptr;
    if (!slot) region = nullptr;
  }
  [[nodiscard]] bool capped() const { return region != nullptr; }
  bool reserve(const holding& h) { return !capped() || region->reserve(*slot, h.device, h.bytes); }
  void give_back(const holding& h) {
    if (capped()) region->release(*slot, h.device, h.bytes);
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

// One allocation on the current device: reserve, call the driver, keep or give back.
template <class Call>
CUresult charged(std::uint64_t bytes, CUdeviceptr* dptr, Call&& call) {
  auto& a = acct();
  const holding h{a.capped() ? current_device() : 0, bytes};
  if (!a.reserve(h)) return out_of_memory;
  const CUresult rc = call();
  if (rc != success || !dptr) {
    a.give_back(h);
    return rc;
  }
  remember(a.pointers, *dptr, h);
  return rc;
}

// After the driver freed `dptr` (rc == success): its bytes go back to the cap.
CUresult freed(CUresult rc, CUdeviceptr dptr) {
  if (rc == success) forget(acct().pointers, dptr);
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
  static auto f = real<CUresult (*)(CUdeviceptr*, std::size_t*, std::size_t, std::size_t, unsigned)>("cuMemAllocPitch_v2");
  if (!f) return not_found;
  // The pitch is known only afterwards: reserve with rows padded to 512 bytes, the usual
  // alignment, and charge any difference once it is known.
  const std::uint64_t guess = ((width + 511) / 512 * 512) * height;
  const CUresult rc = charged(guess, dptr, [&] { return f(dptr, pitch, width, height, element); });
  if (rc == success && pitch && *pitch * height != guess) {
    auto& a = acct();
    const std::uint64_t actual = *pitch * height;
    const std::size_t device = a.capped() ? current_device() : 0;
    if (a.capped()) {
      if (actual > guess) a.region->charge(*a.slot, device, actual - guess);
      else a.give_back({device, guess - actual});
    }
    remember(a.pointers, *dptr, holding{device, actual});
  }
  return rc;
}

CUresult cuMemAllocAsync(CUdeviceptr* dptr, std::size_t bytes, void* stream) {
  static auto f = real<CUresult (*)(CUdeviceptr*, std::size_t, void*)>("cuMemAllocAsync");
  if (!f) return not_found;
  return charged(bytes, dptr, [&] { return f(dptr, bytes, stream); });
}

CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, std::size_t bytes, void* stream) {
  static auto f = real<CUresult (*)(CUdeviceptr*, std::size_t, void*)>("cuMemAllocAsync_ptsz");
  if (!f) return not_found;
  return charged(bytes, dptr, [&] { return f(dptr, bytes, stream); });
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, std::size_t bytes, void* pool, void* stream) {
  static auto f = real<CUresult (*)(CUdeviceptr*, std::size_t, void*, void*)>("cuMemAllocFromPoolAsync");
  if (!f) return not_found;
  return charged(bytes, dptr, [&] { return f(dptr, bytes, pool, stream); });
}

CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, std::size_t bytes, void* pool, void* stream) {
  static auto f = real<CUresult (*)(CUdeviceptr*, std::size_t, void*, void*)>("cuMemAllocFromPoolAsync_ptsz");
  if (!f) return not_found;
  return charged(bytes, dptr, [&] { return f(dptr, bytes, pool, stream); });
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
  const std::size_t device = !a.capped() ? 0
                             : head && head->location_type == 1 ? isorun::preload::ledger_of(head->location_id)
                                                                 : current_device();
  const holding h{device, bytes};
  if (!a.reserve(h)) return out_of_memory;
  const CUresult rc = f(handle, bytes, prop, flags);
  if (rc != success) {
    a.give_back(h);
    return rc;
  }
  remember(a.handles, *handle, h);
  return rc;
}

CUresult cuMemRelease(handle_t handle) {
  static auto f = real<CUresult (*)(handle_t)>("cuMemRelease");
  if (!f) return not_found;
  const CUresult rc = f(handle);
  if (rc == success) forget(acct().handles, handle);
  return rc;
}

CUresult cuMemGetInfo_v2(std::size_t* free, std::size_t* total) {
  static auto f = real<CUresult (*)(std::size_t*, std::size_t*)>("cuMemGetInfo_v2");
  if (!f) return not_found;
  const CUresult rc = f(free, total);
  auto& a = acct();
  if (rc != success || !a.capped()) return rc;
  const std::uint64_t limit = a.region->limit, used = a.region->devices[current_device()].used.load();
  const std::uint64_t left = used >= limit ? 0 : limit - used;
  if (total && *total > limit) *total = limit;
  if (free && *free > left) *free = left;
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
  struct info { unsigned pid; unsigned long long used; unsigned gi, ci; };
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

CUresult cuDevicePrimaryCtxRetain(void** ctx, int device) {
  static auto f = real<CUresult (*)(void**, int)>("cuDevicePrimaryCtxRetain");
  if (!f) return not_found;
  const CUresult rc = f(ctx, device);
  auto& a = acct();
  if (rc == success && a.capped()) {
    const std::size_t d = isorun::preload::ledger_of(device);
    std::lock_guard lock(a.mutex);
    if (!a.context_counted[d]) {
      a.context_counted[d] = true;
      ++a.region->contexts;
      // Counted even past the cap: it exists.
      if (const std::uint64_t bytes = context_bytes(device)) a.region->charge(*a.slot, d, bytes);
    }
  }
  return rc;
}

CUresult cuGetProcAddress(const char* symbol, void** pfn, int version, std::uint64_t flags);
CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version, std::uint64_t flags, void* status);

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
    {"cuMemFreeAsync_ptsz", reinterpret_cast<void*>(&cuMemFreeAsync_ptsz)},
    {"cuMemCreate", reinterpret_cast<void*>(&cuMemCreate)},
    {"cuMemRelease", reinterpret_cast<void*>(&cuMemRelease)},
    {"cuMemGetInfo_v2", reinterpret_cast<void*>(&cuMemGetInfo_v2)},
    {"cuDevicePrimaryCtxRetain", reinterpret_cast<void*>(&cuDevicePrimaryCtxRetain)},
    // The lookups themselves: the runtime finds cuGetProcAddress_v2 with dlsym, then asks it for
    // everything, "cuGetProcAddress" included.
    {"cuGetProcAddress", reinterpret_cast<void*>(&cuGetProcAddress)},
    {"cuGetProcAddress_v2", reinterpret_cast<void*>(&cuGetProcAddress_v2)},
};

bool driver_name(const char* name) { return name && name[0] == 'c' && name[1] == 'u'; }

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
  static auto f = real<CUresult (*)(const char*, void**, int, std::uint64_t)>("cuGetProcAddress");
  if (!f) return not_found;
  const CUresult rc = f(symbol, pfn, version, flags);
  if (rc == success) swap_in(pfn);
  return rc;
}

CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version, std::uint64_t flags, void* status) {
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
