#pragma once
/// @file cap_region.hpp
/// The memory cap of a `-- CMD` run, shared by every process of the command, per device: a small
/// shared-memory region the supervisor creates and the preloaded CUDA library
/// (libisorun_cuda_cap.so) of each process charges its device allocations to. Bytes are
/// reserved here *before* the driver is asked, so the processes together never exceed the cap.
///
/// Each process owns a slot with its own bytes, so the share of a process that died without
/// freeing (a crash, SIGKILL) can be taken back by the others: a refused reservation first
/// reclaims the slots of processes that no longer exist.

#include <signal.h>
#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>

#include "isorun/serialization/protocol.hpp"

namespace isorun::preload {

/// Environment variable naming the region for the preloaded library: "/proc/PID/fd/N" of the
/// supervisor's descriptor, so it has no name anywhere that could be left behind.
inline constexpr const char* region_env = serialization::env::cap_region.data();
/// Environment variable the shim turns into LD_PRELOAD for the command (and only for it).
inline constexpr const char* preload_env = serialization::env::cap_preload.data();
/// The preloaded library's file name; it sits next to libisorun.so.
inline constexpr const char* library_name = "libisorun_cuda_cap.so";

inline constexpr std::uint64_t region_magic = 0x3250'4143'4e55'5249ULL;  // "IRUNCAP2"
inline constexpr std::size_t max_processes = 256;
/// Devices a command can be given (CUDA ordinals 0..max_devices-1 inside it).
inline constexpr std::size_t max_devices = 16;

/// @brief The ledger index of CUDA device `ordinal`: itself, or the last one past the range
///        (so a charge is never lost, only pooled).
constexpr std::size_t ledger_of(int ordinal) noexcept {
  return ordinal < 0 ? 0 : static_cast<std::size_t>(ordinal) < max_devices ? static_cast<std::size_t>(ordinal) : max_devices - 1;
}

struct process_slot {
  std::atomic<std::int32_t> pid;  ///< 0: free
  std::atomic<std::uint64_t> bytes[max_devices];  ///< held on each device
};

/// One device's side of the cap: what the command's processes hold on it, together.
struct device_ledger {
  std::atomic<std::uint64_t> used;             ///< Σ of the slots' bytes on this device
  std::atomic<std::uint64_t> peak;
  std::atomic<std::uint64_t> refusals;         ///< allocations refused for the cap
  std::atomic<std::uint64_t> largest_refused;  ///< the largest refused request, bytes
};

/// The cap is per device: each device's ledger is held to `limit` on its own, as a worker's
/// allocator on each of its GPUs is.
struct cap_region {
  std::uint64_t magic;
  std::uint64_t limit;                     ///< the cap on each device, bytes
  std::atomic<std::uint64_t> contexts;     ///< CUDA contexts counted
  std::atomic<std::uint64_t> processes;    ///< processes that attached
  device_ledger devices[max_devices];
  process_slot slots[max_processes];

  /// @brief Charges `n` bytes on `device` to `slot` if the cap allows.
  bool reserve(process_slot& slot, std::size_t device, std::uint64_t n) noexcept {
    device_ledger& d = devices[device];
    for (int attempt = 0; attempt < 2; ++attempt) {
      std::uint64_t cur = d.used.load();
      while (cur + n <= limit && cur + n >= cur) {
        if (d.used.compare_exchange_weak(cur, cur + n)) {
          slot.bytes[device] += n;
          raise_peak(d, cur + n);
          return true;
        }
      }
      if (attempt == 0 && reclaim_dead() == 0) break;
    }
    ++d.refusals;
    for (std::uint64_t l = d.largest_refused.load(); n > l && !d.largest_refused.compare_exchange_weak(l, n);) {
    }
    return false;
  }

  /// @brief Charges `n` bytes on `device` to `slot` whatever the cap: memory that exists
  ///        already (a CUDA context, a pitched allocation's padding). Later reservations see it.
  void charge(process_slot& slot, std::size_t device, std::uint64_t n) noexcept {
    slot.bytes[device] += n;
    raise_peak(devices[device], devices[device].used += n);
  }

  /// @brief Gives back `n` bytes on `device` charged to `slot`.
  void release(process_slot& slot, std::size_t device, std::uint64_t n) noexcept {
    slot.bytes[device] -= n;
    devices[device].used -= n;
  }

  /// @brief Takes back the bytes of processes that are gone. @return the bytes taken back.
  std::uint64_t reclaim_dead() noexcept {
    std::uint64_t back = 0;
    for (auto& s : slots) {
      std::int32_t pid = s.pid.load();
      if (pid <= 0 || ::kill(pid, 0) == 0 || errno != ESRCH) continue;
      if (!s.pid.compare_exchange_strong(pid, -1)) continue;  // -1: being reclaimed
      back += empty(s);
      s.pid.store(0);
    }
    return back;
  }

  /// @brief A free slot for process `pid` (nullptr if all are taken: then nothing is charged).
  ///        A slot that already names `pid` belonged to the program this process ran before an
  ///        exec, whose device memory went with its image: it is emptied and taken over.
  process_slot* claim(std::int32_t pid) noexcept {
    for (auto& s : slots)
      if (s.pid.load() == pid) {
        empty(s);
        return &s;
      }
    for (int pass = 0; pass < 2; ++pass) {
      for (auto& s : slots) {
        std::int32_t free = 0;
        if (s.pid.compare_exchange_strong(free, pid)) {
          ++processes;
          return &s;
        }
      }
      reclaim_dead();
    }
    return nullptr;
  }

  /// Allocations refused on all devices, the largest of them, and the highest peak of any one.
  [[nodiscard]] std::uint64_t refusals() const noexcept { return sum(&device_ledger::refusals); }
  [[nodiscard]] std::uint64_t largest_refused() const noexcept { return most(&device_ledger::largest_refused); }
  [[nodiscard]] std::uint64_t peak() const noexcept { return most(&device_ledger::peak); }

 private:
  static void raise_peak(device_ledger& d, std::uint64_t now) noexcept {
    for (std::uint64_t p = d.peak.load(); now > p && !d.peak.compare_exchange_weak(p, now);) {
    }
  }
  // Gives every device's bytes of `s` back. @return how many.
  std::uint64_t empty(process_slot& s) noexcept {
    std::uint64_t all = 0;
    for (std::size_t d = 0; d < max_devices; ++d) {
      const std::uint64_t b = s.bytes[d].exchange(0);
      devices[d].used -= b;
      all += b;
    }
    return all;
  }
  [[nodiscard]] std::uint64_t sum(std::atomic<std::uint64_t> device_ledger::*field) const noexcept {
    std::uint64_t n = 0;
    for (const auto& d : devices) n += (d.*field).load();
    return n;
  }
  [[nodiscard]] std::uint64_t most(std::atomic<std::uint64_t> device_ledger::*field) const noexcept {
    std::uint64_t n = 0;
    for (const auto& d : devices) n = std::max(n, (d.*field).load());
    return n;
  }
};

static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "the region is shared between processes");

}  // namespace isorun::preload
