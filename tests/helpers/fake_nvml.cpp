// A stand-in libnvidia-ml.so.1 that reports one GPU, for running the suite as if on a GPU
// machine: found through LD_LIBRARY_PATH by the `*_fake_nvml` ctest entries. A test that
// forgets to pin its GPU inventory then fails here exactly as it would on a GPU node (there is
// no driver behind this GPU, so a worker sent to it reports that it cannot use it).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {
constexpr const char* uuid = "GPU-5a7e1d2c-0000-4000-8000-00000000fa4e";
constexpr const char* name = "NVIDIA H100 80GB HBM3 (stand-in NVML for tests)";
constexpr unsigned long long total = 80ULL << 30, used = 1ULL << 30;
int device_tag;  // the one device handle

struct memory {
  unsigned long long total, free, used;
};
struct process_info {
  unsigned pid;
  unsigned long long used;
  unsigned gpu_instance, compute_instance;
};
}  // namespace

extern "C" {
// FAKE_NVML_LOG=FILE: each initialisation appends a line to FILE, so a test can tell whether
// NVML was asked at all.
int nvmlInit_v2() {
  if (const char* log = std::getenv("FAKE_NVML_LOG"))
    if (FILE* f = std::fopen(log, "a")) {
      std::fputs("init\n", f);
      std::fclose(f);
    }
  return 0;
}
int nvmlShutdown() { return 0; }
int nvmlDeviceGetCount_v2(unsigned* count) {
  *count = 1;
  return 0;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned index, void** device) {
  if (index != 0) return 2;  // NVML_ERROR_INVALID_ARGUMENT
  *device = &device_tag;
  return 0;
}
int nvmlDeviceGetHandleByUUID(const char* u, void** device) {
  if (std::strcmp(u, uuid) != 0) return 6;  // NVML_ERROR_NOT_FOUND
  *device = &device_tag;
  return 0;
}
int nvmlDeviceGetUUID(void*, char* out, unsigned length) {
  std::snprintf(out, length, "%s", uuid);
  return 0;
}
int nvmlDeviceGetName(void*, char* out, unsigned length) {
  std::snprintf(out, length, "%s", name);
  return 0;
}
int nvmlDeviceGetIndex(void*, unsigned* index) {
  *index = 0;
  return 0;
}
int nvmlDeviceGetMemoryInfo(void*, memory* m) {
  *m = {total, total - used, used};
  return 0;
}
struct memory_v2 {
  unsigned version;
  unsigned long long total, reserved, free, used;
};
int nvmlDeviceGetMemoryInfo_v2(void*, memory_v2* m) {
  if ((m->version & 0xffffff) != sizeof(memory_v2)) return 25;  // NVML_ERROR_ARGUMENT_VERSION_MISMATCH
  m->total = total;
  m->reserved = 0;
  m->used = used;
  m->free = total - used;
  return 0;
}
int nvmlDeviceGetComputeRunningProcesses_v3(void*, unsigned* count, process_info*) {
  *count = 0;
  return 0;
}
}
