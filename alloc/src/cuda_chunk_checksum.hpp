#pragma once
/// @file cuda_chunk_checksum.hpp
/// The CUDA kernel behind cuda_backend's checksum_chunks (see chunk_checksum.hpp).

#include <cuda_runtime.h>

#include "chunk_checksum.hpp"

namespace isorun::alloc::detail {

/// @brief Queues on `stream` the XXH3-64 of every `chunk`-byte piece of `in` into out[0..chunks),
///        one thread block per chunk. `out` must be writable by the device (page-locked host
///        memory will do). @return the launch's error (cudaSuccess once queued).
cudaError_t launch_chunk_checksums(const xxh3::input& in, std::uint64_t chunk, std::uint64_t chunks, std::uint64_t* out,
                                   cudaStream_t stream);

}  // namespace isorun::alloc::detail
