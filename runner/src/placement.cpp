// Placement: which GPU a job gets, and how a batch's jobs are packed onto slots.
#include "isorun/runner/placement.hpp"

#include <algorithm>

#include "isorun/runner/errors.hpp"
#include "isorun/runner/units.hpp"
#include "isorun/serialization/machine.hpp"

namespace isorun::runner {

void check_fits(const gpu_info& gpu, std::uint64_t mem_limit) {
  if (mem_limit > gpu.total_memory)
    throw usage_error("mem-limit " + format_size(mem_limit) + " exceeds GPU " + std::to_string(gpu.index) + "'s " +
                      format_size(gpu.total_memory) + ": give a cap of at most that");
}

gpu_request gpu_request_for(const isolated_options& opts) {
  const int given = int(opts.gpu.has_value()) + int(!opts.gpus.empty()) + int(opts.gpu_count != 0);
  if (given > 1)
    throw usage_error("give one of gpu (one GPU), gpus (these GPUs) and gpu_count (any that many), not several");
  if (opts.gpu_count < 0)
    throw usage_error("gpu_count " + std::to_string(opts.gpu_count) + " is negative; ask for 1 or more");
  gpu_request r;
  if (opts.gpu) r.indices = {*opts.gpu};
  r.indices.insert(r.indices.end(), opts.gpus.begin(), opts.gpus.end());
  r.count = opts.gpu_count;
  return r;
}

std::vector<gpu_info> place_job(const gpu_inventory& inventory, const gpu_request& request, bool default_to_gpu,
                                std::uint64_t mem_limit) {
  std::vector<gpu_info> chosen;
  for (int index : request.indices) {
    const gpu_info& g = inventory.at(index);  // usage_error naming the GPUs there are
    if (std::any_of(chosen.begin(), chosen.end(), [&](const gpu_info& c) { return c.index == index; }))
      throw usage_error("GPU " + std::to_string(index) + " is listed twice; list each GPU once");
    chosen.push_back(g);
  }
  if (request.count > 0) {
    const auto n = static_cast<std::size_t>(request.count);
    const std::string asked = std::to_string(n) + " GPU" + (n == 1 ? "" : "s");
    if (n > inventory.gpus.size())
      throw usage_error(asked + " asked for, but there " + (inventory.gpus.size() == 1 ? "is " : "are ") +
                        std::to_string(inventory.gpus.size()) + " (" + inventory.describe_source() + ")");
    std::vector<gpu_info> room;
    for (const auto& g : inventory.gpus)
      if (mem_limit <= g.free_memory) room.push_back(g);
    if (room.size() < n)
      throw usage_error(asked + " asked for, but only " + std::to_string(room.size()) + " of the " +
                        std::to_string(inventory.gpus.size()) + " have " + format_size(mem_limit) +
                        " free for the cap; lower --mem-limit or ask for fewer");
    std::stable_sort(room.begin(), room.end(),
                     [](const gpu_info& a, const gpu_info& b) { return a.free_memory > b.free_memory; });
    chosen.assign(room.begin(), room.begin() + static_cast<std::ptrdiff_t>(n));
  }
  if (chosen.empty() && request.indices.empty() && request.count == 0 && default_to_gpu && !inventory.gpus.empty())
    chosen.push_back(inventory.gpus.front());
  std::sort(chosen.begin(), chosen.end(), [](const gpu_info& a, const gpu_info& b) { return a.index < b.index; });
  for (const auto& g : chosen) check_fits(g, mem_limit);
  return chosen;
}

slot_plan plan_slots(const slot_request& s, const gpu_inventory& inv, unsigned cores) {
  slot_plan plan;
  if (cores == 0) cores = serialization::usable_cores();
  std::vector<int> gpus = s.gpus;
  if (s.all_gpus)
    for (const auto& g : inv.gpus) gpus.push_back(g.index);
  if (s.all_gpus && gpus.empty())
    throw usage_error("all GPUs were asked for, but there are no GPUs (" + inv.describe_source() +
                      "); ask for CPU slots instead, or set ISORUN_SIMULATE_GPUS");
  if (gpus.empty()) {
    const int n = s.cpu_slots ? s.cpu_slots : static_cast<int>(cores);
    for (int i = 0; i < n; ++i) plan.slots.push_back({{}, i});
    plan.how = std::to_string(n) + " CPU slot" + (n == 1 ? "" : "s") +
               (s.cpu_slots ? " (cpu_slots)" : " (one per core)");
    return plan;
  }
  if (!s.mem_limit && !s.per_gpu)
    throw usage_error("packing jobs on GPUs needs a mem-limit (or per_gpu); e.g. --mem-limit 6G");
  const int cores_per_gpu = static_cast<int>(std::max<std::size_t>(1, cores / gpus.size()));
  for (int index : gpus) {
    const gpu_info& g = inv.at(index);  // usage_error for a missing GPU
    check_fits(g, s.mem_limit);
    if (s.per_gpu && s.mem_limit && static_cast<std::uint64_t>(s.per_gpu) * s.mem_limit > g.free_memory)
      throw usage_error("per_gpu " + std::to_string(s.per_gpu) + " x mem-limit " + format_size(s.mem_limit) +
                        " exceeds GPU " + std::to_string(index) + "'s free " + format_size(g.free_memory));
    // A job's cap includes its CUDA context, so caps simply add up against free memory.
    int n = s.per_gpu;
    std::string how = "GPU " + std::to_string(index) + ": " + std::to_string(n) + " (per_gpu)";
    if (!n) {
      const int fit = static_cast<int>(g.free_memory / s.mem_limit);
      n = std::min(fit, cores_per_gpu);
      how = "GPU " + std::to_string(index) + ": " + std::to_string(n) + " = min(" + std::to_string(fit) + " caps of " +
            format_size(s.mem_limit) + " in " + format_size(g.free_memory) + " free, " + std::to_string(cores_per_gpu) +
            " core" + (cores_per_gpu == 1 ? "" : "s") + (gpus.size() > 1 ? " per GPU)" : ")");
    }
    for (int i = 0; i < n; ++i) plan.slots.push_back({{g}, static_cast<int>(plan.slots.size())});
    plan.how += (plan.how.empty() ? "" : "; ") + how;
  }
  if (plan.slots.empty())
    throw usage_error("no job fits on the listed GPUs with mem-limit " + format_size(s.mem_limit));
  plan.how = std::to_string(plan.slots.size()) + " GPU slot" + (plan.slots.size() == 1 ? "" : "s") + " (" + plan.how +
             ")";
  return plan;
}

}  // namespace isorun::runner
