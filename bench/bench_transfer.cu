// The physical building blocks of a GPU result's way into shared memory, each measured alone on
// this machine, so the result path can be designed from numbers rather than guesses (skipped,
// exit 77, without a GPU):
//   - making a memfd segment's pages exist, and mapping pages that already exist (one thread,
//     MAP_POPULATE; several threads, MADV_POPULATE_WRITE), and unmapping them;
//   - page-locking a resident mapping (cudaHostRegister) and letting go of it;
//   - the DMA into a page-locked mapping, and into cudaHostAlloc memory;
//   - a pipelined copy through a small pinned staging ring into a mapped segment, the ring's
//     slots drained by several threads that also hash what they copy;
//   - hashing 1 GiB on several threads (the supervisor's validation).
//   bench_transfer [MiB ...]          (default: 1024 4096)
#include <cuda_runtime.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace {
constexpr std::size_t MiB = 1 << 20;

void check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(rc));
    std::exit(1);
  }
}

double ms_of(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void parallel(unsigned threads, const std::function<void(unsigned)>& f) {
  std::vector<std::thread> t;
  for (unsigned i = 1; i < threads; ++i) t.emplace_back(f, i);
  f(0);
  for (auto& x : t) x.join();
}

std::byte* map(int fd, std::size_t n, int extra) {
  void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED | extra, fd, 0);
  if (p == MAP_FAILED) {
    std::perror("mmap");
    std::exit(1);
  }
  return static_cast<std::byte*>(p);
}

// Populates [p, p+n) with `threads` threads, each a contiguous share.
void populate(std::byte* p, std::size_t n, unsigned threads) {
  parallel(threads, [&](unsigned i) {
    const std::size_t share = (n / threads + (2 * MiB - 1)) & ~(2 * MiB - 1);
    const std::size_t begin = std::min(n, i * share), end = std::min(n, begin + share);
    if (end > begin && ::madvise(p + begin, end - begin, MADV_POPULATE_WRITE) != 0) std::perror("madvise");
  });
}

// XXH3 of 4 MiB chunks on `threads` threads: what the supervisor's validation does.
void hash(const std::byte* p, std::size_t n, unsigned threads) {
  std::atomic<std::size_t> next{0};
  std::vector<std::uint64_t> h(n / (4 * MiB) + 1);
  parallel(threads, [&](unsigned) {
    for (std::size_t i; (i = next++) * 4 * MiB < n;)
      h[i] = XXH3_64bits(p + i * 4 * MiB, std::min(4 * MiB, n - i * 4 * MiB));
  });
}

// DMA of `n` bytes from `dev` into `dst` (pageable, mapped) through `slots` pinned buffers of
// `slot` bytes; each slot, once its copy has landed, is drained by `threads` threads copying and
// hashing 256 KiB pieces, while the DMA of the next slots goes on.
void staged(std::byte* dst, const std::byte* dev, std::size_t n, std::vector<std::byte*>& ring, std::size_t slot,
            unsigned threads, cudaStream_t stream, std::vector<cudaEvent_t>& landed) {
  const std::size_t pieces = (n + slot - 1) / slot, k = ring.size();
  for (std::size_t i = 0; i < std::min(k, pieces); ++i)
    check(cudaMemcpyAsync(ring[i], dev + i * slot, std::min(slot, n - i * slot), cudaMemcpyDeviceToHost, stream),
          "async"),
        check(cudaEventRecord(landed[i], stream), "event");
  for (std::size_t i = 0; i < pieces; ++i) {
    check(cudaEventSynchronize(landed[i % k]), "sync");
    const std::size_t len = std::min(slot, n - i * slot);
    std::atomic<std::size_t> next{0};
    parallel(threads, [&](unsigned) {
      constexpr std::size_t piece = 256 * 1024;
      for (std::size_t j; (j = next++) * piece < len;) {
        const std::size_t m = std::min(piece, len - j * piece);
        std::memcpy(dst + i * slot + j * piece, ring[i % k] + j * piece, m);
        (void)XXH3_64bits(dst + i * slot + j * piece, m);
      }
    });
    if (i + k < pieces) {
      check(cudaMemcpyAsync(ring[i % k], dev + (i + k) * slot, std::min(slot, n - (i + k) * slot),
                            cudaMemcpyDeviceToHost, stream),
            "async");
      check(cudaEventRecord(landed[i % k], stream), "event");
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::puts("bench_transfer: no GPU here; skipped");
    return 77;
  }
  std::vector<std::size_t> sizes;
  for (int i = 1; i < argc; ++i) sizes.push_back(std::strtoull(argv[i], nullptr, 10) * MiB);
  if (sizes.empty()) sizes = {1024 * MiB, 4096 * MiB};
  std::string thp;
  std::getline(std::ifstream("/sys/kernel/mm/transparent_hugepage/shmem_enabled"), thp);
  const unsigned cores = std::thread::hardware_concurrency();
  std::printf("bench_transfer: %u cores, shmem THP: %s\n", cores, thp.c_str());
  check(cudaFree(nullptr), "context");
  const int reps = 5;

  for (const std::size_t n : sizes) {
    const double gb = static_cast<double>(n) / 1e9;
    auto rate = [&](double ms) { return gb / (ms / 1e3); };
    std::byte* dev = nullptr;
    check(cudaMalloc(&dev, n), "cudaMalloc");
    check(cudaMemset(dev, 7, n), "memset");
    std::printf("\n%zu MiB (medians of %d; GB/s where it is a transfer)\n", n / MiB, reps);

    std::vector<double> fresh, remap1, remap16, unmap, reg, unreg, dma_reg, hash16, hash8;
    for (int r = 0; r < reps; ++r) {
      const int fd = ::memfd_create("bench", MFD_CLOEXEC);
      if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(n)) != 0) return 1;
      std::byte* p = nullptr;
      fresh.push_back(ms_of([&] { p = map(fd, n, MAP_POPULATE); }));
      unmap.push_back(ms_of([&] { ::munmap(p, n); }));
      remap1.push_back(ms_of([&] { p = map(fd, n, MAP_POPULATE); }));
      ::munmap(p, n);
      p = map(fd, n, 0);
      remap16.push_back(ms_of([&] { populate(p, n, std::min(16u, cores)); }));
      reg.push_back(ms_of([&] { check(cudaHostRegister(p, n, cudaHostRegisterDefault), "register"); }));
      dma_reg.push_back(ms_of([&] { check(cudaMemcpy(p, dev, n, cudaMemcpyDeviceToHost), "dma"); }));
      unreg.push_back(ms_of([&] { check(cudaHostUnregister(p), "unregister"); }));
      hash16.push_back(ms_of([&] { hash(p, n, std::min(16u, cores)); }));
      hash8.push_back(ms_of([&] { hash(p, n, std::min(8u, cores)); }));
      ::munmap(p, n);
      ::close(fd);
    }
    std::printf("  new pages, mmap MAP_POPULATE            %8.1f ms\n", median(fresh));
    std::printf("  munmap of a populated mapping          %8.1f ms\n", median(unmap));
    std::printf("  resident pages, mmap MAP_POPULATE       %8.1f ms\n", median(remap1));
    std::printf("  resident pages, MADV_POPULATE_WRITE x%-2u %8.1f ms\n", std::min(16u, cores), median(remap16));
    std::printf("  cudaHostRegister of the mapping         %8.1f ms\n", median(reg));
    std::printf("  cudaHostUnregister                      %8.1f ms\n", median(unreg));
    std::printf("  DMA into the registered mapping         %8.1f ms  %6.1f GB/s\n", median(dma_reg),
                rate(median(dma_reg)));
    std::printf("  XXH3 4 MiB chunks, 16 threads           %8.1f ms  %6.1f GB/s\n", median(hash16),
                rate(median(hash16)));
    std::printf("  XXH3 4 MiB chunks,  8 threads           %8.1f ms  %6.1f GB/s\n", median(hash8), rate(median(hash8)));

    // The pinned reference.
    std::byte* pinned = nullptr;
    check(cudaHostAlloc(reinterpret_cast<void**>(&pinned), n, cudaHostAllocDefault), "hostalloc");
    check(cudaMemcpy(pinned, dev, n, cudaMemcpyDeviceToHost), "warm");
    std::vector<double> ref;
    for (int r = 0; r < reps; ++r)
      ref.push_back(ms_of([&] { check(cudaMemcpy(pinned, dev, n, cudaMemcpyDeviceToHost), "dma"); }));
    check(cudaFreeHost(pinned), "freehost");
    std::printf("  DMA into cudaHostAlloc memory           %8.1f ms  %6.1f GB/s  (the reference)\n", median(ref),
                rate(median(ref)));

    // Staged through a pinned ring into a resident, populated mapping.
    const int fd = ::memfd_create("bench", MFD_CLOEXEC);
    if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(n)) != 0) return 1;
    std::byte* p = map(fd, n, MAP_POPULATE);
    cudaStream_t stream;
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
    for (const std::size_t slot : {8 * MiB, 32 * MiB}) {
      for (const std::size_t k : {std::size_t{2}, std::size_t{4}}) {
        std::vector<std::byte*> ring(k);
        std::vector<cudaEvent_t> landed(k);
        for (std::size_t i = 0; i < k; ++i) {
          check(cudaHostAlloc(reinterpret_cast<void**>(&ring[i]), slot, cudaHostAllocDefault), "ring");
          check(cudaEventCreateWithFlags(&landed[i], cudaEventDisableTiming), "event");
        }
        for (const unsigned threads : {4u, 8u, 16u}) {
          if (threads > cores) continue;
          std::vector<double> t;
          for (int r = 0; r < reps; ++r)
            t.push_back(ms_of([&] { staged(p, dev, n, ring, slot, threads, stream, landed); }));
          std::printf("  staged: %zu x %2zu MiB ring, %2u threads copy+hash %6.1f ms  %6.1f GB/s\n", k, slot / MiB,
                      threads, median(t), rate(median(t)));
        }
        for (std::size_t i = 0; i < k; ++i) cudaFreeHost(ring[i]), cudaEventDestroy(landed[i]);
      }
    }
    // The same into a mapping of resident pages not yet in this process's page tables.
    {
      std::vector<std::byte*> ring(4);
      std::vector<cudaEvent_t> landed(4);
      for (std::size_t i = 0; i < 4; ++i) {
        check(cudaHostAlloc(reinterpret_cast<void**>(&ring[i]), 8 * MiB, cudaHostAllocDefault), "ring");
        check(cudaEventCreateWithFlags(&landed[i], cudaEventDisableTiming), "event");
      }
      std::vector<double> t;
      for (int r = 0; r < reps; ++r) {
        ::munmap(p, n);
        p = map(fd, n, 0);
        t.push_back(ms_of([&] { staged(p, dev, n, ring, 8 * MiB, std::min(16u, cores), stream, landed); }));
      }
      std::printf("  staged into an unpopulated mapping (faults), 4 x 8 MiB, 16 threads %6.1f ms  %6.1f GB/s\n",
                  median(t), rate(median(t)));
      for (std::size_t i = 0; i < 4; ++i) cudaFreeHost(ring[i]), cudaEventDestroy(landed[i]);
    }
    ::munmap(p, n);
    ::close(fd);
    cudaStreamDestroy(stream);
    cudaFree(dev);
  }
  return 0;
}
