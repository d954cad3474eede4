#pragma once
/// @file cap_region.hpp
/// The memory cap of a `-- CMD` run, shared by every process of the command, per device. It lives
/// in two unnamed files the supervisor creates (memfds, reachable as "/proc/PID/fd/N" while the
/// supervisor lives, and gone with it):
///
/// - the **terms** (`cap_terms`): the limit and the ledger's size. The supervisor writes them and
///   seals the file (F_SEAL_WRITE), so no process of the command can raise its own limit;
/// - the **ledger** (`cap_ledger`): what the command's processes hold, which every one of them
///   must be able to write. The preloaded CUDA library (libisorun_cuda_cap.so) of each process
///   reserves an allocation's bytes here *before* the driver is asked, so together the
///   processes never exceed the cap.
///
/// When the supervisor asks for a memory timeline, the ledger also keeps the last
/// `event_capacity` changes (`memory_event`: what a process came to hold, gave back, or was
/// refused, with the time), in a ring after the slots, for the supervisor to draw once the
/// command has ended.
///
/// Each process owns a slot with its own bytes, so the share of a process that died without
/// freeing (a crash, SIGKILL) can be taken back by the others: a refused reservation first
/// reclaims the slots of processes that no longer exist. Slots are handed out from the front and
/// the ledger is as long as the terms say, so it grows (in touched pages) with the process tree.
///
/// What this is, plainly: a guard that every process of a command using the CUDA driver normally
/// stays within, accidents included (a framework sizing its pools, a forked DataLoader, a child
/// started with a clean environment). It is not a security boundary: a program that sets out to
/// escape can write the ledger it must be able to write, or reach the driver without the
/// preloaded library (raw system calls, its own ELF lookups). Against such a program the boundary
/// is the kernel's: the cgroup `dmem` controller, where the GPU driver supports it.

#include <signal.h>
#include <sys/types.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>

#include "isorun/serialization/protocol.hpp"

namespace isorun::preload {

/// Environment variable naming the ledger for the preloaded library ("/proc/PID/fd/N").
inline constexpr const char* region_env = serialization::env::cap_region.data();
/// Environment variable naming the sealed terms ("/proc/PID/fd/N").
inline constexpr const char* terms_env = serialization::env::cap_terms.data();
/// Environment variable the shim turns into LD_PRELOAD for the command (and only for it).
inline constexpr const char* preload_env = serialization::env::cap_preload.data();
/// Environment variable of a process whose region comes later, with its call: the cap in bytes
/// it stays within until then (a standby Python interpreter that imports a framework ahead).
inline constexpr const char* deferred_env = serialization::env::cap_deferred.data();
/// Environment variable of a zygote: every CUDA call is refused until isorun_cap_thaw.
inline constexpr const char* zygote_env = serialization::env::cap_zygote.data();
/// The preloaded library's `void isorun_cap_thaw(int capped)`: a zygote's forked child calls it
/// once its environment is its call's, before any code of the call runs: CUDA is allowed from
/// then on, under the deferred cap (capped), or with no cap at all (0: the library steps aside).
inline constexpr const char* thaw_symbol = "isorun_cap_thaw";
/// The preloaded library's `int isorun_cap_bind()`: a worker that set its call's region variables
/// calls it (found with dlsym) before any code of the call runs, so the region is pinned then.
inline constexpr const char* bind_symbol = "isorun_cap_bind";
/// The preloaded library's file name; it sits next to libisorun.so.
inline constexpr const char* library_name = "libisorun_cuda_cap.so";

inline constexpr std::uint64_t terms_magic = 0x3454'4143'4e55'5249ULL;   // "IRUNCAT4"
inline constexpr std::uint64_t ledger_magic = 0x344c'4143'4e55'5249ULL;  // "IRUNCAL4"
/// Slots the supervisor provides: far more processes with CUDA than any real command runs at
/// once (each holds a CUDA context), and only the slots in use cost memory.
inline constexpr std::size_t default_slot_capacity = 65536;
/// Devices a command can be given (CUDA ordinals 0..max_devices-1 inside it).
inline constexpr std::size_t max_devices = 16;

/// @brief The ledger index of CUDA device `ordinal`: itself, or the last one past the range
///        (so a charge is never lost, only pooled).
constexpr std::size_t ledger_of(int ordinal) noexcept {
  return ordinal < 0                                       ? 0
         : static_cast<std::size_t>(ordinal) < max_devices ? static_cast<std::size_t>(ordinal)
                                                           : max_devices - 1;
}

/// The sealed part: read-only to every process of the command.
struct cap_terms {
  std::uint64_t magic;
  std::uint64_t limit;           ///< the cap on each device, bytes
  std::uint64_t slot_capacity;   ///< slots in the ledger
  std::uint64_t event_capacity;  ///< events the ledger's ring keeps; 0: no memory timeline
};

/// One change of what the command holds on a device, as the ring keeps it.
struct memory_event {
  enum kind_t : std::uint16_t { held = 1, released = 2, refused = 3 };
  /// The event's number + 1 once it is written whole; 0 (or another number) while it is being
  /// written, or after the ring has moved past it.
  std::atomic<std::uint64_t> seq;
  std::int64_t t_ns;  ///< CLOCK_MONOTONIC
  std::uint64_t bytes;
  std::int32_t pid;
  std::uint16_t device;  ///< the ledger's device index
  std::uint16_t kind;
};

/// Where a process writes its events: the ring after the ledger's slots (nowhere if the terms
/// keep none). Its size comes from the sealed terms, never from the writable ledger.
struct event_ring {
  memory_event* at = nullptr;
  std::uint64_t capacity = 0;
};

struct process_slot {
  std::atomic<std::int32_t> pid;                  ///< 0: free; -1: being reclaimed
  std::atomic<std::uint64_t> bytes[max_devices];  ///< held on each device
};

/// One device's side of the cap: what the command's processes hold on it, together.
struct device_ledger {
  std::atomic<std::uint64_t> used;  ///< Σ of the slots' bytes on this device
  std::atomic<std::uint64_t> peak;
  std::atomic<std::uint64_t> refusals;         ///< allocations refused for the cap
  std::atomic<std::uint64_t> largest_refused;  ///< the largest refused request, bytes
};

/// The writable part. The cap is per device: each device's ledger is held to the limit on its
/// own, as a worker's allocator on each of its GPUs is. `slot_capacity` slots follow this header
/// in the same file (`ledger_bytes`).
struct cap_ledger {
  std::uint64_t magic;
  std::atomic<std::uint64_t> contexts;     ///< CUDA contexts counted
  std::atomic<std::uint64_t> processes;    ///< processes that attached
  std::atomic<std::uint64_t> slots_used;   ///< slots ever handed out: scans stop here
  std::atomic<std::uint64_t> slotless;     ///< processes refused for want of a free slot
  std::atomic<std::uint64_t> events_next;  ///< events written to the ring, ever
  device_ledger devices[max_devices];

  /// @brief The size of a ledger file with `capacity` slots and a ring of `events` events.
  static constexpr std::size_t bytes_for(std::size_t capacity, std::size_t events = 0) noexcept {
    return sizeof(cap_ledger) + capacity * sizeof(process_slot) + events * sizeof(memory_event);
  }

  /// @brief The ring of a ledger with `capacity` slots that keeps `events` events.
  event_ring ring(std::size_t capacity, std::size_t events) noexcept {
    return {events ? reinterpret_cast<memory_event*>(slots() + capacity) : nullptr, events};
  }

  /// @brief Charges `n` bytes on `device` to `slot` if the cap `limit` allows.
  bool reserve(process_slot& slot, std::size_t device, std::uint64_t n, std::uint64_t limit,
               const event_ring& ring = {}) noexcept {
    device_ledger& d = devices[device];
    for (int attempt = 0; attempt < 2; ++attempt) {
      std::uint64_t cur = d.used.load();
      while (cur + n <= limit && cur + n >= cur) {
        if (d.used.compare_exchange_weak(cur, cur + n)) {
          slot.bytes[device] += n;
          raise_peak(d, cur + n);
          record(ring, memory_event::held, slot.pid.load(), device, n);
          return true;
        }
      }
      if (attempt == 0 && reclaim_dead(ring) == 0) break;
    }
    refused(device, n);
    record(ring, memory_event::refused, slot.pid.load(), device, n);
    return false;
  }

  /// @brief Counts an allocation of `n` bytes on `device` refused.
  void refused(std::size_t device, std::uint64_t n) noexcept {
    device_ledger& d = devices[device];
    ++d.refusals;
    for (std::uint64_t l = d.largest_refused.load(); n > l && !d.largest_refused.compare_exchange_weak(l, n);) {
    }
  }

  /// @brief Charges `n` bytes on `device` to `slot` whatever the cap: memory that exists
  ///        already (a CUDA context, a pitched allocation's padding). Later reservations see it.
  void charge(process_slot& slot, std::size_t device, std::uint64_t n, const event_ring& ring = {}) noexcept {
    slot.bytes[device] += n;
    raise_peak(devices[device], devices[device].used += n);
    record(ring, memory_event::held, slot.pid.load(), device, n);
  }

  /// @brief Gives back `n` bytes on `device` charged to `slot`.
  void release(process_slot& slot, std::size_t device, std::uint64_t n, const event_ring& ring = {}) noexcept {
    slot.bytes[device] -= n;
    devices[device].used -= n;
    record(ring, memory_event::released, slot.pid.load(), device, n);
  }

  /// @brief Takes back the bytes of processes that are gone. @return the bytes taken back.
  std::uint64_t reclaim_dead(const event_ring& ring = {}) noexcept {
    std::uint64_t back = 0;
    for (process_slot *s = slots(), *end = s + in_use(); s != end; ++s) {
      std::int32_t pid = s->pid.load();
      if (pid <= 0 || ::kill(pid, 0) == 0 || errno != ESRCH) continue;
      if (!s->pid.compare_exchange_strong(pid, -1)) continue;  // -1: being reclaimed
      back += empty(*s, ring, pid);
      s->pid.store(0);
    }
    return back;
  }

  /// @brief Writes one event to `ring` (nothing if it keeps none): its number is taken, the
  ///        fields written, and `seq` set last, so a reader skips an event caught half written.
  void record(const event_ring& ring, memory_event::kind_t kind, std::int32_t pid, std::size_t device,
              std::uint64_t bytes) noexcept {
    if (!ring.at || !bytes) return;
    const std::uint64_t n = events_next.fetch_add(1);
    memory_event& e = ring.at[n % ring.capacity];
    e.seq.store(0, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    timespec ts{};
    ::clock_gettime(CLOCK_MONOTONIC, &ts);
    e.t_ns = static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
    e.bytes = bytes;
    e.pid = pid;
    e.device = static_cast<std::uint16_t>(device);
    e.kind = kind;
    e.seq.store(n + 1, std::memory_order_release);
  }

  /// @brief The slots handed out so far, for a reader (the supervisor's timeline).
  [[nodiscard]] const process_slot* slots_begin() const noexcept {
    return reinterpret_cast<const process_slot*>(this + 1);
  }
  [[nodiscard]] std::size_t slots_in_use() const noexcept { return in_use(); }

  /// @brief A slot for process `pid`, or nullptr when all `capacity` are taken by live
  ///        processes (the library then refuses the process's allocations: it fails closed).
  ///        A slot that already names `pid` belonged to the program this process ran before an
  ///        exec, whose device memory went with its image: it is emptied and taken over.
  process_slot* claim(std::int32_t pid, std::size_t capacity, const event_ring& ring = {}) noexcept {
    for (process_slot *s = slots(), *end = s + in_use(); s != end; ++s)
      if (s->pid.load() == pid) {
        empty(*s, ring, pid);
        return s;
      }
    for (int pass = 0; pass < 2; ++pass) {
      for (process_slot *s = slots(), *end = s + in_use(); s != end; ++s)
        if (take(*s, pid)) return s;
      // None free among those handed out: one more from the untouched rest.
      for (std::uint64_t n = slots_used.load(); n < capacity;)
        if (slots_used.compare_exchange_weak(n, n + 1)) {
          if (take(slots()[n], pid)) return &slots()[n];
          n = slots_used.load();
        }
      reclaim_dead(ring);
    }
    ++slotless;
    return nullptr;
  }

  /// Allocations refused on all devices, the largest of them, and the highest peak of any one.
  [[nodiscard]] std::uint64_t refusals() const noexcept { return sum(&device_ledger::refusals); }
  [[nodiscard]] std::uint64_t largest_refused() const noexcept { return most(&device_ledger::largest_refused); }
  [[nodiscard]] std::uint64_t peak() const noexcept { return most(&device_ledger::peak); }

 private:
  process_slot* slots() noexcept { return reinterpret_cast<process_slot*>(this + 1); }
  [[nodiscard]] std::size_t in_use() const noexcept { return static_cast<std::size_t>(slots_used.load()); }
  bool take(process_slot& s, std::int32_t pid) noexcept {
    std::int32_t free = 0;
    if (!s.pid.compare_exchange_strong(free, pid)) return false;
    ++processes;
    return true;
  }
  static void raise_peak(device_ledger& d, std::uint64_t now) noexcept {
    for (std::uint64_t p = d.peak.load(); now > p && !d.peak.compare_exchange_weak(p, now);) {
    }
  }
  // Gives every device's bytes of `s` (process `pid`'s) back. @return how many.
  std::uint64_t empty(process_slot& s, const event_ring& ring, std::int32_t pid) noexcept {
    std::uint64_t all = 0;
    for (std::size_t d = 0; d < max_devices; ++d) {
      const std::uint64_t b = s.bytes[d].exchange(0);
      devices[d].used -= b;
      record(ring, memory_event::released, pid, d, b);
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

static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "the ledger is shared between processes");
static_assert(sizeof(cap_ledger) % alignof(process_slot) == 0, "slots follow the header, aligned");
static_assert(sizeof(process_slot) % alignof(memory_event) == 0, "the ring follows the slots, aligned");

}  // namespace isorun::preload
