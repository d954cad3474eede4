#pragma once
/// @file worker_env.hpp
/// The environments isorun gives the processes it starts: what they inherit, and the variables
/// that carry an assignment (protocol.hpp names them).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "isorun/internal_api.hpp"
#include "isorun/runner/gpu_inventory.hpp"

namespace isorun::runner {

/// @brief This process's environment without any of the protocol's variables: what a worker
///        or a command inherits before its assignment is added.
ISORUN_INTERNAL_API std::vector<std::string> inherited_environment();

/// @brief The variables that assign `gpus` and `mem_limit`: CUDA_VISIBLE_DEVICES (the GPUs by
///        UUID, in the order given; empty hides every GPU), CUDA_DEVICE_ORDER=PCI_BUS_ID,
///        ISORUN_GPU (their indices, "0,1"), ISORUN_MEM_LIMIT (the cap per device).
std::vector<std::string> assignment_environment(const std::vector<gpu_info>& gpus, std::uint64_t mem_limit);

/// @brief The CUDA_VISIBLE_DEVICES value for `gpus`: their UUIDs, comma-separated ("" hides
///        every GPU).
ISORUN_INTERNAL_API std::string visible_devices_for(const std::vector<gpu_info>& gpus);

}  // namespace isorun::runner
