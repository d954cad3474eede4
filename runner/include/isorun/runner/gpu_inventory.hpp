#pragma once
/// @file gpu_inventory.hpp
/// The GPUs the supervisor may assign. Read from NVML, loaded at run time with dlopen, so the
/// supervisor neither links against nor initializes CUDA; no driver simply means no GPUs.
/// `ISORUN_SIMULATE_GPUS=2x16G` (or `16G,24G`) replaces it with a simulated inventory, for
/// tests and dry runs on machines without GPUs.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "isorun/export.hpp"

namespace isorun::runner {

struct gpu_info {
  int index = 0;     ///< NVML index (PCI bus order)
  std::string uuid;  ///< what CUDA_VISIBLE_DEVICES gets
  std::string name;
  std::uint64_t total_memory = 0;  ///< bytes
  std::uint64_t free_memory = 0;   ///< bytes, at detection time
  bool simulated = false;          ///< from ISORUN_SIMULATE_GPUS: workers get a simulated device
};

struct ISORUN_API gpu_inventory {
  enum class origin { nvml, simulated, none };

  std::vector<gpu_info> gpus;
  origin source = origin::none;
  std::string detail;  ///< why there are none, or where they came from

  /// @brief ISORUN_SIMULATE_GPUS if set, else NVML, else an empty inventory.
  /// @throws parse_error if ISORUN_SIMULATE_GPUS is malformed.
  static gpu_inventory detect();

  /// @brief Fresh figures (free memory now) for one GPU by NVML index, without enumerating the
  ///        others; the simulated GPU under ISORUN_SIMULATE_GPUS. nullopt if there is no such GPU.
  /// @throws parse_error if ISORUN_SIMULATE_GPUS is malformed.
  static std::optional<gpu_info> probe(int index);

  /// @brief One GPU's lasting facts (index, UUID, name, total memory; free_memory is 0) by NVML
  ///        index, for starting a task on it. From a cache where it is current, which spares
  ///        NVML's start (tens of milliseconds): `$XDG_CACHE_HOME/isorun/gpus` (else
  ///        `~/.cache/isorun/gpus`), holding the whole inventory under a key that changes with
  ///        the NVML library (path, size, time), the boot, the driver's version and each GPU's
  ///        `/proc/driver/nvidia/gpus/*/information` (bus, UUID, minor, excluded or not); else
  ///        from NVML, writing the cache. Without that directory in /proc (no NVIDIA driver, or
  ///        a stand-in NVML) there is no cache. Under ISORUN_SIMULATE_GPUS, the simulated GPU.
  ///        nullopt if there is no such GPU.
  /// @throws parse_error if ISORUN_SIMULATE_GPUS is malformed.
  static std::optional<gpu_info> lookup(int index);

  /// @brief A simulated inventory: `NxSIZE` groups separated by commas (`2x16G`, `16G,24G`,
  ///        `2x16G,1x80G`), or `none` for a machine without GPUs. Simulated UUIDs are
  ///        `GPU-sim-<index>`; workers on a simulated GPU get device memory the host cannot touch
  ///        (alloc::simulated_device).
  /// @throws parse_error naming the bad part.
  static gpu_inventory simulated(std::string_view spec);

  /// @brief The GPU with NVML index `index`.
  /// @throws usage_error (exit code 2) naming the available indices, `--cpu` and the simulation
  ///         variable when there is no such GPU.
  [[nodiscard]] const gpu_info& at(int index) const;

  /// @brief "NVML", "simulated (ISORUN_SIMULATE_GPUS=...)" or "none".
  [[nodiscard]] std::string describe_source() const;
};

}  // namespace isorun::runner
