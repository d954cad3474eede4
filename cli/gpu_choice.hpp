#pragma once
// Which GPUs a task or a -- CMD runs on.

#include <vector>

#include "isorun/runner/gpu_inventory.hpp"
#include "options.hpp"

namespace isorun::cli {

/// @brief The GPUs of --gpu N, --gpus LIST / any:N, or --cpu (none); by default the first GPU,
///        if there is one. One explicit GPU is looked up alone (from the inventory cache where it
///        is current, else from NVML); the whole inventory is read only to choose, or to name the
///        GPUs there are when one asked for is not.
/// @throws usage_error if they do not exist or the cap does not fit on them.
std::vector<runner::gpu_info> pick_gpus(const cli_options& o);

}  // namespace isorun::cli
