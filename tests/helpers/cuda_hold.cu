// A plain CUDA program for the GPU checks: allocates N MiB with cudaMalloc, touches it, prints
// "ready" and holds it until killed.   cuda_hold [MIB]
#include <cuda_runtime.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
  const std::size_t bytes = static_cast<std::size_t>(argc > 1 ? std::atol(argv[1]) : 1024) << 20;
  void* p = nullptr;
  if (cudaError_t rc = cudaMalloc(&p, bytes); rc != cudaSuccess) {
    std::fprintf(stderr, "cuda_hold: cudaMalloc: %s\n", cudaGetErrorString(rc));
    return 1;
  }
  cudaMemset(p, 1, bytes);
  cudaDeviceSynchronize();
  std::printf("ready\n");
  std::fflush(stdout);
  for (;;) ::pause();
}
