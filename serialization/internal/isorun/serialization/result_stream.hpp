#pragma once
/// @file result_stream.hpp
/// A result streamed to the supervisor through a small ring of shared memory, for results made
/// on a device (`worker_context::device_result`).
///
/// The worker copies the payload into the ring slot by slot (on a GPU a device-to-host DMA into
/// page-locked slots). Each chunk's hash comes either from the device, computed before the copy
/// where the bytes lie (then the worker's CPU only starts copies), or from the worker's CPU,
/// hashing each slot while the next one is copied in. The supervisor copies each published slot
/// into memory of its own and hashes it as it goes. Neither side maps
/// the whole result in shared memory, so no page tables of a large mapping are built or torn
/// down on the way, nothing waits for the worker's exit, and what the supervisor hands over lies
/// in memory no other process can reach: it cannot change after it was validated.
///
/// The ring (ring_bytes): a control page, then ring_slots slots of ring_slot_bytes. Slot k of a
/// stream holds payload bytes [k * ring_slot_bytes, ...) in slot k % ring_slots. The worker sets
/// the size, signals the start on an eventfd the supervisor polls, then publishes slots in order
/// (`filled`) with the XXH3-64 of each checksum_chunk in them; the supervisor copies and hashes
/// each chunk, compares, and frees slots in order (`freed`). Each side waits on the other in
/// futex words of the shared page: the worker on `freed`, the supervisor's threads on the word of
/// the slot each one needs next. Everything the worker wrote there is
/// untrusted: the supervisor reads the size once, bounds every copy by its own counters, and
/// rejects the result if any chunk's hash differs.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "isorun/internal_api.hpp"
#include "isorun/serialization/wire.hpp"

namespace isorun::serialization {

class pooled_segment;

inline constexpr std::uint64_t ring_slot_bytes = 2 * checksum_chunk;  // 8 MiB: two chunks a slot
inline constexpr std::uint32_t ring_slots = 8;
inline constexpr std::uint64_t ring_control_bytes = 4096;
/// The ring segment's size: the control page and the slots (64 MiB of slots).
inline constexpr std::uint64_t ring_bytes = ring_control_bytes + ring_slots * ring_slot_bytes;
inline constexpr std::uint32_t ring_chunks_per_slot = static_cast<std::uint32_t>(ring_slot_bytes / checksum_chunk);

/// The ring's control page. Counters are accessed through std::atomic_ref (both processes map it).
struct ring_control {
  std::uint64_t total;   ///< payload bytes of the stream; set by the worker before it signals
  std::uint32_t filled;  ///< slots published by the worker
  std::uint32_t freed;   ///< slots the supervisor has copied out (futex word: the worker waits on it)
  /// Per ring slot, bumped after each use of the slot is published: the futex word that slot's
  /// readers wait on, so a publication wakes the threads waiting for that slot and no others.
  std::uint32_t published[ring_slots];
  /// Threads of the worker's CPU the stream keeps busy, set before it signals: the supervisor
  /// copies on the cores left (a hint only; read once and clamped).
  std::uint32_t writer_threads;
  std::uint64_t chunk_hash[ring_slots][ring_chunks_per_slot];  ///< the worker's XXH3-64 per chunk
};
static_assert(sizeof(ring_control) <= ring_control_bytes);

/// @brief Makes a ring ready for a new stream (the supervisor, before handing it out).
ISORUN_INTERNAL_API void reset_ring(std::byte* ring) noexcept;

/// The worker's side: streams one payload through a mapped ring.
class ISORUN_INTERNAL_API stream_writer {
 public:
  /// `ring`: the worker's read-write mapping of the ring segment (ring_bytes); `start_event`:
  /// the eventfd that tells the supervisor a stream begins.
  stream_writer(std::byte* ring, int start_event) noexcept : ring_{ring}, start_event_{start_event} {}

  /// The slots, to be page-locked by whoever copies from a device into them.
  [[nodiscard]] std::span<std::byte> slots() const noexcept {
    return {ring_ + ring_control_bytes, ring_slots * ring_slot_bytes};
  }

  /// Writes payload bytes [offset, offset + n) into `dst`.
  using fill_fn = std::function<void(std::byte* dst, std::uint64_t offset, std::uint64_t n)>;

  /// @brief Streams a payload of `total` bytes, produced slot by slot by `fill` on the calling
  ///        thread; returns once the last slot is published (the supervisor may still be
  ///        copying it). `chunk_hashes`: the XXH3-64 of each checksum_chunk of the payload, known
  ///        beforehand (computed on the device), or empty: then other threads hash each slot
  ///        once filled, before it is published.
  /// @return the payload's checksum (serialization::checksum of the whole payload).
  /// @throws what `fill` throws; std::system_error if the supervisor cannot be signalled;
  ///         std::invalid_argument for chunk hashes of the wrong count.
  std::uint64_t write(std::uint64_t total, const fill_fn& fill, std::span<const std::uint64_t> chunk_hashes = {});

 private:
  std::byte* ring_;
  int start_event_;
};

/// The supervisor's side: receives one stream into memory of its own.
class ISORUN_INTERNAL_API stream_reader {
 public:
  /// @brief Starts receiving the stream announced in `ring` (through the supervisor's mapping
  ///        of it, made when the ring was reset): reads its size once, takes private memory for
  ///        it and starts copying threads.
  /// @throws wire_error for a size of 0 or above `max_payload`; std::bad_alloc without memory.
  stream_reader(std::shared_ptr<pooled_segment> ring, std::uint64_t max_payload);
  stream_reader(const stream_reader&) = delete;
  stream_reader& operator=(const stream_reader&) = delete;
  /// Stops waiting and joins the threads.
  ~stream_reader();

  /// @brief No more slots will be published (the worker reported or is gone): what is published
  ///        is still copied, then the threads stop instead of waiting for more.
  void stop_waiting() noexcept;

  /// What finish() returns.
  struct received {
    std::span<const std::byte> payload;  ///< valid while `owner` lives; no other process maps it
    std::shared_ptr<const void> owner;
    std::uint64_t checksum = 0;  ///< serialization::checksum of the payload, from the copies
  };
  /// @brief Waits for the copying threads (call stop_waiting() first unless the stream is known
  ///        to be complete) and returns the whole payload.
  /// @throws wire_error if the stream is incomplete or a chunk differs from the worker's hash.
  received finish();

  [[nodiscard]] std::uint64_t size() const noexcept { return total_; }

 private:
  void run();
  bool wait_filled(std::uint32_t slot);

  std::shared_ptr<pooled_segment> ring_;
  std::byte* mapped_;
  std::uint64_t total_ = 0;
  std::uint64_t chunks_ = 0;
  std::shared_ptr<std::byte> memory_;
  std::vector<std::uint64_t> hashes_;
  std::atomic<std::uint64_t> next_chunk_{0};
  std::atomic<bool> stop_waiting_{false};
  std::mutex mutex_;                           // guards what follows
  std::vector<std::uint32_t> copied_in_slot_;  // per ring slot: chunks copied of its current use
  std::uint64_t done_chunks_ = 0;
  std::uint64_t freed_ = 0;  // slots freed, in order
  std::string error_;
  std::vector<std::thread> threads_;
  // For ISORUN_STREAM_TRACE.
  bool memory_reused_ = false;
  unsigned threads_count_ = 0;
  std::int64_t started_ns_ = 0, whole_ns_ = 0;
  std::atomic<std::int64_t> waited_ns_{0};
};

}  // namespace isorun::serialization
