#pragma once
/// @file segment_pool.hpp
/// Supervisor-side recycling of shared-memory segments.
///
/// A new tmpfs page costs a fault and a zero-fill on first touch (far slower than a copy); a page
/// of a reused segment is already resident. The pool keeps finished segments (already unlinked, so
/// nothing is visible in /dev/shm) up to an idle byte limit and hands them to the next worker.
/// Beyond that limit it may keep the segments released lately for a while (set_linger): a
/// program that makes a large result again and again finds its pages warm, and one that stops
/// gets the memory back once the linger has passed.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "isorun/internal_api.hpp"
#include "isorun/serialization/shm_segment.hpp"
#include "isorun/serialization/wire.hpp"

namespace isorun::serialization {

/// One segment and the supervisor's own mapping of it.
class ISORUN_INTERNAL_API pooled_segment {
 public:
  explicit pooled_segment(shm_file file) : file_{std::move(file)} {}

  [[nodiscard]] int fd() const noexcept { return file_.fd(); }
  /// @brief Current size of the underlying file. @throws std::system_error
  [[nodiscard]] std::uint64_t capacity() const { return file_.size(); }

  /// @brief Grows the file to `size` bytes if needed and maps `size` bytes of it read-write
  ///        (never more: a worker given the segment earlier may have grown it); with `populate`
  ///        the mapping is faulted in at once (pages are created where they do not exist).
  /// @throws std::system_error on ftruncate/mmap failure.
  std::byte* writable(std::uint64_t size, bool populate = true);

  /// @brief The payload a worker left here, checked before more than its header is mapped:
  ///        the file's size against the largest payload (header + `max_payload`: a worker may
  ///        have grown it), the header read from the file (read_header), then only the header and
  ///        the payload it declares mapped, read-only once sealed, and checked again from the
  ///        mapping (open_payload). The file cannot shrink under that mapping (shm_file::create);
  ///        what it grows by afterwards is never mapped here.
  /// @throws wire_error for a segment not sealed against shrinking, one grown past any payload,
  ///         or a header or payload that fails its checks.
  /// @throws std::system_error on mmap failure.
  std::span<const std::byte> payload(std::uint64_t magic, std::uint64_t max_payload, encoding& enc);

  /// @brief Seals the segment (shm_file::seal) after dropping this side's writable mapping: from
  ///        then on no process can change it. A sealed segment is not reused by the pool.
  /// @return false if a writable mapping of it still exists elsewhere (nothing is sealed).
  /// @throws std::system_error for a segment that cannot be sealed.
  bool seal();
  /// @brief Sealed here, or by the worker that wrote it (an early_result worker seals its result
  ///        itself, whatever the supervisor then does with it).
  [[nodiscard]] bool sealed() const noexcept { return sealed_ || file_.sealed(); }
  /// @brief Whether no seal but the one against shrinking, which every segment is born with, is
  ///        on it (a task may add one to a descriptor it was given): only such a segment can be
  ///        grown and written again, and so reused.
  [[nodiscard]] bool reusable() const noexcept;

 private:
  friend class segment_pool;

  shm_file file_;
  mapping map_;
  bool sealed_ = false;
  std::uint64_t released_capacity_ = 0;  // its size when it went back to the pool
  std::chrono::steady_clock::time_point released_at_{};
};

class ISORUN_INTERNAL_API segment_pool {
 public:
  /// The process-wide pool of request and result segments.
  static segment_pool& instance();
  /// The process-wide pool of result rings (result_stream.hpp), kept apart: all are ring_bytes.
  static segment_pool& rings();

  /// @brief The smallest idle segment with at least `min_capacity` bytes, unless that is more
  ///        than 4 × `min_capacity` and 1 MiB (large segments are kept for results); else the
  ///        largest idle one smaller than that (grown, then warm); else a new one. With
  ///        `largest`, simply the largest idle one: for results, whose size is unknown in
  ///        advance. It returns to the pool when the last reference goes. An idle segment
  ///        that grew since it came back (a process a worker left behind holds it) is closed,
  ///        never handed out.
  /// @throws std::system_error if a new segment cannot be created.
  std::shared_ptr<pooled_segment> acquire(std::uint64_t min_capacity, bool largest = false);

  /// @brief Most bytes kept idle; segments beyond it are closed when released (default 2 GiB).
  void set_idle_limit(std::uint64_t bytes);
  /// @brief Beyond the idle limit, keeps segments for `linger` after their release, up to
  ///        `bytes` idle in all; a thread of the pool closes each, largest first, once its linger
  ///        has passed and the pool is above the idle limit. 0 bytes: none (the default).
  void set_linger(std::uint64_t bytes, std::chrono::milliseconds linger);
  /// @brief Closes all idle segments.
  void clear();
  [[nodiscard]] std::uint64_t idle_bytes() const;

 private:
  using clock = std::chrono::steady_clock;
  void release(std::unique_ptr<pooled_segment> segment) noexcept;
  [[nodiscard]] std::uint64_t idle_locked() const;
  // Takes out what is above the idle limit and has lingered long enough (closed by the caller,
  // without the lock); returns when to look again.
  clock::time_point expire_locked(clock::time_point now, std::vector<std::unique_ptr<pooled_segment>>& out);
  void trim_loop();

  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<pooled_segment>> idle_;
  std::uint64_t idle_limit_ = 2ULL << 30;
  std::size_t max_idle_count_ = 16;
  std::uint64_t linger_limit_ = 0;
  clock::duration linger_{};
  std::condition_variable trim_wake_;
  int trimmer_pid_ = 0;  // the process whose thread trims (a forked child starts its own)
};

}  // namespace isorun::serialization
