#include "isorun/alloc/simulated_device.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>
#include <system_error>

#include "chunk_checksum.hpp"

namespace isorun::alloc {
namespace {

constexpr std::size_t granule = 2u << 20;

std::string hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

}  // namespace

simulated_device::simulated_device(std::uint64_t capacity) : capacity_{capacity} {}

simulated_device::~simulated_device() {
  for (auto& [at, r] : regions_) drop_region(r);
}

simulated_device::region simulated_device::make_region(std::size_t bytes) {
  const int fd = ::memfd_create("isorun-simulated-device", MFD_CLOEXEC);
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "memfd_create (simulated device)");
  region r;
  r.bytes = bytes;
  if (::ftruncate(fd, static_cast<off_t>(bytes)) == 0) {
    void* device = ::mmap(nullptr, bytes, PROT_NONE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    void* alias = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    if (device != MAP_FAILED) r.device = static_cast<std::byte*>(device);
    if (alias != MAP_FAILED) r.alias = static_cast<std::byte*>(alias);
  }
  const int err = errno;
  ::close(fd);  // the mappings keep the pages
  if (!r.device || !r.alias) {
    drop_region(r);
    throw std::system_error(err, std::generic_category(), "mapping simulated device memory");
  }
  return r;
}

void simulated_device::drop_region(region& r) noexcept {
  if (r.device) ::munmap(r.device, r.bytes);
  if (r.alias) ::munmap(r.alias, r.bytes);
  r.device = r.alias = nullptr;
}

void* simulated_device::allocate(std::size_t bytes) {
  {
    std::lock_guard lock(mutex_);
    if (used_ + bytes > capacity_) return nullptr;
    used_ += bytes;
  }
  region r;
  try {
    r = make_region(bytes);
  } catch (...) {
    std::lock_guard lock(mutex_);
    used_ -= bytes;
    return nullptr;
  }
  std::lock_guard lock(mutex_);
  void* p = r.device;
  regions_.emplace(reinterpret_cast<std::uintptr_t>(p), std::move(r));
  return p;
}

void simulated_device::deallocate(void* p, std::size_t bytes) noexcept {
  std::lock_guard lock(mutex_);
  auto it = regions_.find(reinterpret_cast<std::uintptr_t>(p));
  if (it == regions_.end() || it->second.reserved) return;
  drop_region(it->second);
  regions_.erase(it);
  used_ -= bytes;
}

memory_info simulated_device::device_memory() const {
  std::lock_guard lock(mutex_);
  return {capacity_ - used_, capacity_};
}

void* simulated_device::reserve_address(std::size_t bytes) {
  region r;
  try {
    r = make_region(bytes);
  } catch (...) {
    return nullptr;
  }
  r.reserved = true;
  r.mapped.assign((bytes + granule - 1) / granule, false);
  std::lock_guard lock(mutex_);
  void* p = r.device;
  regions_.emplace(reinterpret_cast<std::uintptr_t>(p), std::move(r));
  return p;
}

void simulated_device::release_address(void* p, std::size_t) noexcept {
  std::lock_guard lock(mutex_);
  auto it = regions_.find(reinterpret_cast<std::uintptr_t>(p));
  if (it == regions_.end() || !it->second.reserved) return;
  for (bool m : it->second.mapped) used_ -= m ? granule : 0;
  drop_region(it->second);
  regions_.erase(it);
}

bool simulated_device::map(void* p, std::size_t bytes) {
  std::lock_guard lock(mutex_);
  region* r = const_cast<region*>(find(p));
  if (!r || !r->reserved) return false;
  const std::size_t first = static_cast<std::size_t>(static_cast<std::byte*>(p) - r->device) / granule;
  const std::size_t end = first + (bytes + granule - 1) / granule;
  if (end > r->mapped.size())
    throw std::invalid_argument("simulated device: map of " + hex(p) + " + " + std::to_string(bytes) +
                                " bytes runs past its reserved range");
  for (std::size_t g = first; g < end; ++g)
    if (r->mapped[g])  // cuMemMap refuses a range that is already mapped
      throw std::invalid_argument("simulated device: map of " + hex(p) + " covers a page that is already mapped");
  if (used_ + bytes > capacity_) return false;
  for (std::size_t g = first; g < end; ++g) r->mapped[g] = true;
  used_ += bytes;
  return true;
}

void simulated_device::unmap(void* p, std::size_t bytes) noexcept {
  std::lock_guard lock(mutex_);
  region* r = const_cast<region*>(find(p));
  if (!r || !r->reserved) return;
  const std::size_t offset = static_cast<std::size_t>(static_cast<std::byte*>(p) - r->device);
  // Give the pages back, as cuMemUnmap + cuMemRelease do; a later map() sees zeros.
  ::madvise(r->alias + offset, bytes, MADV_REMOVE);
  for (std::size_t g = offset / granule; g < (offset + bytes + granule - 1) / granule && g < r->mapped.size(); ++g) {
    used_ -= r->mapped[g] ? granule : 0;
    r->mapped[g] = false;
  }
}

const simulated_device::region* simulated_device::find(const void* p) const {
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  auto it = regions_.upper_bound(at);
  if (it == regions_.begin()) return nullptr;
  --it;
  return at < it->first + it->second.bytes ? &it->second : nullptr;
}

bool simulated_device::is_device_memory(const void* p, std::size_t bytes) const {
  std::lock_guard lock(mutex_);
  const region* r = find(p);
  if (!r) return false;
  const std::size_t offset = static_cast<std::size_t>(static_cast<const std::byte*>(p) - r->device);
  return bytes <= r->bytes - offset;
}

std::byte* simulated_device::alias_of(const void* p, std::size_t bytes, const char* role) const {
  const region* r = find(p);
  if (!r)
    throw std::invalid_argument(std::string("simulated device: ") + role + " " + hex(p) +
                                " is not device memory (a host pointer where a device pointer belongs?)");
  const std::size_t offset = static_cast<std::size_t>(static_cast<const std::byte*>(p) - r->device);
  if (bytes > r->bytes - offset)
    throw std::invalid_argument(std::string("simulated device: ") + role + " " + hex(p) + " + " +
                                std::to_string(bytes) + " bytes runs past the end of its allocation");
  if (r->reserved)
    for (std::size_t g = offset / granule; g < (offset + bytes + granule - 1) / granule; ++g)
      if (!r->mapped[g])
        throw std::invalid_argument(std::string("simulated device: ") + role + " " + hex(p) +
                                    " touches reserved address space with no memory mapped");
  return r->alias + offset;
}

void simulated_device::copy(void* dst, const void* src, std::size_t bytes, copy_kind kind, stream_id) {
  if (bytes == 0) return;
  std::byte* to = static_cast<std::byte*>(dst);
  const std::byte* from = static_cast<const std::byte*>(src);
  {
    std::lock_guard lock(mutex_);
    auto host_side = [&](const void* p, const char* role) {
      if (find(p))
        throw std::invalid_argument(std::string("simulated device: ") + role + " " + hex(p) +
                                    " is device memory, but the copy's direction says host memory");
    };
    switch (kind) {
      case copy_kind::host_to_device:
        host_side(src, "source");
        to = alias_of(dst, bytes, "destination");
        break;
      case copy_kind::device_to_host:
        host_side(dst, "destination");
        from = alias_of(src, bytes, "source");
        break;
      case copy_kind::device_to_device:
        to = alias_of(dst, bytes, "destination");
        from = alias_of(src, bytes, "source");
        break;
    }
  }
  std::memmove(to, from, bytes);
}

void simulated_device::fill(void* p, std::size_t bytes, std::uint8_t value, stream_id) {
  std::byte* at;
  {
    std::lock_guard lock(mutex_);
    at = alias_of(p, bytes, "fill target");
  }
  std::memset(at, value, bytes);
}

bool simulated_device::do_checksum_chunks(const void* header, std::size_t header_bytes, const void* src,
                                          std::size_t bytes, std::size_t chunk, std::uint64_t* out, stream_id) {
  const std::byte* from = nullptr;
  if (bytes) {
    std::lock_guard lock(mutex_);
    from = alias_of(src, bytes, "checksum source");
  }
  const auto in = detail::xxh3::make_input(header, static_cast<std::uint32_t>(header_bytes), from, bytes);
  for (std::uint64_t at = 0, c = 0; at < in.total(); at += chunk, ++c)
    out[c] = detail::xxh3::hash_chunk(in, at, std::min<std::uint64_t>(chunk, in.total() - at));
  return true;
}

std::uint64_t simulated_device::used() const {
  std::lock_guard lock(mutex_);
  return used_;
}

}  // namespace isorun::alloc
