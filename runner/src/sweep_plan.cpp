// Slot planning and trial ids: the part of sweeps every isorun user links (no YAML here).
#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <thread>

#include "isorun/sweep.hpp"
#include "isorun/units.hpp"

namespace isorun::sweeps {

std::string trial_id(const std::string& task, const nlohmann::json& params) {
  const std::string canonical = task + "\n" + params.dump();  // object keys are sorted
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(XXH3_64bits(canonical.data(), canonical.size())));
  return buf;
}

metric_spec parse_metric_flag(const std::string& text) {
  metric_spec m;
  const auto colon = text.rfind(':');
  m.name = text.substr(0, colon);
  if (colon != std::string::npos) {
    const std::string goal = text.substr(colon + 1);
    if (goal == "min" || goal == "minimize") m.maximize = false;
    else if (goal != "max" && goal != "maximize")
      throw spec_error("--metric " + text + ": the goal after ':' is min or max", 0);
  }
  if (m.name.empty()) throw spec_error("--metric " + text + ": expected NAME[:min|max], e.g. accuracy:max", 0);
  return m;
}

slot_plan plan_slots(const spec& s, const gpu_inventory& inv, unsigned cores) {
  slot_plan plan;
  cores = std::max(1u, cores);
  std::vector<int> gpus = s.gpus;
  if (s.all_gpus)
    for (const auto& g : inv.gpus) gpus.push_back(g.index);
  if (s.all_gpus && gpus.empty())
    throw spec_error("resources: gpus: all, but there are no GPUs (" + inv.describe_source() +
                     "); drop gpus: for CPU slots, or set ISORUN_SIMULATE_GPUS", 0);
  if (gpus.empty()) {
    const int n = s.cpu_slots ? s.cpu_slots : static_cast<int>(cores);
    for (int i = 0; i < n; ++i) plan.slots.push_back({std::nullopt, i});
    plan.how = std::to_string(n) + " CPU slot" + (n == 1 ? "" : "s") + (s.cpu_slots ? " (cpu_slots)" : " (one per core)");
    return plan;
  }
  if (!s.mem_limit && !s.per_gpu)
    throw spec_error("GPU sweeps need mem_limit (or per_gpu) to pack trials; e.g. --mem-limit 6G", 0);
  const int cores_per_gpu = static_cast<int>(std::max<std::size_t>(1, cores / gpus.size()));
  for (int index : gpus) {
    const gpu_info& g = inv.at(index);  // usage_error for a missing GPU
    if (s.mem_limit > g.total_memory)
      throw spec_error("mem_limit " + format_size(s.mem_limit) + " exceeds GPU " + std::to_string(index) + "'s " +
                       format_size(g.total_memory), 0);
    if (s.per_gpu && s.mem_limit && static_cast<std::uint64_t>(s.per_gpu) * s.mem_limit > g.free_memory)
      throw spec_error("per_gpu " + std::to_string(s.per_gpu) + " x mem_limit " + format_size(s.mem_limit) +
                       " exceeds GPU " + std::to_string(index) + "'s free " + format_size(g.free_memory), 0);
    // A trial's cap includes its CUDA context, so caps simply add up against free memory.
    int n = s.per_gpu;
    std::string how = "GPU " + std::to_string(index) + ": " + std::to_string(n) + " (per_gpu)";
    if (!n) {
      const int fit = static_cast<int>(g.free_memory / s.mem_limit);
      n = std::min(fit, cores_per_gpu);
      how = "GPU " + std::to_string(index) + ": " + std::to_string(n) + " = min(" + std::to_string(fit) + " caps of " +
            format_size(s.mem_limit) + " in " + format_size(g.free_memory) + " free, " + std::to_string(cores_per_gpu) +
            " core" + (cores_per_gpu == 1 ? "" : "s") + (gpus.size() > 1 ? " per GPU)" : ")");
    }
    for (int i = 0; i < n; ++i) plan.slots.push_back({g, static_cast<int>(plan.slots.size())});
    plan.how += (plan.how.empty() ? "" : "; ") + how;
  }
  if (plan.slots.empty()) throw spec_error("no trial fits on the listed GPUs with mem_limit " + format_size(s.mem_limit), 0);
  plan.how = std::to_string(plan.slots.size()) + " GPU slot" + (plan.slots.size() == 1 ? "" : "s") + " (" + plan.how + ")";
  return plan;
}

}  // namespace isorun::sweeps
