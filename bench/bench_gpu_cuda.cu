#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_gpu_cuda.hpp"

namespace bench_gpu {
namespace {

void check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(rc));
}

__global__ void pattern(std::uint32_t* p, std::size_t words) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < words;
       i += std::size_t(gridDim.x) * blockDim.x)
    p[i] = static_cast<std::uint32_t>(i * 2654435761u);
}

}  // namespace

void fill_device(void* p, std::size_t bytes) {
  pattern<<<1024, 256>>>(static_cast<std::uint32_t*>(p), bytes / sizeof(std::uint32_t));
  check(cudaGetLastError(), "fill kernel");
  check(cudaDeviceSynchronize(), "fill kernel");
}

std::uint64_t pinned_copy_ns(std::size_t bytes, int reps) {
  void *dev = nullptr, *host = nullptr;
  check(cudaMalloc(&dev, bytes), "cudaMalloc");
  check(cudaHostAlloc(&host, bytes, cudaHostAllocDefault), "cudaHostAlloc");
  fill_device(dev, bytes);
  check(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost), "warm-up copy");
  std::vector<std::uint64_t> ns;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    check(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
    ns.push_back(static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count()));
  }
  cudaFreeHost(host);
  cudaFree(dev);
  std::sort(ns.begin(), ns.end());
  return ns[ns.size() / 2];
}

int trivial_cuda() {
  void* p = nullptr;
  if (cudaMalloc(&p, 2 << 20) != cudaSuccess) return 1;
  return cudaFree(p) == cudaSuccess ? 0 : 1;
}

}  // namespace bench_gpu
