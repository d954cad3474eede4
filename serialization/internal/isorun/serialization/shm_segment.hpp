#pragma once
/// @file shm_segment.hpp
/// A POSIX shared-memory file owned through its descriptor, and a mapping of it.
///
/// Segments are created 0600 under an unguessable name (`/isorun-<pid>-<128 random bits>`) and
/// unlinked immediately: from then on only descriptors reach them, which the supervisor hands to
/// its worker by inheritance. A crash of either side therefore leaves nothing in /dev/shm.

#include <cstddef>
#include <cstdint>
#include <string>

namespace isorun::serialization {

/// Owns one descriptor of an already-unlinked shared-memory file.
class shm_file {
 public:
  shm_file() = default;
  /// Adopts `fd` (which must refer to a shared-memory or regular file).
  explicit shm_file(int fd) noexcept : fd_{fd} {}
  shm_file(shm_file&& other) noexcept : fd_{other.release()} {}
  shm_file& operator=(shm_file&& other) noexcept;
  shm_file(const shm_file&) = delete;
  shm_file& operator=(const shm_file&) = delete;
  ~shm_file();

  /// @brief Creates a segment of `size` bytes, 0600, close-on-exec, already unlinked.
  /// @throws std::system_error when shm_open/ftruncate fail (e.g. /dev/shm full).
  static shm_file create(std::uint64_t size);

  /// @brief Current size of the file in bytes (fstat).
  /// @throws std::system_error if fstat fails.
  [[nodiscard]] std::uint64_t size() const;

  /// @brief Grows the file to at least `size` bytes; never shrinks it.
  /// @throws std::system_error if ftruncate fails (tmpfs full).
  void reserve(std::uint64_t size);

  [[nodiscard]] int fd() const noexcept { return fd_; }
  [[nodiscard]] bool valid() const noexcept { return fd_ >= 0; }
  /// Gives up ownership of the descriptor.
  int release() noexcept {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
};

/// A mapping of a file range starting at offset 0; unmapped on destruction.
class mapping {
 public:
  enum class access { read_only, read_write };

  mapping() = default;
  mapping(mapping&& other) noexcept;
  mapping& operator=(mapping&& other) noexcept;
  mapping(const mapping&) = delete;
  mapping& operator=(const mapping&) = delete;
  ~mapping();

  /// @brief Maps `length` bytes of `fd` shared.
  /// @param populate prefault the whole range in one call; much faster than touching
  ///        page by page when the pages already exist (warm, reused segments).
  /// @throws std::system_error if mmap fails.
  static mapping map(int fd, std::uint64_t length, access mode, bool populate);

  [[nodiscard]] std::byte* data() const noexcept { return static_cast<std::byte*>(addr_); }
  [[nodiscard]] std::uint64_t size() const noexcept { return length_; }
  [[nodiscard]] bool valid() const noexcept { return addr_ != nullptr; }

 private:
  void* addr_ = nullptr;
  std::uint64_t length_ = 0;
};

/// @brief Prefix of every segment name in /dev/shm; a leftover is easy to spot.
inline constexpr const char* segment_prefix = "isorun-";

/// @brief Removes /dev/shm entries named `isorun-<pid>-*` whose creator pid no longer runs.
///
/// Entries only exist for the few microseconds between shm_open and shm_unlink; this sweeps the
/// ones a supervisor killed in exactly that window would leave. Errors are ignored.
/// @return the number of entries removed.
std::size_t remove_stale_segments() noexcept;

}  // namespace isorun::serialization
