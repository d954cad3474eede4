#pragma once
/// @file chunk_checksum.hpp
/// XXH3-64 (seed 0), chunk by chunk, of bytes that lie in device memory, written in the shape a
/// GPU computes it. One set of functions serves the CUDA kernel (cuda_chunk_checksum.cu) and the
/// simulated device, so CI runs the same decomposition the GPU runs; tests compare both with
/// libxxhash's XXH3_64bits.
///
/// Why XXH3 can be split at all: for inputs over 240 bytes it keeps 8 64-bit lanes, adds to
/// them, stripe by 64-byte stripe, a term that depends on the stripe and the secret only, and
/// scrambles every lane after each 1 KiB block. Additions commute, so the 16 stripes of a block
/// can be summed by many threads in any order; only the scramble from block to block is a chain,
/// and it is a few instructions per lane. A GPU sums blocks on every thread of a warp and leaves
/// the chain to eight threads.
///
/// The input is a short header in host memory (a result's length tag) followed by the device
/// bytes, so a chunk's checksum covers exactly what the host will receive.

#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define ISORUN_HD __host__ __device__
#else
#define ISORUN_HD
#endif

namespace isorun::alloc::detail::xxh3 {

using u64 = std::uint64_t;
using u32 = std::uint32_t;

/// xxhash 0.8's XXH3_kSecret (the algorithm's output is stable across 0.8.x).
inline constexpr unsigned char default_secret[192] = {
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c, 0xde, 0xd4,
    0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f, 0xcb, 0x79, 0xe6, 0x4e,
    0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21, 0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43,
    0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c, 0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb,
    0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3, 0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19,
    0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8, 0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7,
    0xc7, 0x0b, 0x4f, 0x1d, 0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78,
    0x73, 0x64, 0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e, 0x2b, 0x16,
    0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce, 0x45, 0xcb, 0x3a, 0x8f,
    0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
};

inline constexpr u64 prime32_1 = 0x9E3779B1U, prime32_2 = 0x85EBCA77U, prime32_3 = 0xC2B2AE3DU;
inline constexpr u64 prime64_1 = 0x9E3779B185EBCA87ULL, prime64_2 = 0xC2B2AE3D27D4EB4FULL,
                     prime64_3 = 0x165667B19E3779F9ULL, prime64_4 = 0x85EBCA77C2B2AE63ULL,
                     prime64_5 = 0x27D4EB2F165667C5ULL;
inline constexpr u64 stripe_bytes = 64;   // 8 lanes of 8 bytes
inline constexpr u64 block_bytes = 1024;  // 16 stripes, then a scramble
inline constexpr u64 short_max = 240;     // inputs up to this size take the short forms
inline constexpr u32 max_header = 16;

/// What is checksummed: `header_bytes` bytes of `header`, then `bytes` bytes at `data`. Passed by
/// value to the kernel (with the secret, so device code reads it from parameter space).
struct input {
  unsigned char secret[192];
  unsigned char header[max_header];
  u32 header_bytes;
  const unsigned char* data;  // device memory on a GPU; the simulated device's host alias
  u64 bytes;

  [[nodiscard]] ISORUN_HD u64 total() const { return header_bytes + bytes; }
};

/// @brief An input; `header_bytes` must be at most max_header.
inline input make_input(const void* header, u32 header_bytes, const void* data, u64 bytes) {
  input in{};
  std::memcpy(in.secret, default_secret, sizeof in.secret);
  if (header_bytes) std::memcpy(in.header, header, header_bytes);
  in.header_bytes = header_bytes;
  in.data = static_cast<const unsigned char*>(data);
  in.bytes = bytes;
  return in;
}

ISORUN_HD inline u64 byte_at(const input& in, u64 x) {
  return x < in.header_bytes ? in.header[x] : in.data[x - in.header_bytes];
}
/// Little-endian 64-bit word at offset `x` of the input: one load where it is aligned in the
/// data (every stripe of a chunk, when the header is 8 bytes), byte by byte elsewhere.
ISORUN_HD inline u64 read64(const input& in, u64 x) {
  if (x >= in.header_bytes) {
    const unsigned char* p = in.data + (x - in.header_bytes);
    if ((reinterpret_cast<std::uintptr_t>(p) & 7) == 0) {
#ifdef __CUDA_ARCH__
      return *reinterpret_cast<const u64*>(p);
#else
      u64 v;  // one load, without type-punning on the host
      std::memcpy(&v, p, sizeof v);
      return v;
#endif
    }
  }
  u64 v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | byte_at(in, x + static_cast<u64>(i));
  return v;
}
ISORUN_HD inline u32 read32(const input& in, u64 x) {
  u32 v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<u32>(byte_at(in, x + static_cast<u64>(i)));
  return v;
}
ISORUN_HD inline u64 key64(const input& in, u32 at) {
  u64 v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | in.secret[at + static_cast<u32>(i)];
  return v;
}
ISORUN_HD inline u32 key32(const input& in, u32 at) {
  u32 v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | in.secret[at + static_cast<u32>(i)];
  return v;
}

ISORUN_HD inline u64 mul128_fold64(u64 a, u64 b) {
#ifdef __CUDA_ARCH__
  return (a * b) ^ __umul64hi(a, b);
#else
  __extension__ using u128 = unsigned __int128;  // GCC's, as libxxhash uses on 64-bit hosts
  const u128 p = static_cast<u128>(a) * b;
  return static_cast<u64>(p) ^ static_cast<u64>(p >> 64);
#endif
}
ISORUN_HD inline u64 rotl64(u64 v, int r) { return (v << r) | (v >> (64 - r)); }
ISORUN_HD inline u64 swap64(u64 v) {
  u64 r = 0;
  for (int i = 0; i < 8; ++i) r = (r << 8) | ((v >> (8 * i)) & 0xff);
  return r;
}
ISORUN_HD inline u64 avalanche(u64 h) {
  h ^= h >> 37;
  h *= 0x165667919E3779F9ULL;
  return h ^ (h >> 32);
}
ISORUN_HD inline u64 xxh64_avalanche(u64 h) {
  h ^= h >> 33;
  h *= prime64_2;
  h ^= h >> 29;
  h *= prime64_3;
  return h ^ (h >> 32);
}
ISORUN_HD inline u64 rrmxmx(u64 h, u64 len) {
  h ^= rotl64(h, 49) ^ rotl64(h, 24);
  h *= 0x9FB21C651E98DF25ULL;
  h ^= (h >> 35) + len;
  h *= 0x9FB21C651E98DF25ULL;
  return h ^ (h >> 28);
}
ISORUN_HD inline u64 mix16(const input& in, u64 x, u32 key) {
  return mul128_fold64(read64(in, x) ^ key64(in, key), read64(in, x + 8) ^ key64(in, key + 8));
}

/// @brief XXH3-64 of input bytes [start, start + len), len <= short_max (one thread's work).
ISORUN_HD inline u64 hash_short(const input& in, u64 start, u64 len) {
  if (len > 16) {
    u64 acc = len * prime64_1;
    if (len > 128) {
      const u32 rounds = static_cast<u32>(len / 16);
      for (u32 i = 0; i < 8; ++i) acc += mix16(in, start + 16 * i, 16 * i);
      acc = avalanche(acc);
      for (u32 i = 8; i < rounds; ++i) acc += mix16(in, start + 16 * i, 16 * (i - 8) + 3);
      return avalanche(acc + mix16(in, start + len - 16, 136 - 17));
    }
    if (len > 32) {
      if (len > 64) {
        if (len > 96) {
          acc += mix16(in, start + 48, 96);
          acc += mix16(in, start + len - 64, 112);
        }
        acc += mix16(in, start + 32, 64);
        acc += mix16(in, start + len - 48, 80);
      }
      acc += mix16(in, start + 16, 32);
      acc += mix16(in, start + len - 32, 48);
    }
    acc += mix16(in, start, 0);
    acc += mix16(in, start + len - 16, 16);
    return avalanche(acc);
  }
  if (len > 8) {
    const u64 lo = read64(in, start) ^ (key64(in, 24) ^ key64(in, 32));
    const u64 hi = read64(in, start + len - 8) ^ (key64(in, 40) ^ key64(in, 48));
    return avalanche(len + swap64(lo) + hi + mul128_fold64(lo, hi));
  }
  if (len >= 4) {
    const u64 first = read32(in, start), last = read32(in, start + len - 4);
    return rrmxmx((last + (first << 32)) ^ (key64(in, 8) ^ key64(in, 16)), len);
  }
  if (len > 0) {
    const u32 c1 = static_cast<u32>(byte_at(in, start)), c2 = static_cast<u32>(byte_at(in, start + (len >> 1))),
              c3 = static_cast<u32>(byte_at(in, start + len - 1));
    const u32 combined = (c1 << 16) | (c2 << 24) | c3 | (static_cast<u32>(len) << 8);
    return xxh64_avalanche(static_cast<u64>(combined) ^ static_cast<u64>(key32(in, 0) ^ key32(in, 4)));
  }
  return xxh64_avalanche(key64(in, 56) ^ key64(in, 64));
}

// The long form (len > short_max), lane by lane.

/// A lane's starting value.
ISORUN_HD inline u64 initial_lane(u32 lane) {
  constexpr u64 init[8] = {prime32_3, prime64_1, prime64_2, prime64_3, prime64_4, prime32_2, prime64_5, prime32_1};
  return init[lane];
}
/// What the stripe at input offset `at` adds to `lane`, keyed from secret offset `key`: the
/// neighbouring lane's word, plus the 32x32 product of the lane's own word with its key.
ISORUN_HD inline u64 stripe_term(const input& in, u64 at, u32 key, u32 lane) {
  const u64 keyed = read64(in, at + 8 * lane) ^ key64(in, key + 8 * lane);
  return read64(in, at + 8 * (lane ^ 1)) + (keyed & 0xFFFFFFFFULL) * (keyed >> 32);
}
/// Full 1 KiB blocks of a chunk of `len` bytes (each followed by a scramble); the rest is its tail.
ISORUN_HD inline u64 full_blocks(u64 len) { return (len - 1) / block_bytes; }
/// The scramble after each full block.
ISORUN_HD inline u64 scramble(const input& in, u64 acc, u32 lane) {
  acc ^= acc >> 47;
  acc ^= key64(in, 128 + 8 * lane);
  return acc * prime32_1;
}
/// In a warp, thread `t` (0-31) takes stripe t / 2 of a block and half t % 2 of its lanes: its
/// 32 bytes are next to its neighbours', so a warp reads a block in one sweep. This is term `j`
/// (0-3) of that thread, for lane 4 * (t % 2) + j; summed over the 16 threads of the same half,
/// the terms are what the block adds to that lane.
ISORUN_HD inline u64 warp_term(const input& in, u64 block_at, u32 t, u32 j) {
  const u32 stripe = t >> 1;
  return stripe_term(in, block_at + stripe * stripe_bytes, 8 * stripe, 4 * (t & 1) + j);
}
/// A lane after the full blocks: the partial last block's stripes and the last 64 bytes.
ISORUN_HD inline u64 finish_lane(const input& in, u64 start, u64 len, u64 acc, u32 lane) {
  const u64 tail_at = start + full_blocks(len) * block_bytes;
  const u64 stripes = ((len - 1) - full_blocks(len) * block_bytes) / stripe_bytes;
  for (u64 s = 0; s < stripes; ++s) acc += stripe_term(in, tail_at + s * stripe_bytes, static_cast<u32>(8 * s), lane);
  return acc + stripe_term(in, start + len - stripe_bytes, 192 - 64 - 7, lane);
}
/// @brief The checksum from the 8 finished lanes.
ISORUN_HD inline u64 merge(const input& in, const u64* acc, u64 len) {
  u64 result = len * prime64_1;
  for (u32 i = 0; i < 4; ++i)
    result += mul128_fold64(acc[2 * i] ^ key64(in, 11 + 16 * i), acc[2 * i + 1] ^ key64(in, 11 + 16 * i + 8));
  return avalanche(result);
}

/// @brief XXH3-64 of input bytes [start, start + len) on the host, through the same terms a warp
///        sums (each block's terms in warp order, then the chain): the simulated device's kernel.
inline u64 hash_chunk(const input& in, u64 start, u64 len) {
  if (len <= short_max) return hash_short(in, start, len);
  u64 acc[8];
  for (u32 lane = 0; lane < 8; ++lane) acc[lane] = initial_lane(lane);
  const u64 blocks = full_blocks(len);
  for (u64 b = 0; b < blocks; ++b) {
    u64 sum[8] = {};
    for (u32 t = 0; t < 32; ++t)
      for (u32 j = 0; j < 4; ++j) sum[4 * (t & 1) + j] += warp_term(in, start + b * block_bytes, t, j);
    for (u32 lane = 0; lane < 8; ++lane) acc[lane] = scramble(in, acc[lane] + sum[lane], lane);
  }
  for (u32 lane = 0; lane < 8; ++lane) acc[lane] = finish_lane(in, start, len, acc[lane], lane);
  return merge(in, acc, len);
}

}  // namespace isorun::alloc::detail::xxh3
