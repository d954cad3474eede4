#include "numpy_results.hpp"

#include <Python.h>
#include <malloc.h>
#include <pthread.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <vector>

#include "isorun/serialization/blob.hpp"

namespace isorun_python {
namespace {

namespace blob = isorun::serialization::detail;

// NumPy's memory handler, version 1 (numpy/ndarraytypes.h, NEP 49). Its layout is NumPy's ABI,
// declared here so that building the package does not need NumPy's headers.
struct numpy_allocator {
  void* ctx;
  void* (*malloc)(void* ctx, std::size_t size);
  void* (*calloc)(void* ctx, std::size_t nelem, std::size_t elsize);
  void* (*realloc)(void* ctx, void* ptr, std::size_t new_size);
  void (*free)(void* ctx, void* ptr, std::size_t size);
};
struct numpy_handler {
  char name[127];
  std::uint8_t version;
  numpy_allocator allocator;
};

// Indices in NumPy's C-API table (numpy/__multiarray_api.h), fixed for good once published.
constexpr int api_feature_version = 211;  // PyArray_GetNDArrayCFeatureVersion
constexpr int api_set_handler = 304;      // PyDataMem_SetHandler, NumPy 1.22
constexpr unsigned feature_1_22 = 0x0000000f;

// The large allocations made through the handler, by start: the record, not the size NumPy
// passes free(), says which memory a pointer is (realloc() is passed no size at all).
struct storage {
  std::byte* data;
  std::size_t size;
};
std::mutex storages_mutex;
std::vector<storage> storages;

// A fork (os.fork, multiprocessing) while another thread holds the record's lock would leave the
// child's copy locked for good: fork takes it first.
void lock_storages() noexcept { storages_mutex.lock(); }
void unlock_storages() noexcept { storages_mutex.unlock(); }

void* allocate(std::size_t size, bool zeroed) noexcept {
  try {
    std::byte* p = zeroed ? blob::allocate_zeroed_blob(size) : blob::allocate_blob(size);
    try {
      std::lock_guard lock(storages_mutex);
      storages.push_back({p, size});
    } catch (...) {
      blob::free_blob(p, size);
      return nullptr;
    }
    return p;
  } catch (...) {  // NumPy raises MemoryError for nullptr
    return nullptr;
  }
}

// The record of the large allocation at `p` (storages.end() if `p` is not one). Lock held.
std::vector<storage>::iterator recorded(void* p) {
  return std::find_if(storages.begin(), storages.end(), [&](const storage& s) { return s.data == p; });
}

// The size of a large allocation, taken out of the record; 0 if `p` is not one.
std::size_t forget(void* p) noexcept {
  std::lock_guard lock(storages_mutex);
  const auto it = recorded(p);
  if (it == storages.end()) return 0;
  const std::size_t size = it->size;
  storages.erase(it);
  return size;
}

void* numpy_malloc(void*, std::size_t size) noexcept {
  return size < placed_from ? std::malloc(size) : allocate(size, false);
}

void* numpy_calloc(void*, std::size_t nelem, std::size_t elsize) noexcept {
  if (elsize != 0 && nelem > SIZE_MAX / elsize) return nullptr;
  const std::size_t size = nelem * elsize;
  return size < placed_from ? std::calloc(nelem, elsize) : allocate(size, true);
}

void numpy_free(void*, void* p, std::size_t) noexcept {
  if (const std::size_t size = forget(p)) blob::free_blob(static_cast<std::byte*>(p), size);
  else std::free(p);
}

void* numpy_realloc(void*, void* p, std::size_t new_size) noexcept {
  std::size_t old_size = 0;
  {
    std::lock_guard lock(storages_mutex);
    if (const auto it = recorded(p); it != storages.end()) old_size = it->size;
  }
  if (old_size == 0 && new_size < placed_from) return std::realloc(p, new_size);
  // Between the two kinds of memory, or within the large one: a move.
  void* fresh = numpy_malloc(nullptr, new_size);
  if (!fresh) return nullptr;
  if (p) std::memcpy(fresh, p, std::min(new_size, old_size ? old_size : ::malloc_usable_size(p)));
  numpy_free(nullptr, p, old_size);
  return fresh;
}

numpy_handler handler = {"isorun_result_segment", 1, {nullptr, numpy_malloc, numpy_calloc, numpy_realloc, numpy_free}};

// NumPy's C-API table, from its core module: numpy._core in NumPy 2, numpy.core before.
void** numpy_api() {
  PyObject* numpy = PyDict_GetItemString(PyImport_GetModuleDict(), "numpy");  // borrowed
  if (!numpy) return nullptr;
  for (const char* name : {"numpy._core._multiarray_umath", "numpy.core._multiarray_umath"}) {
    PyObject* core = PyImport_ImportModule(name);
    if (!core) {
      PyErr_Clear();
      continue;
    }
    PyObject* table = PyObject_GetAttrString(core, "_ARRAY_API");
    Py_DECREF(core);
    if (!table) {
      PyErr_Clear();
      continue;
    }
    void** api = PyCapsule_CheckExact(table) ? static_cast<void**>(PyCapsule_GetPointer(table, nullptr)) : nullptr;
    Py_DECREF(table);  // the module keeps the capsule, and so the table, alive
    if (api) return api;
    PyErr_Clear();
  }
  return nullptr;
}

}  // namespace

bool place_numpy_arrays() {
  void** api = numpy_api();
  if (!api) return false;
  if (reinterpret_cast<unsigned (*)()>(api[api_feature_version])() < feature_1_22) return false;
  // One capsule for the process, never freed: every array made through it holds a reference.
  static PyObject* capsule = PyCapsule_New(&handler, "mem_handler", nullptr);
  static const bool fork_safe = ::pthread_atfork(lock_storages, unlock_storages, unlock_storages) == 0;
  if (!capsule || !fork_safe) {
    PyErr_Clear();
    return false;
  }
  PyObject* previous = reinterpret_cast<PyObject* (*)(PyObject*)>(api[api_set_handler])(capsule);
  if (!previous) {
    PyErr_Clear();
    return false;
  }
  Py_DECREF(previous);
  return true;
}

std::span<std::byte> numpy_storage_holding(const void* data, std::size_t size) {
  std::lock_guard lock(storages_mutex);
  for (const storage& s : storages)
    if (lies_in({s.data, s.size}, data, size)) return {s.data, s.size};
  return {};
}

}  // namespace isorun_python
