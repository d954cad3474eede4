#pragma once
/// @file cuda_backend.hpp
/// The CUDA backend, built into the module libisorun_cuda.so (only when nvcc is found) and
/// loaded by a worker that has a GPU. Nothing else in isorun links the CUDA runtime.
///
/// Entry points (extern "C", looked up with dlsym):
///   isorun_cuda_backend_create(int device, char* error, size_t error_size) -> backend*
///       cudaMalloc/cudaFree/cudaMemGetInfo on `device`; the virtual-memory API
///       (cuMemAddressReserve/cuMemCreate/cuMemMap/cuMemSetAccess, reached through
///       cudaGetDriverEntryPoint, so there is no link dependency on libcuda) for the
///       expandable strategy; events for cross-stream reuse. nullptr + message on failure.
///   isorun_cuda_context_bytes(int device) -> uint64_t
///       device memory this process uses right after creating its context (NVML per-process
///       usage), which the allocator's cap leaves out so that --mem-limit bounds the whole
///       footprint.
///   isorun_cuda_host_register(void* p, size_t n) / isorun_cuda_host_unregister(void* p)
///       page-lock a range (the worker's shared-memory result segment) so device-to-host copies
///       land in it directly, in one copy.
///   isorun_cuda_pinned_pool_create(size_t cap) -> pool*, isorun_cuda_pinned_alloc(pool*, n),
///   isorun_cuda_pinned_free(pool*, p), isorun_cuda_pinned_pool_destroy(pool*)
///       a small capped cache of pinned staging buffers.

namespace isorun::alloc {
inline constexpr const char* cuda_module_name = "libisorun_cuda.so";
}
