#include "gpus_command.hpp"

#include <filesystem>
#include <iostream>

#include <nlohmann/json.hpp>

#include "isorun/runner/containment.hpp"
#include "isorun/runner/gpu_inventory.hpp"
#include "isorun/runner/units.hpp"

namespace isorun::cli {

int list_gpus(const cli_options& o) {
  using nlohmann::json;
  const auto inv = runner::gpu_inventory::detect();
  const auto& contained = runner::containment();
  if (o.json) {
    json out = {{"source", inv.describe_source()}, {"gpus", json::array()}};
    for (const auto& g : inv.gpus)
      out["gpus"].push_back({{"index", g.index},
                             {"uuid", g.uuid},
                             {"name", g.name},
                             {"total_memory", g.total_memory},
                             {"free_memory", g.free_memory}});
    out["containment"] = contained.cgroup ? json{{"mode", "cgroup"},
                                                 {"where", contained.where},
                                                 {"memory_peak", contained.memory_peak}}
                                          : json{{"mode", "process_group"}, {"reason", contained.why_not}};
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  std::cout << "GPU inventory: " << inv.describe_source() << "\n";
  if (inv.gpus.empty()) std::cout << "no GPUs; tasks run with --cpu (or set ISORUN_SIMULATE_GPUS=2x16G to simulate)\n";
  for (const auto& g : inv.gpus)
    std::cout << "  " << g.index << "  " << g.uuid << "  " << g.name << "  " << format_size(g.total_memory)
              << " total, " << format_size(g.free_memory) << " free\n";
  if (contained.cgroup)
    std::cout << "containment: a cgroup v2 per worker (under "
              << std::filesystem::path(contained.where).parent_path().string() << "), killed whole at its end"
              << (contained.memory_peak ? "; memory.peak reported" : "") << "\n";
  else
    std::cout << "containment: the process group alone (" << contained.why_not
              << "); a descendant that calls setsid() escapes it\n";
  return 0;
}

}  // namespace isorun::cli
