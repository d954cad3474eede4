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

std::vector<std::string> assignment_environment(const std::vector<gpu_info>& gpus, std::uint64_t mem_limit) {
  std::string indices;
  for (const auto& g : gpus) indices += (indices.empty() ? "" : ",") + std::to_string(g.index);
  return {assign(env::visible_devices, visible_devices_for(gpus)), assign(env::device_order, "PCI_BUS_ID"),
          assign(env::gpu, indices), assign(env::mem_limit, std::to_string(mem_limit))};
}

std::string visible_devices_for(const std::vector<gpu_info>& gpus) {
  std::string list;
  for (const auto& g : gpus) list += (list.empty() ? "" : ",") + (g.uuid.empty() ? std::to_string(g.index) : g.uuid);
  return list;
}

}  // namespace isorun::runner
