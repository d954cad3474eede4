// Drives the CUDA driver API the ways real programs do, for the `-- CMD` cap tests: libcuda is
// dlopen'ed and its functions found with dlsym ("direct") or through cuGetProcAddress_v2
// ("proc"), as the CUDA runtime does. Runs its arguments as steps, one output line each:
//   info                 "info FREE TOTAL" (cuMemGetInfo, MiB)
//   device N             makes device N's primary context current: "device N CODE"
//   ctx-create N         creates a context of its own on device N (current): "ctx-create N CODE"
//   async MIB            one cuMemAllocAsync from the device's pool, kept: "async CODE"
//   async-free           cuMemFreeAsync of every block `async` kept (back into the pool): "async-freed"
//   cycles N MIB         N cuMemAllocAsync/cuMemFreeAsync pairs: "cycles N CODE" (the first failure's)
//   sync                 cuStreamSynchronize: pools give back what is above their threshold: "synced"
//   trim MIB             cuMemPoolTrimTo(the device's pool, MIB): "trimmed CODE"
//   share MIB            cuMemCreate of MIB, exported, imported back (as NCCL shares memory), an
//                        IPC pointer opened; all kept: "share CODE CODE CODE CODE"
//   unshare              releases what `share` holds, the imported handle first: "unshared"
//   create-on N MIB      one cuMemCreate with properties naming device N: "create-on CODE"
//   fill MIB VIA         allocates MIB-sized blocks until refused: "filled N code C"
//   create MIB           one cuMemCreate: "create CODE"
//   free                 frees everything this process holds: "freed"
//   hold MIB             allocates MIB, says "holding", waits for stdin to close, exits
//   pair MIB             a second process holds MIB meanwhile: "pair N" (blocks this one got)
//   crash MIB            a second process holds MIB and is killed: "crash N" (blocks got after)
//   time N [KIND]        N allocation pairs: "time NS" per pair; cuMemAlloc_v2/cuMemFree_v2 of
//                        64 KiB, or "async" cuMemAllocAsync/cuMemFreeAsync of 64 KiB, or "create"
//                        cuMemCreate/cuMemRelease of 2 MiB
//   exec MIB STEPS...    holds MIB, then execs itself with STEPS (same pid, a new image)
//   arrays MIB KIND      creates MIB-sized 2D ("2d") or 3D ("3d") float arrays, or mipmapped
//                        ones of two levels ("mip": MIB and MIB/8), until refused, destroys
//                        them: "arrays N code C"
//   holders N MIB        N more processes of the command each hold MIB until this one ends:
//                        "holders N"
//   raise-limit          tries to raise the cap by writing its terms: "raise-limit refused" or
//                        "raise-limit done" (or "raise-limit no-terms")
//   truncate-ledger      tries to cut the cap's ledger to nothing: "truncate-ledger refused" or
//                        "truncate-ledger done"
//   set NAME=VALUE       sets a variable, as a standby worker's call sets the cap's (no output)
//   bind                 calls the cap library's isorun_cap_bind, as a worker does once it set its
//                        call's variables: "bind RC", or "bind none" without the library
//   nvml                 NVML's memory figures of device 0 (MiB), as pynvml finds them (dlsym on
//                        libnvidia-ml.so.1): "nvml TOTAL USED FREE v2 TOTAL USED FREE"
//   fork                 forks a child, as a DataLoader worker is forked after CUDA was
//                        initialised: it frees what it inherited of `async` (a careless cleanup;
//                        the memory is its parent's) and ends with exit(), so that what a library
//                        does at exit runs: "fork FREE FREE", cuMemGetInfo's free MiB in this
//                        process while the child lives and after it has ended
//   spawn-clean STEPS... runs itself with STEPS in a child whose environment has only
//                        LD_LIBRARY_PATH (no LD_PRELOAD, no isorun variables) and waits for it
//   execveat-clean STEPS... the same, started with fork and execveat
//   pidfd-spawn-clean STEPS... the same, started with pidfd_spawn (glibc 2.39), found as a program
//                        built there finds it; "pidfd_spawn absent" where the C library lacks it
// Before libcuda is loaded, a leading "unset NAME" removes variable NAME from the environment.
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

extern char** environ;

namespace {
using CUresult = int;
using CUdeviceptr = unsigned long long;
using alloc_t = CUresult (*)(CUdeviceptr*, std::size_t);
using free_t = CUresult (*)(CUdeviceptr);
using info_t = CUresult (*)(std::size_t*, std::size_t*);
using create_t = CUresult (*)(unsigned long long*, std::size_t, const void*, unsigned long long);
using proc_t = CUresult (*)(const char*, void**, int, unsigned long long, void*);
constexpr std::size_t MiB = 1 << 20;

void* lib;
template <class F>
F direct(const char* name) {
  return reinterpret_cast<F>(::dlsym(lib, name));
}
template <class F>
F via_proc(const char* base) {
  void* p = nullptr;
  direct<proc_t>("cuGetProcAddress_v2")(base, &p, 12000, 0, nullptr);
  return reinterpret_cast<F>(p);
}

std::vector<CUdeviceptr> held;

int fill(std::size_t mib, alloc_t alloc) {
  for (int n = 0;; ++n) {
    CUdeviceptr p = 0;
    if (CUresult rc = alloc(&p, mib * MiB); rc != 0) return n * 1000 + rc;  // blocks, code
    held.push_back(p);
  }
}

// Starts "cap_probe hold MIB" with pipes; returns its pid once it says it holds.
pid_t start_holder(const char* self, const std::string& mib, int& stdin_write) {
  int in[2], out[2];
  // Close-on-exec: a holder must not keep another holder's stdin open.
  if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) std::exit(1);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_addclose(&fa, in[1]);
  posix_spawn_file_actions_addclose(&fa, out[0]);
  const char* argv[] = {self, "hold", mib.c_str(), nullptr};
  pid_t pid;
  if (::posix_spawn(&pid, self, &fa, nullptr, const_cast<char**>(argv), environ) != 0) std::exit(1);
  ::close(in[0]);
  ::close(out[1]);
  char buf[64] = {};
  if (::read(out[0], buf, sizeof buf - 1) <= 0) std::exit(1);  // "holding"
  ::close(out[0]);
  stdin_write = in[1];
  return pid;
}
}  // namespace

int main(int argc, char** argv) {
  int first = 1;
  if (argc > 2 && std::string(argv[1]) == "unset") {
    ::unsetenv(argv[2]);
    first = 3;
  }
  lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    std::printf("no libcuda: %s\n", ::dlerror());
    return 1;
  }
  reinterpret_cast<CUresult (*)(unsigned)>(::dlsym(lib, "cuInit"))(0);
  void* ctx = nullptr;
  via_proc<CUresult (*)(void**, int)>("cuDevicePrimaryCtxRetain")(&ctx, 0);
  via_proc<CUresult (*)(void*)>("cuCtxSetCurrent")(ctx);  // the real driver allocates only in a current context
  const auto free_fn = direct<free_t>("cuMemFree_v2");
  std::vector<int> holders;                        // pipes to the processes of "holders"
  std::vector<unsigned long long> async_held;      // blocks of "async"
  std::vector<unsigned long long> shared_handles;  // of "share"
  for (int i = first; i < argc; ++i) {
    const std::string step = argv[i];
    auto arg = [&] { return std::string(i + 1 < argc ? argv[++i] : "0"); };
    if (step == "info") {
      std::size_t f = 0, t = 0;
      via_proc<info_t>("cuMemGetInfo")(&f, &t);
      std::printf("info %zu %zu\n", f / MiB, t / MiB);
    } else if (step == "fill") {
      const std::size_t mib = std::stoul(arg());
      const auto alloc = arg() == "proc" ? via_proc<alloc_t>("cuMemAlloc") : direct<alloc_t>("cuMemAlloc_v2");
      const int r = fill(mib, alloc);
      std::printf("filled %d code %d\n", r / 1000, r % 1000);
    } else if (step == "device") {
      const int d = std::stoi(arg());
      void* c = nullptr;
      CUresult rc = via_proc<CUresult (*)(void**, int)>("cuDevicePrimaryCtxRetain")(&c, d);
      if (rc == 0) rc = via_proc<CUresult (*)(void*)>("cuCtxSetCurrent")(c);
      std::printf("device %d %d\n", d, rc);
    } else if (step == "async" || step == "cycles") {
      using async_t = CUresult (*)(unsigned long long*, std::size_t, void*);
      using async_free_t = CUresult (*)(unsigned long long, void*);
      const auto alloc = via_proc<async_t>("cuMemAllocAsync");
      const auto release = via_proc<async_free_t>("cuMemFreeAsync");
      if (step == "async") {
        unsigned long long p = 0;
        const CUresult rc = alloc(&p, std::stoul(arg()) * MiB, nullptr);
        if (rc == 0) async_held.push_back(p);
        std::printf("async %d\n", rc);
      } else {
        const long n = std::stol(arg());
        const std::size_t bytes = std::stoul(arg()) * MiB;
        CUresult rc = 0;
        for (long k = 0; k < n && rc == 0; ++k) {
          unsigned long long p = 0;
          rc = alloc(&p, bytes, nullptr);
          if (rc == 0) rc = release(p, nullptr);
        }
        std::printf("cycles %ld %d\n", n, rc);
      }
    } else if (step == "async-free") {
      const auto release = via_proc<CUresult (*)(unsigned long long, void*)>("cuMemFreeAsync");
      for (auto p : async_held) release(p, nullptr);
      async_held.clear();
      std::printf("async-freed\n");
    } else if (step == "sync") {
      via_proc<CUresult (*)(void*)>("cuStreamSynchronize")(nullptr);
      std::printf("synced\n");
    } else if (step == "trim") {
      void* pool = nullptr;
      via_proc<CUresult (*)(void**, int)>("cuDeviceGetMemPool")(&pool, 0);
      std::printf("trimmed %d\n",
                  via_proc<CUresult (*)(void*, std::size_t)>("cuMemPoolTrimTo")(pool, std::stoul(arg()) * MiB));
    } else if (step == "ctx-create") {
      const int d = std::stoi(arg());
      void* c = nullptr;
      const CUresult rc = via_proc<CUresult (*)(void**, unsigned, int)>("cuCtxCreate")(&c, 0, d);
      std::printf("ctx-create %d %d\n", d, rc);
    } else if (step == "create-on") {
      const int prop[16] = {1, 0, 1, std::stoi(arg())};  // pinned, no handle types, location {device, N}
      unsigned long long h = 0;
      std::printf("create-on %d\n", direct<create_t>("cuMemCreate")(&h, std::stoul(arg()) * MiB, prop, 0));
    } else if (step == "share") {
      unsigned long long h = 0, shared = 0, imported = 0, ipc = 0;
      const CUresult c = direct<create_t>("cuMemCreate")(&h, std::stoul(arg()) * MiB, nullptr, 0);
      const CUresult e = via_proc<CUresult (*)(void*, unsigned long long, int, unsigned long long)>(
          "cuMemExportToShareableHandle")(&shared, h, 1, 0);
      const CUresult i = via_proc<CUresult (*)(unsigned long long*, void*, int)>("cuMemImportFromShareableHandle")(
          &imported, reinterpret_cast<void*>(shared), 1);
      const char handle[64] = {};
      const CUresult o = via_proc<CUresult (*)(unsigned long long*, const void*, unsigned)>("cuIpcOpenMemHandle")(
          &ipc, handle, 1);
      shared_handles = {imported, h};
      std::printf("share %d %d %d %d\n", c, e, i, o);
    } else if (step == "unshare") {
      for (auto h : shared_handles) direct<CUresult (*)(unsigned long long)>("cuMemRelease")(h);
      shared_handles.clear();
      std::printf("unshared\n");
    } else if (step == "create") {
      unsigned long long h = 0;
      std::printf("create %d\n", direct<create_t>("cuMemCreate")(&h, std::stoul(arg()) * MiB, nullptr, 0));
    } else if (step == "set") {  // set NAME=VALUE: as a standby worker's call sets its variables
      const std::string entry = arg();
      const auto eq = entry.find('=');
      ::setenv(entry.substr(0, eq).c_str(), entry.substr(eq + 1).c_str(), 1);
    } else if (step == "nvml") {
      void* lib = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
      struct {
        unsigned long long total, free, used;
      } m{};
      struct {
        unsigned version;
        unsigned long long total, reserved, free, used;
      } m2{};
      m2.version = static_cast<unsigned>(sizeof m2) | (2U << 24);
      void* device = nullptr;
      const bool ok =
          lib && reinterpret_cast<int (*)()>(::dlsym(lib, "nvmlInit_v2"))() == 0 &&
          reinterpret_cast<int (*)(unsigned, void**)>(::dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"))(0, &device) == 0 &&
          reinterpret_cast<int (*)(void*, void*)>(::dlsym(lib, "nvmlDeviceGetMemoryInfo"))(device, &m) == 0 &&
          reinterpret_cast<int (*)(void*, void*)>(::dlsym(lib, "nvmlDeviceGetMemoryInfo_v2"))(device, &m2) == 0;
      if (!ok) std::printf("nvml failed\n");
      else
        std::printf("nvml %llu %llu %llu v2 %llu %llu %llu\n", m.total >> 20, m.used >> 20, m.free >> 20,
                    m2.total >> 20, m2.used >> 20, m2.free >> 20);
    } else if (step == "fork") {
      const auto free_mib = [&] {
        std::size_t f = 0, t = 0;
        via_proc<info_t>("cuMemGetInfo")(&f, &t);
        return f / MiB;
      };
      int go[2];
      if (::pipe(go) != 0) return 1;
      std::fflush(stdout);
      const pid_t child = ::fork();
      if (child == 0) {
        ::close(go[1]);
        char c;
        while (::read(go[0], &c, 1) > 0) {
        }
        const auto release = via_proc<CUresult (*)(unsigned long long, void*)>("cuMemFreeAsync");
        for (auto p : async_held) release(p, nullptr);
        via_proc<CUresult (*)(void*)>("cuStreamSynchronize")(nullptr);
        std::exit(0);
      }
      ::close(go[0]);
      const std::size_t during = free_mib();
      ::close(go[1]);  // the child ends
      ::waitpid(child, nullptr, 0);
      std::printf("fork %zu %zu\n", during, free_mib());
    } else if (step == "free") {
      for (auto p : held) free_fn(p);
      held.clear();
      std::printf("freed\n");
    } else if (step == "hold") {
      const int r = fill(std::stoul(arg()), direct<alloc_t>("cuMemAlloc_v2"));
      (void)r;
      // fill() took all it could in MIB blocks; a holder keeps exactly one.
      for (std::size_t k = 1; k < held.size(); ++k) free_fn(held[k]);
      held.resize(held.empty() ? 0 : 1);
      std::printf("holding\n");
      std::fflush(stdout);
      char c;
      while (::read(0, &c, 1) > 0) {
      }
      return 0;
    } else if (step == "exec") {
      CUdeviceptr p = 0;
      direct<alloc_t>("cuMemAlloc_v2")(&p, std::stoul(arg()) * MiB);
      std::printf("exec\n");
      std::fflush(stdout);
      std::vector<char*> next = {argv[0]};
      for (int k = i + 1; k < argc; ++k) next.push_back(argv[k]);
      next.push_back(nullptr);
      ::execv(argv[0], next.data());
      return 1;
    } else if (step == "arrays") {
      const std::size_t mib = std::stoul(arg());
      const std::string kind = arg();
      const bool three = kind == "3d", mip = kind == "mip";
      std::vector<void*> arrays;
      CUresult rc = 0;
      for (;;) {
        void* a = nullptr;
        if (mip) {
          struct {
            std::size_t w, h, d;
            int format;
            unsigned channels, flags;
          } desc{256, 256, mib, 0x20, 4, 0};
          rc = via_proc<CUresult (*)(void**, const void*, unsigned)>("cuMipmappedArrayCreate")(&a, &desc, 2);
        } else if (three) {
          struct {
            std::size_t w, h, d;
            int format;
            unsigned channels, flags;
          } desc{256, 256, mib, 0x20, 4, 0};
          rc = via_proc<CUresult (*)(void**, const void*)>("cuArray3DCreate")(&a, &desc);
        } else {
          struct {
            std::size_t w, h;
            int format;
            unsigned channels;
          } desc{1024, mib * 256, 0x20, 1};
          rc = direct<CUresult (*)(void**, const void*)>("cuArrayCreate_v2")(&a, &desc);
        }
        if (rc != 0) break;
        arrays.push_back(a);
      }
      std::printf("arrays %zu code %d\n", arrays.size(), rc);
      for (void* a : arrays) direct<CUresult (*)(void*)>(mip ? "cuMipmappedArrayDestroy" : "cuArrayDestroy")(a);
    } else if (step == "holders") {
      const int n = std::stoi(arg());
      const std::string mib = arg();
      for (int k = 0; k < n; ++k) {
        int to_holder = -1;
        start_holder(argv[0], mib, to_holder);
        holders.push_back(to_holder);
      }
      std::printf("holders %d\n", n);
    } else if (step == "raise-limit") {
      const char* path = std::getenv("ISORUN_CAP_TERMS");
      if (!path) {
        std::printf("raise-limit no-terms\n");
      } else {
        const int fd = ::open(path, O_RDWR);
        const std::uint64_t huge = 1ULL << 40;
        void* m = fd < 0 ? MAP_FAILED : ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        const bool wrote = fd >= 0 && (m != MAP_FAILED || ::pwrite(fd, &huge, sizeof huge, 8) == sizeof huge);
        if (m != MAP_FAILED) static_cast<std::uint64_t*>(m)[1] = huge;  // the limit follows the magic
        std::printf("raise-limit %s\n", wrote ? "done" : "refused");
      }
    } else if (step == "truncate-ledger") {
      const char* path = std::getenv("ISORUN_CAP_REGION");
      const int fd = path ? ::open(path, O_RDWR) : -1;
      std::printf("truncate-ledger %s\n", fd >= 0 && ::ftruncate(fd, 0) == 0 ? "done" : "refused");
    } else if (step == "bind") {
      using bind_t = int (*)();
      const auto bind = reinterpret_cast<bind_t>(::dlsym(RTLD_DEFAULT, "isorun_cap_bind"));
      if (bind) std::printf("bind %d\n", bind());
      else std::printf("bind none\n");
    } else if (step == "spawn-clean" || step == "execveat-clean" || step == "pidfd-spawn-clean") {
      std::vector<char*> child = {argv[0]};
      for (int k = i + 1; k < argc; ++k) child.push_back(argv[k]);
      child.push_back(nullptr);
      std::string path = std::string("LD_LIBRARY_PATH=") +
                         (std::getenv("LD_LIBRARY_PATH") ? std::getenv("LD_LIBRARY_PATH") : "");
      char* env[] = {path.data(), nullptr};
      std::fflush(stdout);
      pid_t pid;
      if (step == "spawn-clean") {
        if (::posix_spawn(&pid, argv[0], nullptr, nullptr, child.data(), env) != 0) return 1;
      } else if (step == "pidfd-spawn-clean") {
        // The C library's own, asked of it alone (the cap library defines the name everywhere);
        // then called by its name, through whatever is preloaded, as a program would.
        using pidfd_spawn_t = int (*)(int*, const char*, const posix_spawn_file_actions_t*, const posix_spawnattr_t*,
                                      char* const*, char* const*);
        void* libc = ::dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
        if (!libc || !::dlsym(libc, "pidfd_spawn")) {
          std::printf("pidfd_spawn absent\n");
          return 0;
        }
        const auto spawn = reinterpret_cast<pidfd_spawn_t>(::dlsym(RTLD_DEFAULT, "pidfd_spawn"));
        int pidfd = -1;
        if (spawn(&pidfd, argv[0], nullptr, nullptr, child.data(), env) != 0) return 1;
        siginfo_t info{};
        ::waitid(P_PIDFD, static_cast<id_t>(pidfd), &info, WEXITED);
        break;
      } else if ((pid = ::fork()) == 0) {
        ::execveat(AT_FDCWD, argv[0], child.data(), env, 0);
        ::_exit(127);
      }
      ::waitpid(pid, nullptr, 0);
      break;
    } else if (step == "time") {
      const long n = std::stol(arg());
      const std::string kind = i + 1 < argc ? argv[i + 1] : "";
      if (kind == "async" || kind == "create") ++i;
      using async_t = CUresult (*)(unsigned long long*, std::size_t, void*);
      using async_free_t = CUresult (*)(unsigned long long, void*);
      using release_t = CUresult (*)(unsigned long long);
      const auto alloc = direct<alloc_t>("cuMemAlloc_v2");
      const auto async = kind == "async" ? via_proc<async_t>("cuMemAllocAsync") : nullptr;
      const auto async_free = kind == "async" ? via_proc<async_free_t>("cuMemFreeAsync") : nullptr;
      const auto create = kind == "create" ? direct<create_t>("cuMemCreate") : nullptr;
      const auto release = kind == "create" ? direct<release_t>("cuMemRelease") : nullptr;
      // CUmemAllocationProp: pinned, on device 0; 2 MiB, the driver's granularity.
      const int prop[16] = {1, 0, 1, 0};
      const auto t0 = std::chrono::steady_clock::now();
      for (long k = 0; k < n; ++k) {
        unsigned long long p = 0;
        CUresult rc;
        if (async) rc = async(&p, 64 << 10, nullptr);
        else if (create) rc = create(&p, 2 << 20, prop, 0);
        else rc = alloc(reinterpret_cast<CUdeviceptr*>(&p), 64 << 10);
        if (rc != 0) {
          std::printf("time: the allocation failed with %d\n", rc);
          return 1;
        }
        if (async) async_free(p, nullptr);
        else if (create) release(p);
        else free_fn(p);
      }
      std::printf("time %.1f\n",
                  std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / double(n));
    } else if (step == "pair" || step == "crash") {
      const std::string mib = arg();
      int to_holder = -1;
      const pid_t holder = start_holder(argv[0], mib, to_holder);
      if (step == "crash") {
        ::kill(holder, SIGKILL);
        ::waitpid(holder, nullptr, 0);
      }
      const int r = fill(std::stoul(mib), direct<alloc_t>("cuMemAlloc_v2"));
      std::printf("%s %d\n", step.c_str(), r / 1000);
      for (auto p : held) free_fn(p);
      held.clear();
      ::close(to_holder);
      if (step == "pair") ::waitpid(holder, nullptr, 0);
    }
    std::fflush(stdout);
  }
  for (int h : holders) ::close(h);  // each holder exits when its stdin closes
  while (::wait(nullptr) > 0) {
  }
  return 0;
}
