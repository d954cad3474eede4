// A stand-in libcuda.so.1 for testing the `-- CMD` memory cap without a GPU: the handful of
// driver functions the cap interposes and a test program calls, cuGetProcAddress included.
// "Device memory" is address space the host cannot touch (PROT_NONE), 16 GiB of it on each of
// 8 devices; a context is its device's primary one, and allocations land on the current
// context's device (or, for cuMemCreate, the one its properties name).
#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>

namespace {
using CUresult = int;
using CUdeviceptr = unsigned long long;
constexpr std::uint64_t total = 16ULL << 30;
constexpr int devices = 8;
std::mutex mutex;
struct held {
  int device;
  std::size_t bytes;
};
std::map<CUdeviceptr, held> live;
std::map<unsigned long long, held> handles;
std::uint64_t used[devices] = {};
unsigned long long next_handle = 1;
constexpr CUresult invalid_context = 201;      // CUDA_ERROR_INVALID_CONTEXT
constexpr CUresult invalid_device = 101;       // CUDA_ERROR_INVALID_DEVICE
thread_local void* current_context = nullptr;  // device + 1, as a pointer

int current_device() { return static_cast<int>(reinterpret_cast<std::uintptr_t>(current_context)) - 1; }

// Stream-ordered pools, as the driver keeps them: memory freed into a pool stays reserved on
// its device until the pool releases it (at a synchronization, down to its release threshold)
// or is trimmed. A pool is its index + 1 as a pointer; pools 1..8 are the devices' defaults.
struct pool {
  int device;
  std::uint64_t reserved = 0, in_use = 0, threshold = 0;
};
std::map<std::uintptr_t, pool> pools;
std::map<CUdeviceptr, std::pair<std::uintptr_t, std::size_t>> pooled;  // pointer -> pool, bytes
std::uintptr_t next_pool = devices + 1;
CUdeviceptr next_address = 1ULL << 44;  // pool memory: addresses only, as on the device

pool& pool_of(std::uintptr_t p) {  // under mutex
  if (p >= 1 && p <= static_cast<std::uintptr_t>(devices)) pools.try_emplace(p, pool{static_cast<int>(p) - 1});
  return pools.at(p);
}
CUresult pool_allocate(CUdeviceptr* p, std::size_t n, std::uintptr_t handle) {
  std::lock_guard lock(mutex);
  if (!pools.count(handle) && !(handle >= 1 && handle <= static_cast<std::uintptr_t>(devices))) return 1;
  pool& pl = pool_of(handle);
  const std::uint64_t spare = pl.reserved - pl.in_use;
  if (n > spare) {  // the pool grows by what it lacks
    if (used[pl.device] + (n - spare) > total) return 2;
    used[pl.device] += n - spare;
    pl.reserved += n - spare;
  }
  pl.in_use += n;
  *p = next_address;
  next_address += n ? n : 1;
  pooled[*p] = {handle, n};
  return 0;
}
void release_to(pool& pl, std::uint64_t keep) {  // under mutex
  const std::uint64_t floor = std::max(keep, pl.in_use);
  if (pl.reserved > floor) {
    used[pl.device] -= pl.reserved - floor;
    pl.reserved = floor;
  }
}

CUresult allocate(CUdeviceptr* p, std::size_t n) {
  if (!current_context) return invalid_context;
  const int d = current_device();
  std::lock_guard lock(mutex);
  if (used[d] + n > total) return 2;
  void* m = ::mmap(nullptr, n ? n : 1, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return 2;
  *p = reinterpret_cast<CUdeviceptr>(m);
  live[*p] = {d, n};
  used[d] += n;
  return 0;
}
}  // namespace

extern "C" {
CUresult cuInit(unsigned) { return 0; }
CUresult cuDeviceGet(int* d, int ordinal) {
  if (ordinal < 0 || ordinal >= devices) return invalid_device;
  *d = ordinal;
  return 0;
}
CUresult cuDevicePrimaryCtxRetain(void** ctx, int d) {
  if (d < 0 || d >= devices) return invalid_device;
  *ctx = reinterpret_cast<void*>(static_cast<std::uintptr_t>(d) + 1);
  return 0;
}
// A context of its own on device d, made current, as the real driver does.
CUresult cuCtxCreate_v2(void** ctx, unsigned, int d) {
  if (d < 0 || d >= devices) return invalid_device;
  *ctx = reinterpret_cast<void*>(static_cast<std::uintptr_t>(d) + 1);
  current_context = *ctx;
  return 0;
}
// As the real driver: allocations need a context current on the calling thread.
CUresult cuCtxSetCurrent(void* ctx) {
  current_context = ctx;
  return 0;
}
CUresult cuCtxGetDevice(int* d) {
  if (!current_context) return invalid_context;
  *d = current_device();
  return 0;
}
CUresult cuMemAlloc_v2(CUdeviceptr* p, std::size_t n) { return allocate(p, n); }
CUresult cuDeviceGetMemPool(void** out, int d) {
  if (d < 0 || d >= devices) return invalid_device;
  *out = reinterpret_cast<void*>(static_cast<std::uintptr_t>(d) + 1);
  return 0;
}
// CUmemPoolProps begins: allocation type, handle types, location {type, id}.
CUresult cuMemPoolCreate(void** out, const int* props) {
  const int d = props && props[2] == 1 ? props[3] : 0;
  if (d < 0 || d >= devices) return invalid_device;
  std::lock_guard lock(mutex);
  pools[next_pool] = pool{d};
  *out = reinterpret_cast<void*>(next_pool++);
  return 0;
}
CUresult cuMemPoolDestroy(void* handle) {
  std::lock_guard lock(mutex);
  auto it = pools.find(reinterpret_cast<std::uintptr_t>(handle));
  if (it == pools.end()) return 1;
  used[it->second.device] -= it->second.reserved;
  pools.erase(it);
  return 0;
}
CUresult cuMemAllocAsync(CUdeviceptr* p, std::size_t n, void*) {
  if (!current_context) return invalid_context;
  return pool_allocate(p, n, static_cast<std::uintptr_t>(current_device()) + 1);
}
CUresult cuMemAllocFromPoolAsync(CUdeviceptr* p, std::size_t n, void* handle, void*) {
  return pool_allocate(p, n, reinterpret_cast<std::uintptr_t>(handle));
}
CUresult cuMemFreeAsync(CUdeviceptr p, void*) {
  std::lock_guard lock(mutex);
  auto it = pooled.find(p);
  if (it == pooled.end()) return 1;
  pool_of(it->second.first).in_use -= it->second.second;  // back into the pool, still reserved
  pooled.erase(it);
  return 0;
}
// A synchronization: every pool gives back what it holds beyond its release threshold.
CUresult cuStreamSynchronize(void*) {
  std::lock_guard lock(mutex);
  for (auto& [handle, pl] : pools) release_to(pl, pl.threshold);
  return 0;
}
CUresult cuMemPoolTrimTo(void* handle, std::size_t keep) {
  std::lock_guard lock(mutex);
  if (!pools.count(reinterpret_cast<std::uintptr_t>(handle))) return 1;
  release_to(pool_of(reinterpret_cast<std::uintptr_t>(handle)), keep);
  return 0;
}
// CUmemPool_attribute: 4 release threshold, 5 reserved memory now, 7 used memory now.
CUresult cuMemPoolSetAttribute(void* handle, int attr, void* value) {
  std::lock_guard lock(mutex);
  if (attr != 4 || !pools.count(reinterpret_cast<std::uintptr_t>(handle))) return 1;
  pool_of(reinterpret_cast<std::uintptr_t>(handle)).threshold = *static_cast<std::uint64_t*>(value);
  return 0;
}
CUresult cuMemPoolGetAttribute(void* handle, int attr, void* value) {
  std::lock_guard lock(mutex);
  const auto h = reinterpret_cast<std::uintptr_t>(handle);
  if (!pools.count(h) && !(h >= 1 && h <= static_cast<std::uintptr_t>(devices))) return 1;
  const pool& pl = pool_of(h);
  auto* out = static_cast<std::uint64_t*>(value);
  if (attr == 4) *out = pl.threshold;
  else if (attr == 5) *out = pl.reserved;
  else if (attr == 7) *out = pl.in_use;
  else return 1;
  return 0;
}
CUresult cuMemAllocManaged(CUdeviceptr* p, std::size_t n, unsigned) { return allocate(p, n); }
CUresult cuMemFree_v2(CUdeviceptr p) {
  std::lock_guard lock(mutex);
  auto it = live.find(p);
  if (it == live.end()) return 1;  // CUDA_ERROR_INVALID_VALUE
  ::munmap(reinterpret_cast<void*>(p), it->second.bytes ? it->second.bytes : 1);
  used[it->second.device] -= it->second.bytes;
  live.erase(it);
  return 0;
}
// CUmemAllocationProp begins: type, requested handle types, location {type, id}.
CUresult cuMemCreate(unsigned long long* h, std::size_t n, const void* prop, unsigned long long) {
  const int* fields = static_cast<const int*>(prop);
  const int d = fields && fields[2] == 1 ? fields[3] : 0;
  if (d < 0 || d >= devices) return invalid_device;
  std::lock_guard lock(mutex);
  if (used[d] + n > total) return 2;
  *h = next_handle++;
  handles[*h] = {d, n};
  used[d] += n;
  return 0;
}
// Sharing, as NCCL and CUDA IPC do: an imported handle or an opened IPC pointer refers to memory
// another handle (or process) already holds; it adds nothing on the device. (The "shareable
// handle" here is the exporting handle's number, standing in for a file descriptor.)
std::map<unsigned long long, unsigned long long> imported;  // handle -> the handle it refers to
CUresult cuMemExportToShareableHandle(void* out, unsigned long long h, int, unsigned long long) {
  std::lock_guard lock(mutex);
  if (!handles.count(h)) return 1;
  *static_cast<unsigned long long*>(out) = h;
  return 0;
}
CUresult cuMemImportFromShareableHandle(unsigned long long* h, void* shared, int) {
  std::lock_guard lock(mutex);
  const auto of = reinterpret_cast<unsigned long long>(shared);
  if (!handles.count(of)) return 1;
  *h = next_handle++;
  imported[*h] = of;
  return 0;
}
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* p, const void*, unsigned) {
  *p = next_address;
  next_address += 1 << 20;
  return 0;
}
CUresult cuIpcCloseMemHandle(CUdeviceptr) { return 0; }
CUresult cuMemRelease(unsigned long long h) {
  std::lock_guard lock(mutex);
  if (imported.erase(h)) return 0;
  auto it = handles.find(h);
  if (it == handles.end()) return 1;
  used[it->second.device] -= it->second.bytes;
  handles.erase(it);
  return 0;
}
// CUDA arrays: charged here as the cap charges them (texels x element bytes; the caller passes
// only the 32-bit float format), held as handles.
struct array_descriptor {
  std::size_t width, height, depth;
  int format;
  unsigned channels, flags;
};
CUresult create_array(void** array, std::size_t bytes) {
  if (!current_context) return invalid_context;
  const int d = current_device();
  std::lock_guard lock(mutex);
  if (used[d] + bytes > total) return 2;
  *array = reinterpret_cast<void*>(static_cast<std::uintptr_t>(next_handle));
  handles[next_handle++] = {d, bytes};
  used[d] += bytes;
  return 0;
}
std::size_t texels(std::size_t w, std::size_t h, std::size_t z) { return (w ? w : 1) * (h ? h : 1) * (z ? z : 1); }
CUresult cuArrayCreate_v2(void** array, const array_descriptor* d) {  // CUDA_ARRAY_DESCRIPTOR: w, h, format, channels
  const auto* f = reinterpret_cast<const std::size_t*>(d);
  const auto* tail = reinterpret_cast<const unsigned*>(f + 2);
  return create_array(array, texels(f[0], f[1], 1) * 4 * tail[1]);
}
CUresult cuArray3DCreate_v2(void** array, const array_descriptor* d) {
  return create_array(array, texels(d->width, d->height, d->depth) * 4 * d->channels);
}
CUresult cuMipmappedArrayCreate(void** array, const array_descriptor* d, unsigned levels) {
  std::size_t bytes = 0, w = d->width, h = d->height, z = d->depth;
  for (unsigned l = 0; l<levels; ++l, w = w> 1 ? w / 2 : 1, h = h > 1 ? h / 2 : 1, z = z > 1 ? z / 2 : 1)
    bytes += texels(w, h, z) * 4 * d->channels;
  return create_array(array, bytes);
}
CUresult cuArrayDestroy(void* array) { return cuMemRelease(reinterpret_cast<std::uintptr_t>(array)); }
CUresult cuMipmappedArrayDestroy(void* array) { return cuArrayDestroy(array); }
CUresult cuMemGetInfo_v2(std::size_t* free, std::size_t* tot) {
  if (!current_context) return invalid_context;
  std::lock_guard lock(mutex);
  *free = total - used[current_device()];
  *tot = total;
  return 0;
}
CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version, unsigned long long, void*);
CUresult cuGetProcAddress(const char* symbol, void** pfn, int version, unsigned long long flags) {
  return cuGetProcAddress_v2(symbol, pfn, version, flags, nullptr);
}
// Base names, as the runtime asks for them, to this driver's versioned functions.
CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int, unsigned long long, void*) {
  struct entry {
    const char* name;
    void* fn;
  };
  static const entry table[] = {
      {"cuInit", reinterpret_cast<void*>(&cuInit)},
      {"cuDeviceGet", reinterpret_cast<void*>(&cuDeviceGet)},
      {"cuDevicePrimaryCtxRetain", reinterpret_cast<void*>(&cuDevicePrimaryCtxRetain)},
      {"cuCtxCreate", reinterpret_cast<void*>(&cuCtxCreate_v2)},
      {"cuCtxSetCurrent", reinterpret_cast<void*>(&cuCtxSetCurrent)},
      {"cuCtxGetDevice", reinterpret_cast<void*>(&cuCtxGetDevice)},
      {"cuMemAlloc", reinterpret_cast<void*>(&cuMemAlloc_v2)},
      {"cuMemAllocManaged", reinterpret_cast<void*>(&cuMemAllocManaged)},
      {"cuMemFree", reinterpret_cast<void*>(&cuMemFree_v2)},
      {"cuMemCreate", reinterpret_cast<void*>(&cuMemCreate)},
      {"cuMemRelease", reinterpret_cast<void*>(&cuMemRelease)},
      {"cuMemGetInfo", reinterpret_cast<void*>(&cuMemGetInfo_v2)},
      {"cuArrayCreate", reinterpret_cast<void*>(&cuArrayCreate_v2)},
      {"cuArray3DCreate", reinterpret_cast<void*>(&cuArray3DCreate_v2)},
      {"cuArrayDestroy", reinterpret_cast<void*>(&cuArrayDestroy)},
      {"cuMipmappedArrayCreate", reinterpret_cast<void*>(&cuMipmappedArrayCreate)},
      {"cuMipmappedArrayDestroy", reinterpret_cast<void*>(&cuMipmappedArrayDestroy)},
      {"cuMemExportToShareableHandle", reinterpret_cast<void*>(&cuMemExportToShareableHandle)},
      {"cuMemImportFromShareableHandle", reinterpret_cast<void*>(&cuMemImportFromShareableHandle)},
      {"cuIpcOpenMemHandle", reinterpret_cast<void*>(&cuIpcOpenMemHandle_v2)},
      {"cuIpcCloseMemHandle", reinterpret_cast<void*>(&cuIpcCloseMemHandle)},
      {"cuDeviceGetMemPool", reinterpret_cast<void*>(&cuDeviceGetMemPool)},
      {"cuMemPoolCreate", reinterpret_cast<void*>(&cuMemPoolCreate)},
      {"cuMemPoolDestroy", reinterpret_cast<void*>(&cuMemPoolDestroy)},
      {"cuMemAllocAsync", reinterpret_cast<void*>(&cuMemAllocAsync)},
      {"cuMemAllocFromPoolAsync", reinterpret_cast<void*>(&cuMemAllocFromPoolAsync)},
      {"cuMemFreeAsync", reinterpret_cast<void*>(&cuMemFreeAsync)},
      {"cuStreamSynchronize", reinterpret_cast<void*>(&cuStreamSynchronize)},
      {"cuMemPoolTrimTo", reinterpret_cast<void*>(&cuMemPoolTrimTo)},
      {"cuMemPoolSetAttribute", reinterpret_cast<void*>(&cuMemPoolSetAttribute)},
      {"cuMemPoolGetAttribute", reinterpret_cast<void*>(&cuMemPoolGetAttribute)},
      {"cuGetProcAddress", reinterpret_cast<void*>(&cuGetProcAddress_v2)},
  };
  for (const auto& e : table)
    if (std::strcmp(e.name, symbol) == 0) {
      *pfn = e.fn;
      return 0;
    }
  *pfn = nullptr;
  return 500;  // CUDA_ERROR_NOT_FOUND
}
}
