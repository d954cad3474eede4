#pragma once
/// @file standby_plan.hpp
/// How a sweep's local slots keep workers on standby: the plan the local backend follows and the
/// CLI prints.

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "isorun/sweep/spec.hpp"

namespace isorun::sweep {

/// Workers a group of slots keeps on standby: while a slot's trial runs, its next worker is
/// launched and waits, so trials do not wait for process starts. Each is used for one trial.
struct standby_group {
  std::optional<gpu_info> gpu;  ///< the GPU the group's slots share; nullopt: the CPU slots
  std::size_t waiting = 0;      ///< workers kept waiting: resources.standby per slot
  bool warm = false;            ///< they create their CUDA context and capped allocator while waiting
};

/// How a sweep keeps workers on standby, and in words (the CLI prints it).
struct standby_plan {
  std::vector<standby_group> groups;
  std::string how;  ///< e.g. "standby: 1 per slot, warm on GPU 0"
};

/// @brief One group per GPU (and one for CPU slots): `s.standby` workers per slot, warm on a GPU
///        when `s.warm_context` and their contexts fit beside the slots' caps
///        (runner::warm_standby_fits), cold (exec'd, no context) otherwise.
standby_plan plan_standby(const sweep_spec& s, const std::vector<slot>& slots);

}  // namespace isorun::sweep
