#include "isorun/runner/gpu_inventory.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <optional>

#include "isorun/runner/errors.hpp"
#include "isorun/runner/units.hpp"

namespace isorun::runner {
namespace {

// The few NVML entry points used, declared here so nothing links against the driver.
using nvml_return = int;
using nvml_device = void*;
struct nvml_memory {
  unsigned long long total, free, used;
};

struct nvml_api {
  nvml_return (*init)();
  nvml_return (*shutdown)();
  nvml_return (*count)(unsigned*);
  nvml_return (*handle)(unsigned, nvml_device*);
  nvml_return (*uuid)(nvml_device, char*, unsigned);
  nvml_return (*name)(nvml_device, char*, unsigned);
  nvml_return (*memory)(nvml_device, nvml_memory*);
};

template <class F>
bool load(void* lib, const char* symbol, F& out) {
  out = reinterpret_cast<F>(::dlsym(lib, symbol));
  return out != nullptr;
}

// NVML, loaded and initialized for as long as this object lives.
class nvml_session {
 public:
  nvml_session() {
    lib_ = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib_) {
      error_ = "no NVIDIA driver (libnvidia-ml.so.1 not found)";
      return;
    }
    if (!load(lib_, "nvmlInit_v2", api_.init) || !load(lib_, "nvmlShutdown", api_.shutdown) ||
        !load(lib_, "nvmlDeviceGetCount_v2", api_.count) || !load(lib_, "nvmlDeviceGetHandleByIndex_v2", api_.handle) ||
        !load(lib_, "nvmlDeviceGetUUID", api_.uuid) || !load(lib_, "nvmlDeviceGetName", api_.name) ||
        !load(lib_, "nvmlDeviceGetMemoryInfo", api_.memory)) {
      error_ = "libnvidia-ml.so.1 lacks required symbols";
      return;
    }
    if (int rc = api_.init(); rc != 0) {
      error_ = "nvmlInit failed with code " + std::to_string(rc);
      return;
    }
    ready_ = true;
  }
  ~nvml_session() {
    if (ready_) api_.shutdown();
    if (lib_) ::dlclose(lib_);
  }
  nvml_session(const nvml_session&) = delete;
  nvml_session& operator=(const nvml_session&) = delete;

  [[nodiscard]] bool ready() const noexcept { return ready_; }
  [[nodiscard]] const std::string& error() const noexcept { return error_; }

  [[nodiscard]] unsigned count() const {
    unsigned n = 0;
    return api_.count(&n) == 0 ? n : 0;
  }

  [[nodiscard]] std::optional<gpu_info> device(unsigned index) const {
    nvml_device dev{};
    if (api_.handle(index, &dev) != 0) return std::nullopt;
    gpu_info g;
    g.index = static_cast<int>(index);
    char buf[96] = {};
    if (api_.uuid(dev, buf, sizeof buf) == 0) g.uuid = buf;
    if (api_.name(dev, buf, sizeof buf) == 0) g.name = buf;
    nvml_memory mem{};
    if (api_.memory(dev, &mem) == 0) {
      g.total_memory = mem.total;
      g.free_memory = mem.free;
    }
    return g;
  }

 private:
  void* lib_ = nullptr;
  nvml_api api_{};
  bool ready_ = false;
  std::string error_;
};

gpu_inventory from_nvml() {
  gpu_inventory inv;
  nvml_session nvml;
  if (!nvml.ready()) {
    inv.detail = nvml.error();
    return inv;
  }
  for (unsigned i = 0, n = nvml.count(); i < n; ++i)
    if (auto g = nvml.device(i)) inv.gpus.push_back(std::move(*g));
  inv.source = gpu_inventory::origin::nvml;
  inv.detail = "NVML";
  return inv;
}

}  // namespace

gpu_inventory gpu_inventory::simulated(std::string_view spec) {
  gpu_inventory inv;
  inv.source = origin::simulated;
  inv.detail = "simulated (ISORUN_SIMULATE_GPUS=" + std::string(spec) + ")";
  if (spec == "none") return inv;  // explicitly no GPU, whatever the machine has
  std::size_t start = 0;
  while (start <= spec.size()) {
    std::size_t end = spec.find(',', start);
    if (end == std::string_view::npos) end = spec.size();
    std::string_view part = spec.substr(start, end - start);
    start = end + 1;
    if (part.empty()) throw parse_error("ISORUN_SIMULATE_GPUS='" + std::string(spec) + "': empty entry; expected e.g. 2x16G or 16G,24G");
    long count = 1;
    std::string_view size = part;
    if (auto x = part.find('x'); x != std::string_view::npos) {
      std::string n(part.substr(0, x));
      char* e = nullptr;
      count = std::strtol(n.c_str(), &e, 10);
      if (n.empty() || *e || count < 1 || count > 64)
        throw parse_error("ISORUN_SIMULATE_GPUS='" + std::string(spec) + "': bad count '" + n + "' (1..64)");
      size = part.substr(x + 1);
    }
    std::uint64_t bytes = 0;
    try {
      bytes = parse_size(size);
    } catch (const parse_error& e) {
      throw parse_error("ISORUN_SIMULATE_GPUS='" + std::string(spec) + "': " + e.what() + "; expected e.g. 2x16G or 16G,24G");
    }
    if (bytes == 0) throw parse_error("ISORUN_SIMULATE_GPUS='" + std::string(spec) + "': a GPU needs a non-zero memory size");
    for (long i = 0; i < count; ++i) {
      gpu_info g;
      g.index = static_cast<int>(inv.gpus.size());
      g.uuid = "GPU-sim-" + std::to_string(g.index);
      g.name = "Simulated GPU";
      g.total_memory = g.free_memory = bytes;
      g.simulated = true;
      inv.gpus.push_back(std::move(g));
    }
    if (end == spec.size()) break;
  }
  return inv;
}

std::optional<gpu_info> gpu_inventory::probe(int index) {
  if (const char* sim = std::getenv("ISORUN_SIMULATE_GPUS"); sim && *sim) {
    for (const auto& g : simulated(sim).gpus)
      if (g.index == index) return g;
    return std::nullopt;
  }
  nvml_session nvml;
  if (!nvml.ready() || index < 0) return std::nullopt;
  return nvml.device(static_cast<unsigned>(index));
}

gpu_inventory gpu_inventory::detect() {
  if (const char* sim = std::getenv("ISORUN_SIMULATE_GPUS"); sim && *sim) return simulated(sim);
  return from_nvml();
}

const gpu_info& gpu_inventory::at(int index) const {
  for (const auto& g : gpus)
    if (g.index == index) return g;
  if (gpus.empty())
    throw usage_error("GPU " + std::to_string(index) + " was requested but there is no GPU (" + detail +
                      "); run with --cpu, or set ISORUN_SIMULATE_GPUS=2x16G for a simulated inventory");
  throw usage_error("GPU " + std::to_string(index) + " does not exist; available: 0.." +
                    std::to_string(gpus.size() - 1) + " (see `isorun gpus`), or use --cpu");
}

std::string gpu_inventory::describe_source() const {
  switch (source) {
    case origin::nvml: return "NVML";
    case origin::simulated: return detail;
    case origin::none: break;
  }
  return "none: " + detail;
}

}  // namespace isorun::runner
