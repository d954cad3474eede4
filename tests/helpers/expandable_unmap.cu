// A GPU check of the expandable strategy through the real CUDA backend: a block's pages are
// mapped in one backend call, and giving them back waits for the kernel still writing to them
// (cuMemUnmap does not, so without the wait the kernel's writes fault with an illegal address).
// Prints one line of figures and exits 0, or says what failed and exits 1.
#include <cuda_runtime.h>

#include <cstdio>
#include <memory>

#include "isorun/alloc/caching_allocator.hpp"
#include "isorun/alloc/config.hpp"
#include "isorun/alloc/cuda_module.hpp"

namespace {

// Spins for about `cycles` clock cycles, then writes the whole buffer: the writes come long
// after the host has freed the block and asked for its memory back.
__global__ void late_writer(unsigned* p, std::size_t n, long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x)
    p[i] = 0xC0FFEE;
}

}  // namespace

int main() {
  using namespace isorun::alloc;
  char error[512] = {};
  cuda_context_info context;
  std::unique_ptr<backend> memory(load_cuda_module().create_backend(nullptr, 0, &context, error, sizeof error));
  if (!memory) return std::fprintf(stderr, "expandable_unmap: %s\n", error), 1;
  constexpr std::size_t MiB = 1 << 20, bytes = 256 * MiB;
  caching_allocator a(std::move(memory), 1024 * MiB, alloc_config::parse("strategy:expandable"));
  void* p = a.allocate(bytes);
  const auto mapped = a.stats().num_backend_allocs;
  int rate_khz = 0;
  cudaDeviceGetAttribute(&rate_khz, cudaDevAttrClockRate, 0);
  late_writer<<<132, 256>>>(static_cast<unsigned*>(p), bytes / sizeof(unsigned), 300LL * rate_khz);  // ~300 ms
  a.deallocate(p);
  a.empty_cache();  // unmaps the 128 pages: must wait for late_writer first
  const cudaError_t rc = cudaDeviceSynchronize();
  const auto s = a.stats();
  std::printf(
      "expandable on CUDA: %llu map call(s) for %zu MiB, %llu unmap call(s), reserved after %lld B, kernel: %s\n",
      static_cast<unsigned long long>(mapped), bytes / MiB, static_cast<unsigned long long>(s.num_backend_frees),
      static_cast<long long>(s.reserved_bytes.current), cudaGetErrorString(rc));
  return rc == cudaSuccess && mapped == 1 && s.num_backend_frees == 1 && s.reserved_bytes.current == 0 ? 0 : 1;
}
