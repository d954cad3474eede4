// A stand-in libcuda.so.1 for testing the `-- CMD` memory cap without a GPU: the handful of
// driver functions the cap interposes and a test program calls, cuGetProcAddress included.
// "Device memory" is address space the host cannot touch (PROT_NONE), 16 GiB of it.
#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>

namespace {
using CUresult = int;
using CUdeviceptr = unsigned long long;
constexpr std::uint64_t total = 16ULL << 30;
std::mutex mutex;
std::map<CUdeviceptr, std::size_t> live;
std::map<unsigned long long, std::size_t> handles;
std::uint64_t used = 0;
unsigned long long next_handle = 1;

CUresult allocate(CUdeviceptr* p, std::size_t n) {
  std::lock_guard lock(mutex);
  if (used + n > total) return 2;
  void* m = ::mmap(nullptr, n ? n : 1, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return 2;
  *p = reinterpret_cast<CUdeviceptr>(m);
  live[*p] = n;
  used += n;
  return 0;
}
constexpr CUresult invalid_context = 201;  // CUDA_ERROR_INVALID_CONTEXT
thread_local void* current_context = nullptr;
}  // namespace

extern "C" {
CUresult cuInit(unsigned) { return 0; }
CUresult cuDeviceGet(int* d, int) { *d = 0; return 0; }
CUresult cuDevicePrimaryCtxRetain(void** ctx, int) { *ctx = reinterpret_cast<void*>(0x1); return 0; }
// As the real driver: allocations need a context current on the calling thread.
CUresult cuCtxSetCurrent(void* ctx) {
  current_context = ctx;
  return 0;
}
CUresult cuMemAlloc_v2(CUdeviceptr* p, std::size_t n) { return current_context ? allocate(p, n) : invalid_context; }
CUresult cuMemAllocManaged(CUdeviceptr* p, std::size_t n, unsigned) {
  return current_context ? allocate(p, n) : invalid_context;
}
CUresult cuMemFree_v2(CUdeviceptr p) {
  std::lock_guard lock(mutex);
  auto it = live.find(p);
  if (it == live.end()) return 1;  // CUDA_ERROR_INVALID_VALUE
  ::munmap(reinterpret_cast<void*>(p), it->second ? it->second : 1);
  used -= it->second;
  live.erase(it);
  return 0;
}
CUresult cuMemCreate(unsigned long long* h, std::size_t n, const void*, unsigned long long) {
  std::lock_guard lock(mutex);
  if (used + n > total) return 2;
  *h = next_handle++;
  handles[*h] = n;
  used += n;
  return 0;
}
CUresult cuMemRelease(unsigned long long h) {
  std::lock_guard lock(mutex);
  auto it = handles.find(h);
  if (it == handles.end()) return 1;
  used -= it->second;
  handles.erase(it);
  return 0;
}
CUresult cuMemGetInfo_v2(std::size_t* free, std::size_t* tot) {
  std::lock_guard lock(mutex);
  *free = total - used;
  *tot = total;
  return 0;
}
CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version, unsigned long long, void*);
CUresult cuGetProcAddress(const char* symbol, void** pfn, int version, unsigned long long flags) {
  return cuGetProcAddress_v2(symbol, pfn, version, flags, nullptr);
}
// Base names, as the runtime asks for them, to this driver's versioned functions.
CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int, unsigned long long, void*) {
  struct entry { const char* name; void* fn; };
  static const entry table[] = {
      {"cuInit", reinterpret_cast<void*>(&cuInit)},
      {"cuDeviceGet", reinterpret_cast<void*>(&cuDeviceGet)},
      {"cuDevicePrimaryCtxRetain", reinterpret_cast<void*>(&cuDevicePrimaryCtxRetain)},
      {"cuCtxSetCurrent", reinterpret_cast<void*>(&cuCtxSetCurrent)},
      {"cuMemAlloc", reinterpret_cast<void*>(&cuMemAlloc_v2)},
      {"cuMemAllocManaged", reinterpret_cast<void*>(&cuMemAllocManaged)},
      {"cuMemFree", reinterpret_cast<void*>(&cuMemFree_v2)},
      {"cuMemCreate", reinterpret_cast<void*>(&cuMemCreate)},
      {"cuMemRelease", reinterpret_cast<void*>(&cuMemRelease)},
      {"cuMemGetInfo", reinterpret_cast<void*>(&cuMemGetInfo_v2)},
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
