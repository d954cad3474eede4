#include "isorun/this_worker.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>

#include "isorun/alloc/config.hpp"
#include "isorun/alloc/cuda_backend.hpp"
#include "isorun/alloc/host_backend.hpp"
#include "isorun/alloc/out_of_memory.hpp"

namespace isorun {
namespace {

std::string mib(std::uint64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

// libisorun_cuda.so sits next to libisorun.so (build tree and install tree alike).
void* load_cuda_module() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&this_worker), &info) && info.dli_fname) {
    auto path = std::filesystem::path(info.dli_fname).parent_path() / alloc::cuda_module_name;
    if (void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
  }
  return ::dlopen(alloc::cuda_module_name, RTLD_NOW | RTLD_LOCAL);
}

std::unique_ptr<alloc::caching_allocator> make_allocator(const worker_context& w, void*& module_out) {
  std::string conf = w.alloc_conf();
  if (conf.empty())
    if (const char* env = std::getenv("ISORUN_ALLOC_CONF")) conf = env;
  const auto config = alloc::alloc_config::parse(conf);
  if (w.has_gpu()) {
    void* module = load_cuda_module();
    module_out = module;
    if (!module)
      throw std::runtime_error(std::string("cannot load the CUDA backend (") + alloc::cuda_module_name + "): " + ::dlerror());
    using create_t = alloc::backend* (*)(int, char*, std::size_t);
    using context_t = std::uint64_t (*)(int);
    auto create = reinterpret_cast<create_t>(::dlsym(module, "isorun_cuda_backend_create"));
    auto context = reinterpret_cast<context_t>(::dlsym(module, "isorun_cuda_context_bytes"));
    if (!create || !context) throw std::runtime_error("the CUDA backend module lacks its entry points");
    char error[256] = {};
    std::unique_ptr<alloc::backend> backend(create(0, error, sizeof error));  // device 0: the only visible one
    if (!backend) throw std::runtime_error(std::string("CUDA backend: ") + error);
    const std::uint64_t ctx = context(0);
    std::uint64_t cap = w.mem_limit() ? w.mem_limit() : backend->device_memory().total;
    std::string origin = w.mem_limit() ? "--mem-limit " + mib(w.mem_limit()) : "device memory";
    if (ctx) {
      if (ctx >= cap)
        throw out_of_memory("the CUDA context alone takes " + mib(ctx) + ", more than the " + mib(cap) + " cap");
      cap -= ctx;
      origin += " minus " + mib(ctx) + " CUDA context";
    }
    return std::make_unique<alloc::caching_allocator>(std::move(backend), cap, config, origin);
  }
  // CPU worker, or a process outside isorun: the host backend, capped like a device would be.
  const std::uint64_t ram = static_cast<std::uint64_t>(::sysconf(_SC_PHYS_PAGES)) * static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  const std::uint64_t cap = w.mem_limit() ? w.mem_limit() : ram;
  const std::string origin = w.mem_limit() ? "--mem-limit " + mib(w.mem_limit()) + ", host backend" : "host memory";
  return std::make_unique<alloc::caching_allocator>(std::make_unique<alloc::host_backend>(cap), cap, config, origin);
}

}  // namespace

void worker_context::assign(int device, std::string uuid, std::uint64_t device_memory, std::uint64_t mem_limit,
                            std::string task, std::string alloc_conf) {
  in_worker_ = true;
  device_ = device;
  device_uuid_ = std::move(uuid);
  device_memory_ = device_memory;
  mem_limit_ = mem_limit;
  task_ = std::move(task);
  alloc_conf_ = std::move(alloc_conf);
}

alloc::caching_allocator& worker_context::allocator() {
  std::call_once(allocator_once_, [&] { allocator_ = make_allocator(*this, cuda_module_); });
  return *allocator_;
}

blob worker_context::output_blob(std::size_t size) {
  if (!in_worker_ || !output_area_) return blob(size);
  // The payload of a blob result is its 8-byte length, then the bytes: put them where the
  // encoder will find them, so encoding only checksums.
  std::byte* area = output_area_(sizeof(std::uint64_t) + size);
  if (!area) return blob(size);
  if (has_gpu()) {
    allocator();  // loads the CUDA module
    using reg_t = int (*)(void*, std::size_t);
    if (cuda_module_)
      if (auto reg = reinterpret_cast<reg_t>(::dlsym(cuda_module_, "isorun_cuda_host_register")))
        reg(area + sizeof(std::uint64_t), size);  // best effort: pageable memory works too
  }
  return blob::external(area + sizeof(std::uint64_t), size);
}

worker_context& this_worker() noexcept {
  static worker_context context;
  return context;
}

}  // namespace isorun
