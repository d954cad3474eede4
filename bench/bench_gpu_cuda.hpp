#pragma once
// The CUDA side of bench_gpu, behind plain functions so that isorun's headers never go
// through nvcc.
#include <cstddef>
#include <cstdint>

namespace bench_gpu {

/// @brief Fills `bytes` of device memory at `p` with a pattern (a kernel) and waits for it.
void fill_device(void* p, std::size_t bytes);

/// @brief The physical reference: a device buffer of `bytes` copied into cudaHostAlloc'ed memory
///        with cudaMemcpy, `reps` times after a warm-up; the median in nanoseconds.
std::uint64_t pinned_copy_ns(std::size_t bytes, int reps);

/// @brief What a bare CUDA program does for a trivial task: initialise CUDA, allocate 2 MiB,
///        free it. Returns 0 on success.
int trivial_cuda();

}  // namespace bench_gpu
