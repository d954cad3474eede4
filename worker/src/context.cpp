#include "isorun/worker/this_worker.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>

#include "isorun/alloc/config.hpp"
#include "isorun/alloc/host_backend.hpp"
#include "isorun/alloc/out_of_memory.hpp"
#include "isorun/alloc/simulated_device.hpp"

namespace isorun {
namespace {

std::string mib(std::uint64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

// libisorun_cuda.so sits next to libisorun.so (build tree and install tree alike).
const alloc::cuda_module_api* load_cuda_module() {
  void* handle = nullptr;
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&this_worker), &info) && info.dli_fname) {
    auto path = std::filesystem::path(info.dli_fname).parent_path() / alloc::cuda_module_name;
    handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  }
  if (!handle) handle = ::dlopen(alloc::cuda_module_name, RTLD_NOW | RTLD_LOCAL);
  if (!handle)
    throw std::runtime_error(std::string("cannot load the CUDA backend (") + alloc::cuda_module_name + "): " + ::dlerror() +
                             "; was isorun built without nvcc?");
  using entry_t = const alloc::cuda_module_api* (*)();
  auto entry = reinterpret_cast<entry_t>(::dlsym(handle, "isorun_cuda_module"));
  const alloc::cuda_module_api* api = entry ? entry() : nullptr;
  if (!api || api->abi != alloc::cuda_module_abi)
    throw std::runtime_error(std::string(alloc::cuda_module_name) + " is from another isorun version");
  return api;
}

struct selected_backend {
  std::unique_ptr<alloc::backend> memory;
  std::uint64_t cap = 0;
  std::string origin;  // how the cap was derived, for OOM reports
};

// The one place a worker's device kind becomes a backend and a cap.
selected_backend select_backend(const worker_context& w, const alloc::cuda_module_api*& cuda,
                                alloc::cuda_context_info& context) {
  const std::string limit = w.mem_limit() ? "--mem-limit " + mib(w.mem_limit()) : "";
  switch (w.kind()) {
    case device_kind::cuda: {
      cuda = load_cuda_module();
      char error[512] = {};
      std::unique_ptr<alloc::backend> memory(cuda->create_backend(w.device_uuid().c_str(), &context, error, sizeof error));
      if (!memory) throw std::runtime_error("cannot use GPU " + w.device_uuid() + ": " + error);
      std::uint64_t cap = w.mem_limit() ? w.mem_limit() : memory->device_memory().total;
      std::string origin = w.mem_limit() ? limit : "device memory";
      if (const std::uint64_t ctx = context.counted_bytes) {
        if (ctx >= cap)
          throw out_of_memory("the CUDA context alone takes " + mib(ctx) + ", more than the " + mib(cap) + " cap");
        cap -= ctx;
        origin += " minus " + mib(ctx) + " CUDA context";
      }
      return {std::move(memory), cap, origin};
    }
    case device_kind::simulated: {
      const std::uint64_t cap = w.mem_limit() ? w.mem_limit() : w.device_memory();
      return {std::make_unique<alloc::simulated_device>(w.device_memory()), cap,
              (w.mem_limit() ? limit : "device memory") + ", simulated GPU"};
    }
    case device_kind::cpu: break;
  }
  // CPU worker, or a process outside isorun: the host backend, capped like a device would be.
  const std::uint64_t ram = static_cast<std::uint64_t>(::sysconf(_SC_PHYS_PAGES)) * static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  const std::uint64_t cap = w.mem_limit() ? w.mem_limit() : ram;
  return {std::make_unique<alloc::host_backend>(cap), cap, w.mem_limit() ? limit + ", host backend" : "host memory"};
}

}  // namespace

const char* to_string(device_kind kind) noexcept {
  switch (kind) {
    case device_kind::cpu: return "cpu";
    case device_kind::cuda: return "cuda";
    case device_kind::simulated: return "simulated";
  }
  return "?";
}

void worker_context::assign(assignment a) {
  in_worker_ = true;
  assigned_ = std::move(a);
}

alloc::caching_allocator& worker_context::allocator() {
  std::call_once(allocator_once_, [&] {
    std::string conf = assigned_.alloc_conf;
    if (conf.empty())
      if (const char* env = std::getenv("ISORUN_ALLOC_CONF")) conf = env;
    const auto config = alloc::alloc_config::parse(conf);
    auto selected = select_backend(*this, cuda_, context_);
    allocator_ = std::make_unique<alloc::caching_allocator>(std::move(selected.memory), selected.cap, config,
                                                            selected.origin);
  });
  return *allocator_;
}

blob worker_context::output_blob(std::size_t size) {
  if (!in_worker_ || !output_area_) return blob(size);
  // The payload of a blob result is its 8-byte length, then the bytes: put them where the
  // encoder will find them, so encoding only checksums.
  std::byte* area = output_area_(sizeof(std::uint64_t) + size);
  if (!area) return blob(size);
  if (assigned_.kind == device_kind::cuda) {
    allocator();  // loads the CUDA module
    // Best effort: pageable memory works too.
    if (cuda_->host_register(area + sizeof(std::uint64_t), size) == 0) registered_ = area + sizeof(std::uint64_t);
  }
  return blob::external(area + sizeof(std::uint64_t), size);
}

void worker_context::release_task_memory() noexcept {
  if (registered_) {
    cuda_->host_unregister(registered_);  // a page-locked page would keep the segment unsealable
    registered_ = nullptr;
  }
  try {
    if (allocator_) allocator_->empty_cache();
  } catch (...) {
  }
}

worker_context& this_worker() noexcept {
  static worker_context context;
  return context;
}

}  // namespace isorun
