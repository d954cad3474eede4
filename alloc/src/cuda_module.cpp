#include "isorun/alloc/cuda_module.hpp"

#include <dlfcn.h>

#include <filesystem>
#include <stdexcept>
#include <string>

namespace isorun::alloc {

const cuda_module_api& load_cuda_module() {
  // The module is built beside libisorun.so, and a program linking this library statically sits
  // in the folder of programs, ISORUN_LIBDIR_FROM_BINDIR from it (as runner::beside_library finds
  // it): look there first, so the module of this very build is the one loaded.
  void* handle = nullptr;
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&load_cuda_module), &info) && info.dli_fname) {
    const auto here = std::filesystem::path(info.dli_fname).parent_path();
    for (const auto& dir : {here, (here / ISORUN_LIBDIR_FROM_BINDIR).lexically_normal()}) {
      handle = ::dlopen((dir / cuda_module_name).c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle) break;
    }
  }
  if (!handle) handle = ::dlopen(cuda_module_name, RTLD_NOW | RTLD_LOCAL);
  if (!handle)
    throw std::runtime_error(std::string("cannot load the CUDA backend (") + cuda_module_name + "): " + ::dlerror() +
                             "; was isorun built without nvcc?");
  using entry_t = const cuda_module_api* (*)();
  auto entry = reinterpret_cast<entry_t>(::dlsym(handle, "isorun_cuda_module"));
  const cuda_module_api* api = entry ? entry() : nullptr;
  if (!api || api->abi != cuda_module_abi)
    throw std::runtime_error(std::string(cuda_module_name) + " is from another isorun version");
  return *api;
}

}  // namespace isorun::alloc
