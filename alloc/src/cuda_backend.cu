// The CUDA backend module (see cuda_backend.hpp). Compiled whenever nvcc is found; exercised by
// the `gpu`-labelled tests on a machine with a GPU.
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <unistd.h>

#include <stdexcept>

#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "isorun/alloc/backend.hpp"

namespace {
using namespace isorun::alloc;

template <class F>
F driver_entry(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status{};
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &status) != cudaSuccess ||
      status != cudaDriverEntryPointSuccess)
    return nullptr;
  return reinterpret_cast<F>(fn);
}

class cuda_backend final : public backend {
 public:
  explicit cuda_backend(int device) : device_{device} {
    check(cudaSetDevice(device), "cudaSetDevice");
    check(cudaFree(nullptr), "creating the CUDA context");
    reserve_ = driver_entry<decltype(&cuMemAddressReserve)>("cuMemAddressReserve");
    free_address_ = driver_entry<decltype(&cuMemAddressFree)>("cuMemAddressFree");
    create_ = driver_entry<decltype(&cuMemCreate)>("cuMemCreate");
    release_ = driver_entry<decltype(&cuMemRelease)>("cuMemRelease");
    map_ = driver_entry<decltype(&cuMemMap)>("cuMemMap");
    unmap_ = driver_entry<decltype(&cuMemUnmap)>("cuMemUnmap");
    set_access_ = driver_entry<decltype(&cuMemSetAccess)>("cuMemSetAccess");
    auto granularity = driver_entry<decltype(&cuMemGetAllocationGranularity)>("cuMemGetAllocationGranularity");
    prop_.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop_.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop_.location.id = device;
    if (granularity) granularity(&granularity_, &prop_, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (!granularity_) granularity_ = 2u << 20;
  }

  std::string name() const override { return "cuda"; }

  void* allocate(std::size_t bytes) override {
    void* p = nullptr;
    cudaError_t rc = cudaMalloc(&p, bytes);
    if (rc == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear the sticky-free error state
      return nullptr;
    }
    check(rc, "cudaMalloc");
    return p;
  }
  void deallocate(void* p, std::size_t) noexcept override { cudaFree(p); }

  memory_info device_memory() const override {
    std::size_t free = 0, total = 0;
    cudaMemGetInfo(&free, &total);
    return {free, total};
  }

  std::size_t granularity() const override { return granularity_; }

  void* reserve_address(std::size_t bytes) override {
    if (!reserve_) return nullptr;
    CUdeviceptr p = 0;
    return reserve_(&p, bytes, 0, 0, 0) == CUDA_SUCCESS ? reinterpret_cast<void*>(p) : nullptr;
  }
  void release_address(void* p, std::size_t bytes) noexcept override {
    if (free_address_) free_address_(reinterpret_cast<CUdeviceptr>(p), bytes);
  }

  bool map(void* p, std::size_t bytes) override {
    CUmemGenericAllocationHandle h{};
    if (!create_ || create_(&h, bytes, &prop_, 0) != CUDA_SUCCESS) return false;
    const auto at = reinterpret_cast<CUdeviceptr>(p);
    if (map_(at, bytes, 0, h, 0) != CUDA_SUCCESS) {
      release_(h);
      return false;
    }
    CUmemAccessDesc access{};
    access.location = prop_.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    set_access_(at, bytes, &access, 1);
    std::lock_guard lock(mutex_);
    handles_[at] = h;
    return true;
  }
  void unmap(void* p, std::size_t bytes) noexcept override {
    const auto at = reinterpret_cast<CUdeviceptr>(p);
    unmap_(at, bytes);
    std::lock_guard lock(mutex_);
    if (auto it = handles_.find(at); it != handles_.end()) {
      release_(it->second);
      handles_.erase(it);
    }
  }

  event_id record_event(stream_id stream) override {
    cudaEvent_t e{};
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventRecord(e, reinterpret_cast<cudaStream_t>(stream)), "cudaEventRecord");
    return reinterpret_cast<event_id>(e);
  }
  bool event_done(event_id event) override {
    auto e = reinterpret_cast<cudaEvent_t>(event);
    if (cudaEventQuery(e) == cudaErrorNotReady) return false;
    cudaEventDestroy(e);
    return true;
  }

  void fill(void* p, std::size_t bytes, std::uint8_t value, stream_id stream) override {
    check(cudaMemsetAsync(p, value, bytes, reinterpret_cast<cudaStream_t>(stream)), "cudaMemsetAsync");
  }

 private:
  static void check(cudaError_t rc, const char* what) {
    if (rc != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(rc));
  }
  int device_;
  std::size_t granularity_ = 0;
  CUmemAllocationProp prop_{};
  std::mutex mutex_;
  std::map<CUdeviceptr, CUmemGenericAllocationHandle> handles_;
  decltype(&cuMemAddressReserve) reserve_ = nullptr;
  decltype(&cuMemAddressFree) free_address_ = nullptr;
  decltype(&cuMemCreate) create_ = nullptr;
  decltype(&cuMemRelease) release_ = nullptr;
  decltype(&cuMemMap) map_ = nullptr;
  decltype(&cuMemUnmap) unmap_ = nullptr;
  decltype(&cuMemSetAccess) set_access_ = nullptr;
};

// NVML, for this process's own usage after context creation.
struct nvml_process_info {
  unsigned pid;
  unsigned long long used;
  unsigned gpu_instance, compute_instance;
};

struct pinned_pool {
  std::size_t cap, held = 0;
  std::mutex mutex;
  std::multimap<std::size_t, void*> idle;
  std::map<void*, std::size_t> sizes;
};

}  // namespace

extern "C" {

isorun::alloc::backend* isorun_cuda_backend_create(int device, char* error, std::size_t error_size) {
  try {
    return new cuda_backend(device);
  } catch (const std::exception& e) {
    if (error && error_size) std::snprintf(error, error_size, "%s", e.what());
    return nullptr;
  }
}

std::uint64_t isorun_cuda_context_bytes(int device) {
  void* lib = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return 0;
  using init_t = int (*)();
  using handle_t = int (*)(const char*, void**);
  using procs_t = int (*)(void*, unsigned*, nvml_process_info*);
  auto init = reinterpret_cast<init_t>(::dlsym(lib, "nvmlInit_v2"));
  auto by_uuid = reinterpret_cast<handle_t>(::dlsym(lib, "nvmlDeviceGetHandleByUUID"));
  auto procs = reinterpret_cast<procs_t>(::dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v3"));
  std::uint64_t used = 0;
  cudaDeviceProp prop{};
  if (init && by_uuid && procs && init() == 0 && cudaGetDeviceProperties(&prop, device) == cudaSuccess) {
    char uuid[64] = "GPU-";
    const auto* u = reinterpret_cast<const unsigned char*>(prop.uuid.bytes);
    std::snprintf(uuid + 4, sizeof uuid - 4, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0],
                  u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
    void* dev = nullptr;
    if (by_uuid(uuid, &dev) == 0) {
      std::vector<nvml_process_info> list(64);
      unsigned n = static_cast<unsigned>(list.size());
      if (procs(dev, &n, list.data()) == 0)
        for (unsigned i = 0; i < n; ++i)
          if (list[i].pid == static_cast<unsigned>(::getpid())) used = list[i].used;
    }
  }
  ::dlclose(lib);
  return used;
}

int isorun_cuda_host_register(void* p, std::size_t n) {
  return cudaHostRegister(p, n, cudaHostRegisterPortable) == cudaSuccess ? 0 : -1;
}

int isorun_cuda_host_unregister(void* p) { return cudaHostUnregister(p) == cudaSuccess ? 0 : -1; }

void* isorun_cuda_pinned_pool_create(std::size_t cap) { return new pinned_pool{cap}; }

void* isorun_cuda_pinned_alloc(void* pool_ptr, std::size_t n) {
  auto* pool = static_cast<pinned_pool*>(pool_ptr);
  std::lock_guard lock(pool->mutex);
  if (auto it = pool->idle.lower_bound(n); it != pool->idle.end()) {
    void* p = it->second;
    pool->idle.erase(it);
    return p;
  }
  if (pool->held + n > pool->cap) return nullptr;  // capped: the caller falls back to pageable
  void* p = nullptr;
  if (cudaHostAlloc(&p, n, cudaHostAllocPortable) != cudaSuccess) return nullptr;
  pool->held += n;
  pool->sizes[p] = n;
  return p;
}

void isorun_cuda_pinned_free(void* pool_ptr, void* p) {
  auto* pool = static_cast<pinned_pool*>(pool_ptr);
  std::lock_guard lock(pool->mutex);
  pool->idle.emplace(pool->sizes[p], p);
}

void isorun_cuda_pinned_pool_destroy(void* pool_ptr) {
  auto* pool = static_cast<pinned_pool*>(pool_ptr);
  for (auto& [p, n] : pool->sizes) cudaFreeHost(p);
  delete pool;
}

}  // extern "C"
