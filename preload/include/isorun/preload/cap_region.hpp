#pragma once
/// @file cap_region.hpp
/// The memory cap of a `-- CMD` run, shared by every process of the command: a small
/// shared-memory region the supervisor creates and the preloaded CUDA library
/// (libisorun_cuda_cap.so) of each process charges its device allocations to. Bytes are
/// reserved here *before* the driver is asked, so the processes together never exceed the cap.
///
/// Each process owns a slot with its own bytes, so the share of a process that died without
/// freeing (a crash, SIGKILL) can be taken back by the others: a refused reservation first
/// reclaims the slots of processes that no longer exist.

#include <signal.h>
#include <sys/types.h>

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

inline constexpr std::uint64_t region_magic = 0x3150'4143'4e55'5249ULL;  // "IRUNCAP1"
inline constexpr std::size_t max_processes = 256;

struct process_slot {
  std::atomic<std::int32_t> pid;  ///< 0: free
  std::atomic<std::uint64_t> bytes;
};

struct cap_region {
  std::uint64_t magic;
  std::uint64_t limit;                     ///< the cap, bytes
  std::atomic<std::uint64_t> used;         ///< Σ of the slots' bytes
  std::atomic<std::uint64_t> peak;
  std::atomic<std::uint64_t> refusals;     ///< allocations refused for the cap
  std::atomic<std::uint64_t> largest_refused;  ///< the largest refused request, bytes
  std::atomic<std::uint64_t> contexts;     ///< CUDA contexts counted
  std::atomic<std::uint64_t> processes;    ///< processes that attached
  process_slot slots[max_processes];

  /// @brief Charges `n` bytes to `slot` if the cap allows.
  bool reserve(process_slot& slot, std::uint64_t n) noexcept {
    for (int attempt = 0; attempt < 2; ++attempt) {
      std::uint64_t cur = used.load();
      while (cur + n <= limit && cur + n >= cur) {
        if (used.compare_exchange_weak(cur, cur + n)) {
          slot.bytes += n;
          for (std::uint64_t p = peak.load(); cur + n > p && !peak.compare_exchange_weak(p, cur + n);) {
          }
          return true;
        }
      }
      if (attempt == 0 && reclaim_dead() == 0) break;
    }
    ++refusals;
    for (std::uint64_t l = largest_refused.load(); n > l && !largest_refused.compare_exchange_weak(l, n);) {
    }
    return false;
  }

  /// @brief Charges `n` bytes to `slot` whatever the cap: memory that exists already (a CUDA
  ///        context, a pitched allocation's padding). Later reservations see it.
  void charge(process_slot& slot, std::uint64_t n) noexcept {
    slot.bytes += n;
    const std::uint64_t now = used += n;
    for (std::uint64_t p = peak.load(); now > p && !peak.compare_exchange_weak(p, now);) {
    }
  }

  /// @brief Gives back `n` bytes charged to `slot`.
  void release(process_slot& slot, std::uint64_t n) noexcept {
    slot.bytes -= n;
    used -= n;
  }

  /// @brief Takes back the bytes of processes that are gone. @return the bytes taken back.
  std::uint64_t reclaim_dead() noexcept {
    std::uint64_t back = 0;
    for (auto& s : slots) {
      std::int32_t pid = s.pid.load();
      if (pid <= 0 || ::kill(pid, 0) == 0 || errno != ESRCH) continue;
      if (!s.pid.compare_exchange_strong(pid, -1)) continue;  // -1: being reclaimed
      const std::uint64_t b = s.bytes.exchange(0);
      used -= b;
      back += b;
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
        used -= s.bytes.exchange(0);
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
};

static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "the region is shared between processes");

}  // namespace isorun::preload
