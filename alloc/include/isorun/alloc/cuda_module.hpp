#pragma once
/// @file cuda_module.hpp
/// The CUDA backend's module interface. The backend is built into libisorun_cuda.so (only when
/// nvcc is found) and loaded with dlopen by a worker that was assigned a real GPU, so neither the
/// supervisor nor CPU workers ever load the CUDA runtime. The module exports one function,
/// `isorun_cuda_module()`, returning a table of entry points whose `abi` must equal
/// `cuda_module_abi`.

#include <cstddef>
#include <cstdint>

#include "isorun/alloc/backend.hpp"

namespace isorun::alloc {

inline constexpr const char* cuda_module_name = "libisorun_cuda.so";
inline constexpr std::uint32_t cuda_module_abi = 3;

/// What the worker's CUDA context costs on the device, measured around its creation with NVML.
struct cuda_context_info {
  /// This process's usage right after creating the context, as NVML attributes it (0 unknown).
  std::uint64_t process_bytes = 0;
  /// The device's used memory after minus before (0 unknown); includes memory the driver
  /// reserves for the context but does not attribute to the process (a few MiB, varying with the
  /// GPU and the driver), which nvidia-smi counts.
  std::uint64_t device_delta_bytes = 0;
  /// What the allocator's cap leaves out: the device delta when it is plausible (other
  /// processes may allocate or free while it is measured), else the process figure plus a
  /// margin of `context_margin` bytes.
  std::uint64_t counted_bytes = 0;
};

/// The margin added to NVML's per-process figure when the device-level delta cannot be trusted.
inline constexpr std::uint64_t context_margin = 16ULL << 20;

/// @brief The bytes to leave out of the cap for a context, from the two measurements (see
///        cuda_context_info::counted_bytes). Shared by the module and its tests.
constexpr std::uint64_t counted_context_bytes(std::uint64_t process_bytes, std::uint64_t device_delta_bytes) {
  constexpr std::uint64_t plausible_excess = 64ULL << 20;  // far above the driver's few MiB
  if (process_bytes == 0) return device_delta_bytes;
  if (device_delta_bytes >= process_bytes && device_delta_bytes <= process_bytes + plausible_excess)
    return device_delta_bytes;
  return process_bytes + context_margin;
}

/// Entry points of libisorun_cuda.so.
struct cuda_module_api {
  std::uint32_t abi;
  /// Creates the CUDA context on device `ordinal` (one of the worker's visible GPUs, whose UUID
  /// is `uuid`), measures it into `*context`, and returns a backend for that device using
  /// cudaMalloc, the virtual-memory API (reached through cudaGetDriverEntryPointByVersion: no
  /// link dependency on libcuda) and events. Each of its calls makes the device current for
  /// itself and restores the caller's current device after. nullptr with a message in `error`
  /// on failure.
  backend* (*create_backend)(const char* uuid, int ordinal, cuda_context_info* context, char* error,
                             std::size_t error_size);
  /// Page-locks [p, p+n) (the worker's shared-memory result area) so device-to-host copies land
  /// in it directly. 0 on success.
  int (*host_register)(void* p, std::size_t n);
  /// Undoes host_register. 0 on success.
  int (*host_unregister)(void* p);
};

/// @brief The module's entry points, loaded once (dlopen keeps it loaded): from beside the
///        binary this library is linked into (libisorun.so, or a program in bin/ with lib/ next
///        to it), else from the loader's search path.
/// @throws std::runtime_error saying why not: no module (isorun built without nvcc), or a
///         module from another isorun version.
const cuda_module_api& load_cuda_module();

}  // namespace isorun::alloc

/// The module's only export.
extern "C" const isorun::alloc::cuda_module_api* isorun_cuda_module();
