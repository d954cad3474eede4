#pragma once
/// @file segment_sink.hpp
/// The worker's end of a result: the pooled shared-memory segment the supervisor assigned, the
/// ring a device result streams through, and for a small result neither (it goes in `done`).
///
/// The segment is mapped ahead while the task runs (premap_in_background), lends its payload
/// area to the task (output_blob when asked, blob placement when not: see blob_placement.hpp),
/// and takes the encoded result (reserve, commit). One piece of memory serves all three, so the
/// rules for sharing it live here:
/// - at most one blob is placed in the area, and none once the area was claimed by output_blob
///   or by the encoder;
/// - a placed blob that is still alive when the area is wanted for something else (the task
///   returned another blob, or called output_blob) is moved out first, to private pages at the
///   same address, so it and every view into it keep their bytes;
/// - a placed blob the task returns is encoded where it lies, if the payload it is part of fits
///   the mapping it lies in: only checksummed;
/// - a process the task forks gets a private copy of a placed blob, as it would of any memory
///   (copy on write), not the segment's shared pages; and it places nothing itself.

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "isorun/internal_api.hpp"
#include "isorun/serialization/blob_placement.hpp"
#include "isorun/serialization/result_stream.hpp"
#include "isorun/serialization/shm_segment.hpp"
#include "isorun/worker/task.hpp"
#include "isorun/worker/this_worker.hpp"

namespace isorun::worker {

/// A result larger than the supervisor accepts: not the task's fault, so not a task_error.
class ISORUN_INTERNAL_API result_too_large : public std::length_error {
 public:
  using std::length_error::length_error;
};

class ISORUN_INTERNAL_API segment_sink final : public result_sink,
                                               public worker_context::result_stream,
                                               public serialization::blob_placement {
 public:
  /// @param file the result segment; @param max_result the largest payload accepted;
  /// @param ring, stream_event the result ring and its eventfd (invalid / -1: none).
  segment_sink(serialization::shm_file file, std::uint64_t max_result, serialization::shm_file ring = {},
               int stream_event = -1);
  segment_sink(const segment_sink&) = delete;
  segment_sink& operator=(const segment_sink&) = delete;
  ~segment_sink() override;

  /// @brief Maps the segment for a payload of `expected` bytes (the task's last result), or as
  ///        large as the segment already is if smaller, faulted in, on a thread of its own while
  ///        the task runs. Faulting in a resident segment costs one page-table entry per 4 KiB
  ///        page, which a large result would otherwise pay after the task, on its
  ///        way back. Small results are left alone: the pool may hand a task with small results
  ///        its largest segment.
  void premap_in_background(std::uint64_t expected);

  /// @brief The payload area for output_blob: `size` bytes, claimed for good (no blob is placed
  ///        afterwards; one placed before is moved out first).
  /// @throws result_too_large past max_result; std::system_error if the segment cannot grow.
  std::byte* claim_area(std::uint64_t size);

  // result_sink
  std::byte* reserve(std::uint64_t size, const std::byte* blob_bytes) override;
  void commit(std::uint64_t size, std::uint64_t checksum, serialization::encoding enc) override;
  void commit_streamed(std::uint64_t blob_size) override;

  // worker_context::result_stream
  std::span<std::byte> slots(std::uint64_t total) override;
  void write(std::uint64_t total, const fill_fn& fill, std::span<const std::uint64_t> chunk_hashes) override;

  /// @brief Makes this sink the process's blob placement (serialization::set_blob_placement),
  ///        and keeps what it places private to this process across fork(): the child's copy of
  ///        a placed blob is moved to private pages in the child, before fork() returns there.
  ///        For the worker's one sink: false, with nothing installed, if one is already
  ///        installed in this process or the fork handlers cannot be registered.
  bool install_blob_placement() noexcept;

  /// @brief Where in the payload a placed blob begins (task_info::placed_blob_offset): after a
  ///        blob result's 8-byte length unless set otherwise. Set before anything is placed.
  void set_placed_offset(std::uint64_t offset) noexcept { placed_offset_ = offset; }

  // serialization::blob_placement: only where the segment already has room (a placed blob never
  // grows the pooled segment), and only into a free area.
  std::byte* place(std::size_t size) noexcept override;
  bool take_back(std::byte* data) noexcept override;
  bool holds(const std::byte* data) noexcept override;

  [[nodiscard]] bool has_ring() const noexcept { return ring_.valid(); }

  /// Before the exit: unmaps the result's mapping on all cores (the exit would, on one). A
  /// mapping still being made ahead (a task that failed before it wrote a result) is left to the
  /// exit.
  void unmap_result();

  /// @brief The committed result's bytes (header, payload) if they were small enough to travel
  ///        in `done` (control.hpp, inline_limit) and so never went to the segment; empty
  ///        otherwise. Taken once.
  std::string take_inline_result();

  /// Lets go of the segment and seals it where nothing else maps it writable: this process can
  /// no longer change it. (Sealed here, on the CPU that wrote it: a seal drains the page batches
  /// of every CPU that holds some of its pages, through a kernel worker on each, and the
  /// supervisor's seal, made once this process exits on that CPU, would wait for the exit.)
  void close();

  /// When the task's run ended (its result began to be encoded) and when the result was
  /// committed, CLOCK_MONOTONIC ns; 0 until then.
  std::int64_t run_end_ns_ = 0, committed_ns_ = 0;

 private:
  std::byte* claim_locked(std::uint64_t size, const std::byte* blob_bytes);
  std::byte* area_locked(std::uint64_t size);
  void evict_locked();
  static void before_fork() noexcept;
  static void after_fork_in_parent() noexcept;
  static void after_fork_in_child() noexcept;
  serialization::mapping take_premapped(bool stop);
  serialization::stream_writer& writer();

  static constexpr std::uint64_t premap_threshold = 32ULL << 20;

  std::mutex mutex_;      // the segment's mapping and its placed blob, shared by the task's threads
  std::string inline_;    // a small result's header and payload, written here instead of the segment
  bool inlined_ = false;  // the area reserve() gave is inline_
  bool committed_ = false;
  serialization::shm_file file_;
  serialization::mapping map_;
  serialization::mapping premapped_;  // premap_in_background()'s mapping, until area_locked() takes it
  std::thread premapper_;
  std::atomic<bool> stop_premap_{false};
  std::uint64_t max_result_;
  pid_t owner_pid_;              // the worker; a process the task forks places nothing
  bool claimed_ = false;         // by output_blob or the encoder: nothing is placed any more
  std::byte* placed_ = nullptr;  // the blob placed in the payload area, while it lives
  std::uint64_t placed_size_ = 0;
  std::uint64_t placed_offset_ = sizeof(std::uint64_t);  // where in the payload a blob is placed
  struct evicted {
    std::byte* data;               // the placed blob's bytes, now in private pages
    serialization::mapping pages;  // the range those pages occupy, unmapped when it is freed
  };
  std::vector<evicted> evicted_;
  serialization::shm_file ring_;
  int stream_event_;
  serialization::mapping ring_map_;
  std::optional<serialization::stream_writer> writer_;
  bool streamed_ = false;
  std::uint64_t stream_total_ = 0, stream_checksum_ = 0;
};

}  // namespace isorun::worker
