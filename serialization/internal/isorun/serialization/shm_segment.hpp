#pragma once
/// @file shm_segment.hpp
/// A shared-memory file owned through its descriptor, and a mapping of it.
///
/// Segments are anonymous memory files (memfd_create): they never have a name, in /dev/shm or
/// anywhere, so only descriptors reach them (the supervisor hands them to its worker over the
/// control socket) and a crash of either side can leave nothing behind. They can be *sealed*:
/// once sealed, the kernel refuses every change to their bytes, whoever tries. None can ever
/// shrink: a mapping of a file shrunk under it faults (SIGBUS) where it reads past the new end,
/// and a worker, or a process it left behind, holds a descriptor of each segment it was given.

#include <cstddef>
#include <cstdint>
#include <string>

#include "isorun/internal_api.hpp"

namespace isorun::serialization {

/// Owns one descriptor of an already-unlinked shared-memory file.
class ISORUN_INTERNAL_API shm_file {
 public:
  shm_file() = default;
  /// Adopts `fd` (which must refer to a shared-memory or regular file).
  explicit shm_file(int fd) noexcept : fd_{fd} {}
  shm_file(shm_file&& other) noexcept : fd_{other.release()} {}
  shm_file& operator=(shm_file&& other) noexcept;
  shm_file(const shm_file&) = delete;
  shm_file& operator=(const shm_file&) = delete;
  ~shm_file();

  /// @brief Creates a segment of `size` bytes, close-on-exec, sealable, with no name, sealed
  ///        against shrinking (F_SEAL_SHRINK) from the start.
  /// @throws std::system_error when memfd_create/ftruncate/the seal fail (e.g. out of memory).
  static shm_file create(std::uint64_t size);

  /// @brief Current size of the file in bytes (fstat).
  /// @throws std::system_error if fstat fails.
  [[nodiscard]] std::uint64_t size() const;

  /// @brief Grows the file to at least `size` bytes; never shrinks it.
  /// @throws std::system_error if ftruncate fails (tmpfs full).
  void reserve(std::uint64_t size);

  /// @brief Forbids every further change to the file's bytes and size, by any process, through
  ///        any descriptor or mapping (F_SEAL_WRITE, F_SEAL_GROW, F_SEAL_SHRINK, then F_SEAL_SEAL).
  ///        The kernel grants it only while no writable shared mapping of the file exists.
  /// @return false if a writable mapping still exists somewhere, or a seal already on the file
  ///         forbids adding any (F_SEAL_SEAL): nothing is sealed then.
  /// @throws std::system_error for any other failure.
  bool seal();

  /// @brief Whether seal() succeeded on this file (by any descriptor).
  [[nodiscard]] bool sealed() const noexcept;
  /// @brief The seals on it (F_GET_SEALS), 0 where none or unknown.
  [[nodiscard]] int seals() const noexcept;

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

/// A mapping of a file range starting at offset 0; unmapped on destruction (a large one on several
/// threads: tearing down a gigabyte's page-table entries on one core is a visible part of a call).
class ISORUN_INTERNAL_API mapping {
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

}  // namespace isorun::serialization
