#include "isorun/runner/worker_env.hpp"

#include <algorithm>

#include "isorun/serialization/protocol.hpp"

extern char** environ;

namespace isorun::runner {
namespace env = serialization::env;

namespace {
bool starts_with_key(const std::string& entry, std::string_view key) {
  return entry.size() > key.size() && entry.compare(0, key.size(), key) == 0 && entry[key.size()] == '=';
}

std::string assign(std::string_view key, const std::string& value) { return std::string(key) + "=" + value; }
}  // namespace

std::vector<std::string> inherited_environment() {
  std::vector<std::string> out;
  for (char** e = environ; e && *e; ++e) {
    std::string entry(*e);
    if (std::none_of(std::begin(env::all), std::end(env::all), [&](auto key) { return starts_with_key(entry, key); }))
      out.push_back(std::move(entry));
  }
  return out;
}

std::vector<std::string> assignment_environment(const std::optional<gpu_info>& gpu, std::uint64_t mem_limit) {
  return {assign(env::visible_devices, visible_devices_for(gpu)), assign(env::device_order, "PCI_BUS_ID"),
          assign(env::gpu, gpu ? std::to_string(gpu->index) : std::string()),
          assign(env::mem_limit, std::to_string(mem_limit))};
}

std::string visible_devices_for(const std::optional<gpu_info>& gpu) {
  if (!gpu) return "";
  return gpu->uuid.empty() ? std::to_string(gpu->index) : gpu->uuid;
}

}  // namespace isorun::runner
