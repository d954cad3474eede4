// XXH3-64 of device memory, one thread block per chunk (see chunk_checksum.hpp for why it splits).
#include "cuda_chunk_checksum.hpp"

namespace isorun::alloc::detail {
namespace {

using xxh3::u32;
using xxh3::u64;

constexpr u32 threads = 256;  // 8 warps
constexpr u32 warps = threads / 32;
constexpr u32 phase_blocks = 256;  // 1 KiB blocks summed between two turns of the chain (16 KiB of sums)

// A block sums 256 KiB of its chunk at a time: each warp takes 1 KiB blocks in turn, its threads
// read adjacent 32-byte pieces and a shuffle sums the terms of each lane; then eight threads, one
// per lane, run the scramble chain over the sums, in order. The short forms and the tail are one
// thread's work.
__global__ void __launch_bounds__(threads) chunk_checksums(const xxh3::input in, u64 chunk, u64* out) {
  __shared__ u64 sums[phase_blocks][8];
  __shared__ u64 lanes[8];
  const u64 start = static_cast<u64>(blockIdx.x) * chunk;
  const u64 len = min(chunk, in.total() - start);
  if (len <= xxh3::short_max) {  // the same for every thread of the block, so all return here
    if (threadIdx.x == 0) out[blockIdx.x] = xxh3::hash_short(in, start, len);
    return;
  }
  const u32 t = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (threadIdx.x < 8) lanes[threadIdx.x] = xxh3::initial_lane(threadIdx.x);
  const u64 blocks = xxh3::full_blocks(len);
  for (u64 first = 0; first < blocks; first += phase_blocks) {
    const u32 n = static_cast<u32>(min(static_cast<u64>(phase_blocks), blocks - first));
    for (u32 b = warp; b < n; b += warps) {
      const u64 at = start + (first + b) * xxh3::block_bytes;
      u64 term[4];
#pragma unroll
      for (u32 j = 0; j < 4; ++j) term[j] = xxh3::warp_term(in, at, t, j);
        // Sum over the 16 threads of the same half (same t % 2): xor-butterfly over the other bits.
#pragma unroll
      for (u32 offset = 2; offset < 32; offset <<= 1)
#pragma unroll
        for (u32 j = 0; j < 4; ++j) term[j] += __shfl_xor_sync(0xffffffffu, term[j], offset);
      if (t < 2)
#pragma unroll
        for (u32 j = 0; j < 4; ++j) sums[b][4 * t + j] = term[j];
    }
    __syncthreads();
    if (threadIdx.x < 8) {
      u64 acc = lanes[threadIdx.x];
      for (u32 b = 0; b < n; ++b) acc = xxh3::scramble(in, acc + sums[b][threadIdx.x], threadIdx.x);
      lanes[threadIdx.x] = acc;
    }
    __syncthreads();
  }
  if (threadIdx.x < 8) lanes[threadIdx.x] = xxh3::finish_lane(in, start, len, lanes[threadIdx.x], threadIdx.x);
  __syncthreads();
  if (threadIdx.x == 0) out[blockIdx.x] = xxh3::merge(in, lanes, len);
}

}  // namespace

cudaError_t launch_chunk_checksums(const xxh3::input& in, u64 chunk, u64 chunks, u64* out, cudaStream_t stream) {
  if (chunks == 0) return cudaSuccess;
  if (chunks > 0x7fffffffULL) return cudaErrorInvalidValue;  // grid's x dimension
  chunk_checksums<<<static_cast<unsigned>(chunks), threads, 0, stream>>>(in, chunk, out);
  return cudaGetLastError();
}

}  // namespace isorun::alloc::detail
