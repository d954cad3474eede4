#include "isorun/runner/gpu_inventory.hpp"

#include <dirent.h>
#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <vector>

#include "isorun/runner/errors.hpp"
#include "isorun/runner/units.hpp"
#include "read_text.hpp"

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

// --- The inventory cache (gpu_inventory::lookup) -------------------------------------------

using detail::read_text;

// What the cached facts depend on, as text; nullopt where there is nothing to key them by. The
// driver's /proc directory changes with a driver (re)load that changes the GPUs, the NVML library
// with the driver's files, the boot id with everything else (a GPU reset with other settings
// comes with a reboot or a driver reload).
std::optional<std::string> cache_key() {
  const char* proc_env = std::getenv("ISORUN_NVIDIA_PROC");  // tests point it at a made-up tree
  const std::string proc = proc_env && *proc_env ? proc_env : "/proc/driver/nvidia";
  std::vector<std::string> buses;
  if (DIR* d = ::opendir((proc + "/gpus").c_str())) {
    while (dirent* e = ::readdir(d))
      if (e->d_name[0] != '.') buses.emplace_back(e->d_name);
    ::closedir(d);
  }
  if (buses.empty()) return std::nullopt;
  std::sort(buses.begin(), buses.end());
  void* lib = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return std::nullopt;
  Dl_info info{};
  struct stat st {};
  const bool found = ::dladdr(::dlsym(lib, "nvmlInit_v2"), &info) && info.dli_fname && ::stat(info.dli_fname, &st) == 0;
  std::string key = found ? std::string("nvml ") + info.dli_fname + " " + std::to_string(st.st_size) + " " +
                                std::to_string(st.st_mtim.tv_sec) + "." + std::to_string(st.st_mtim.tv_nsec) + "\n"
                          : "";
  ::dlclose(lib);
  if (!found) return std::nullopt;
  key += "boot " + read_text("/proc/sys/kernel/random/boot_id");
  key += "driver " + read_text(proc + "/version");
  for (const auto& bus : buses) key += "gpu " + bus + "\n" + read_text(proc + "/gpus/" + bus + "/information");
  return key;
}

std::string cache_path() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  if (xdg && *xdg == '/') return std::string(xdg) + "/isorun/gpus";
  if (home && *home == '/') return std::string(home) + "/.cache/isorun/gpus";
  return "";
}

constexpr std::string_view cache_magic = "isorun gpu cache 1 ";

// The cached inventory, if the file holds one under exactly `key`. Each entry's UUID must be
// one the key's information files name; anything odd and the cache is not used.
std::optional<std::vector<gpu_info>> read_cache(const std::string& key) {
  const std::string path = cache_path();
  if (path.empty()) return std::nullopt;
  const std::string text = read_text(path);
  if (text.compare(0, cache_magic.size(), cache_magic) != 0) return std::nullopt;
  std::size_t at = cache_magic.size();
  const auto eol = text.find('\n', at);
  if (eol == std::string::npos) return std::nullopt;
  std::size_t key_size = 0;
  try {
    key_size = std::stoull(text.substr(at, eol - at));
  } catch (...) {
    return std::nullopt;
  }
  at = eol + 1;
  // compare() sets the stored key (key_size bytes) against all of `key`: equal only if as long.
  if (text.size() - at < key_size || text.compare(at, key_size, key) != 0) return std::nullopt;
  std::istringstream entries(text.substr(at + key_size));
  std::vector<gpu_info> gpus;
  for (std::string line; std::getline(entries, line);) {
    std::istringstream fields(line);
    gpu_info g;
    std::string total;
    if (!(fields >> g.index >> total >> g.uuid) || g.uuid.empty() || key.find(g.uuid) == std::string::npos)
      return std::nullopt;
    try {
      g.total_memory = std::stoull(total);
    } catch (...) {
      return std::nullopt;
    }
    std::getline(fields >> std::ws, g.name);
    gpus.push_back(std::move(g));
  }
  if (gpus.empty()) return std::nullopt;
  return gpus;
}

// Best effort: written whole under another name, then renamed over the old one.
void write_cache(const std::string& key, const std::vector<gpu_info>& gpus) {
  const std::string path = cache_path();
  if (path.empty()) return;
  const std::string dir = path.substr(0, path.rfind('/'));
  ::mkdir(dir.substr(0, dir.rfind('/')).c_str(), 0700);
  ::mkdir(dir.c_str(), 0700);
  const std::string temp = path + "." + std::to_string(::getpid());
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    out << cache_magic << key.size() << "\n" << key;
    for (const auto& g : gpus) out << g.index << " " << g.total_memory << " " << g.uuid << " " << g.name << "\n";
    if (!out.flush()) {
      std::remove(temp.c_str());
      return;
    }
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) std::remove(temp.c_str());
}

}  // namespace

std::optional<gpu_info> gpu_inventory::lookup(int index) {
  if (const char* sim = std::getenv("ISORUN_SIMULATE_GPUS"); sim && *sim) return probe(index);
  const auto key = cache_key();
  if (!key) return probe(index);
  auto pick = [&](const std::vector<gpu_info>& gpus) -> std::optional<gpu_info> {
    for (const auto& g : gpus)
      if (g.index == index) {
        gpu_info found = g;
        found.free_memory = 0;  // not a lasting fact
        return found;
      }
    return std::nullopt;
  };
  if (auto cached = read_cache(*key)) return pick(*cached);
  const gpu_inventory inv = from_nvml();
  if (inv.source != origin::nvml || inv.gpus.empty()) return std::nullopt;
  write_cache(*key, inv.gpus);
  return pick(inv.gpus);
}

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
    if (part.empty())
      throw parse_error("ISORUN_SIMULATE_GPUS='" + std::string(spec) +
                        "': empty entry; expected e.g. 2x16G or 16G,24G");
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
      throw parse_error("ISORUN_SIMULATE_GPUS='" + std::string(spec) + "': " + e.what() +
                        "; expected e.g. 2x16G or 16G,24G");
    }
    if (bytes == 0)
      throw parse_error("ISORUN_SIMULATE_GPUS='" + std::string(spec) + "': a GPU needs a non-zero memory size");
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
    throw usage_error(
        "GPU " + std::to_string(index) + " was requested but there is no GPU (" + detail +
        "); run on the CPU instead (--cpu; cpu=True in Python), or set ISORUN_SIMULATE_GPUS=2x16G for a " +
        "simulated inventory");
  throw usage_error("GPU " + std::to_string(index) + " does not exist; available: 0.." +
                    std::to_string(gpus.size() - 1) +
                    " (see `isorun gpus`): choose one of them, or run on the CPU (--cpu; cpu=True in Python)");
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
