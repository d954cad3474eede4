// The CUDA backend module (see cuda_module.hpp). Compiled whenever nvcc is found; exercised by
// the `gpu`-labelled tests on a machine with a GPU.
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda_chunk_checksum.hpp"
#include "isorun/alloc/cuda_module.hpp"

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

void check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(rc));
}

// NVML, loaded at run time, for the context's cost as the device and as NVML's per-process
// accounting see it.
class nvml_probe {
 public:
  explicit nvml_probe(const char* uuid) {
    lib_ = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib_) return;
    auto init = reinterpret_cast<int (*)()>(::dlsym(lib_, "nvmlInit_v2"));
    auto by_uuid = reinterpret_cast<int (*)(const char*, void**)>(::dlsym(lib_, "nvmlDeviceGetHandleByUUID"));
    memory_ = reinterpret_cast<memory_t>(::dlsym(lib_, "nvmlDeviceGetMemoryInfo"));
    procs_ = reinterpret_cast<procs_t>(::dlsym(lib_, "nvmlDeviceGetComputeRunningProcesses_v3"));
    shutdown_ = reinterpret_cast<int (*)()>(::dlsym(lib_, "nvmlShutdown"));
    if (init && by_uuid && init() == 0) {
      initialized_ = true;
      if (uuid && by_uuid(uuid, &device_) != 0) device_ = nullptr;
    }
  }
  ~nvml_probe() {
    if (initialized_ && shutdown_) shutdown_();
    if (lib_) ::dlclose(lib_);
  }
  nvml_probe(const nvml_probe&) = delete;
  nvml_probe& operator=(const nvml_probe&) = delete;

  /// Device memory used, all processes; 0 if unknown.
  std::uint64_t device_used() const {
    struct {
      unsigned long long total, free, used;
    } m{};
    return device_ && memory_ && memory_(device_, &m) == 0 ? m.used : 0;
  }
  /// This process's usage; 0 if unknown.
  std::uint64_t process_used() const {
    struct process_info {
      unsigned pid;
      unsigned long long used;
      unsigned gpu_instance, compute_instance;
    };
    if (!device_ || !procs_) return 0;
    std::vector<process_info> list(256);
    unsigned n = static_cast<unsigned>(list.size());
    if (procs_(device_, &n, list.data()) != 0) return 0;
    for (unsigned i = 0; i < n && i < list.size(); ++i)
      if (list[i].pid == static_cast<unsigned>(::getpid())) return list[i].used;
    return 0;
  }

 private:
  using memory_t = int (*)(void*, void*);
  using procs_t = int (*)(void*, unsigned*, void*);
  void* lib_ = nullptr;
  void* device_ = nullptr;
  bool initialized_ = false;
  memory_t memory_ = nullptr;
  procs_t procs_ = nullptr;
  int (*shutdown_)() = nullptr;
};

// Makes `ordinal` the calling thread's current device for one call, and puts the caller's back
// after: a task on several GPUs chooses its own current device, and an allocator must not
// change it under it. (cudaGetDevice/cudaSetDevice on the current one cost tens of ns.)
class on_device {
 public:
  explicit on_device(int ordinal) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = ordinal;
    if (previous_ != ordinal) check(cudaSetDevice(ordinal), "cudaSetDevice");
    ordinal_ = ordinal;
  }
  ~on_device() {
    if (previous_ != ordinal_) cudaSetDevice(previous_);
  }
  on_device(const on_device&) = delete;
  on_device& operator=(const on_device&) = delete;

 private:
  int previous_ = 0, ordinal_ = 0;
};

class cuda_backend final : public backend {
 public:
  cuda_backend(const char* uuid, int ordinal, cuda_context_info& context) : ordinal_{ordinal} {
    nvml_probe nvml(uuid);
    const std::uint64_t before = nvml.device_used();
    on_device here(ordinal_);
    check(cudaFree(nullptr), "creating the CUDA context");
    const std::uint64_t after = nvml.device_used();
    context.process_bytes = nvml.process_used();
    context.device_delta_bytes = before && after > before ? after - before : 0;
    context.counted_bytes = counted_context_bytes(context.process_bytes, context.device_delta_bytes);

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
    prop_.location.id = ordinal_;
    if (granularity) granularity(&granularity_, &prop_, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (!granularity_) granularity_ = 2u << 20;
  }

  ~cuda_backend() override {
    if (checksums_) cudaFreeHost(checksums_);
  }
  cuda_backend(const cuda_backend&) = delete;
  cuda_backend& operator=(const cuda_backend&) = delete;

  std::string name() const override { return "cuda"; }

  void* allocate(std::size_t bytes) override {
    on_device here(ordinal_);
    void* p = nullptr;
    cudaError_t rc = cudaMalloc(&p, bytes);
    if (rc == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear the error state
      return nullptr;
    }
    check(rc, "cudaMalloc");
    return p;
  }
  void deallocate(void* p, std::size_t) noexcept override {
    try {
      on_device here(ordinal_);
      cudaFree(p);
    } catch (...) {
    }
  }

  memory_info device_memory() const override {
    on_device here(ordinal_);
    std::size_t free = 0, total = 0;
    cudaMemGetInfo(&free, &total);
    return {free, total};
  }

  std::size_t granularity() const override { return granularity_; }

  void* reserve_address(std::size_t bytes) override {
    if (!reserve_) return nullptr;
    on_device here(ordinal_);
    CUdeviceptr p = 0;
    return reserve_(&p, bytes, 0, 0, 0) == CUDA_SUCCESS ? reinterpret_cast<void*>(p) : nullptr;
  }
  void release_address(void* p, std::size_t bytes) noexcept override {
    if (free_address_) free_address_(reinterpret_cast<CUdeviceptr>(p), bytes);
  }

  // One physical allocation per granule, so that any page can later be given back alone
  // (cuMemUnmap takes whole mappings): that is what lets the expandable strategy pack tightly.
  // The run's access rights are set in one cuMemSetAccess, the call that updates the page tables.
  bool map(void* p, std::size_t bytes) override {
    if (!create_ || !map_ || !set_access_) return false;
    on_device here(ordinal_);
    const auto at = reinterpret_cast<CUdeviceptr>(p);
    const std::size_t g = granularity_;
    std::vector<CUmemGenericAllocationHandle> made;
    made.reserve(bytes / g);
    auto undo = [&] {
      for (std::size_t i = 0; i < made.size(); ++i) {
        unmap_(at + i * g, g);
        release_(made[i]);
      }
    };
    for (std::size_t off = 0; off < bytes; off += g) {
      CUmemGenericAllocationHandle h{};
      if (create_(&h, g, &prop_, 0) != CUDA_SUCCESS) {
        undo();
        return false;
      }
      if (map_(at + off, g, 0, h, 0) != CUDA_SUCCESS) {
        release_(h);
        undo();
        return false;
      }
      made.push_back(h);
    }
    CUmemAccessDesc access{};
    access.location = prop_.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (set_access_(at, bytes, &access, 1) != CUDA_SUCCESS) {
      undo();
      return false;
    }
    std::lock_guard lock(mutex_);
    for (std::size_t i = 0; i < made.size(); ++i) handles_[at + i * g] = made[i];
    return true;
  }
  void unmap(void* p, std::size_t bytes) noexcept override {
    const auto at = reinterpret_cast<CUdeviceptr>(p);
    std::lock_guard lock(mutex_);
    for (std::size_t off = 0; off < bytes; off += granularity_) {
      unmap_(at + off, granularity_);
      if (auto it = handles_.find(at + off); it != handles_.end()) {
        release_(it->second);
        handles_.erase(it);
      }
    }
  }
  void synchronize(stream_id stream) noexcept override {
    // An error here is a context already broken by a failed kernel: nothing runs any more, so
    // unmapping after it is safe, and the task reports the kernel's error itself.
    try {
      on_device here(ordinal_);  // stream 0 is the current device's default stream
      cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream));
    } catch (...) {
    }
  }

  void copy(void* dst, const void* src, std::size_t bytes, copy_kind kind, stream_id stream) override {
    if (bytes == 0) return;
    on_device here(ordinal_);
    const cudaMemcpyKind k = kind == copy_kind::host_to_device   ? cudaMemcpyHostToDevice
                             : kind == copy_kind::device_to_host ? cudaMemcpyDeviceToHost
                                                                 : cudaMemcpyDeviceToDevice;
    const auto s = reinterpret_cast<cudaStream_t>(stream);
    cudaError_t rc = cudaMemcpyAsync(dst, src, bytes, k, s);
    if (rc == cudaErrorInvalidValue) {
      cudaGetLastError();
      throw std::invalid_argument("cudaMemcpy: a pointer is not on the side the copy's direction says");
    }
    check(rc, "cudaMemcpyAsync");
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  }

  event_id record_event(stream_id stream) override {
    on_device here(ordinal_);
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
    on_device here(ordinal_);
    check(cudaMemsetAsync(p, value, bytes, reinterpret_cast<cudaStream_t>(stream)), "cudaMemsetAsync");
  }

 private:
  // A kernel over the device bytes, its results written straight into page-locked host memory
  // (device-accessible by its own address under unified addressing): no device memory is taken
  // outside the cap, and no copy back is queued.
  bool do_checksum_chunks(const void* header, std::size_t header_bytes, const void* src, std::size_t bytes,
                          std::size_t chunk, std::uint64_t* out, stream_id stream) override {
    const auto in = detail::xxh3::make_input(header, static_cast<std::uint32_t>(header_bytes), src, bytes);
    const std::uint64_t chunks = (in.total() + chunk - 1) / chunk;
    if (chunks == 0) return true;
    on_device here(ordinal_);
    std::lock_guard lock(checksum_mutex_);
    if (checksum_capacity_ < chunks) {
      if (checksums_) cudaFreeHost(checksums_);
      checksums_ = nullptr;
      checksum_capacity_ = 0;
      void* p = nullptr;
      if (cudaHostAlloc(&p, chunks * sizeof(std::uint64_t), cudaHostAllocPortable | cudaHostAllocMapped) !=
          cudaSuccess) {
        cudaGetLastError();
        return false;  // no page-locked memory: the host checksums instead
      }
      checksums_ = static_cast<std::uint64_t*>(p);
      checksum_capacity_ = chunks;
    }
    void* device_view = nullptr;
    if (cudaHostGetDevicePointer(&device_view, checksums_, 0) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    const auto s = reinterpret_cast<cudaStream_t>(stream);
    // A launch that fails (no kernel for this GPU's architecture, say) leaves the context
    // usable: the host checksums instead.
    if (detail::launch_chunk_checksums(in, chunk, chunks, static_cast<std::uint64_t*>(device_view), s) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    check(cudaStreamSynchronize(s), "checksum kernel");
    std::memcpy(out, checksums_, chunks * sizeof(std::uint64_t));
    return true;
  }

  int ordinal_ = 0;
  std::size_t granularity_ = 0;
  std::mutex checksum_mutex_;
  std::uint64_t* checksums_ = nullptr;  // page-locked, for checksum_chunks; kept for the next call
  std::uint64_t checksum_capacity_ = 0;
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

backend* create_backend(const char* uuid, int ordinal, cuda_context_info* context, char* error,
                        std::size_t error_size) {
  try {
    cuda_context_info info;
    auto* b = new cuda_backend(uuid, ordinal, info);
    if (context) *context = info;
    return b;
  } catch (const std::exception& e) {
    if (error && error_size) std::snprintf(error, error_size, "%s", e.what());
    return nullptr;
  }
}

int host_register(void* p, std::size_t n) {
  return cudaHostRegister(p, n, cudaHostRegisterPortable) == cudaSuccess ? 0 : -1;
}

int host_unregister(void* p) { return cudaHostUnregister(p) == cudaSuccess ? 0 : -1; }

constexpr cuda_module_api api{cuda_module_abi, &create_backend, &host_register, &host_unregister};

}  // namespace

extern "C" const isorun::alloc::cuda_module_api* isorun_cuda_module() { return &api; }
