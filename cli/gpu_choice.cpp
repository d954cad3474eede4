#include "gpu_choice.hpp"

#include "isorun/runner/placement.hpp"

namespace isorun::cli {

std::vector<runner::gpu_info> pick_gpus(const cli_options& o) {
  if (o.cpu) return {};
  const runner::gpu_request request{.indices = o.gpu ? std::vector<int>{*o.gpu} : o.gpus, .count = o.gpu_count};
  if (request.indices.size() == 1 && !request.count)
    if (auto g = runner::gpu_inventory::lookup(request.indices.front())) {
      runner::check_fits(*g, o.mem_limit);
      return {*g};
    }
  return runner::place_job(runner::gpu_inventory::detect(), request, true, o.mem_limit);
}

}  // namespace isorun::cli
