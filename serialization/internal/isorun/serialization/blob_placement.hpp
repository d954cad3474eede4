#pragma once
/// @file blob_placement.hpp
/// Where a worker puts large blobs: in the segment its result will be written to.
///
/// A task that returns a blob it made with `blob(size)` would have its bytes copied into the
/// result segment by the encoder: a full copy of the result, plus the freeing of the blob's own
/// memory at the worker's exit, which the call waits for. A worker
/// whose result is a blob installs a placement: the first large blob made while the segment is
/// free is put where the encoder would copy it, so returning it costs a checksum and nothing
/// else (as output_blob does, without the task asking). Everywhere else no placement is installed
/// and large blobs get pages of their own.

#include <cstddef>

#include "isorun/internal_api.hpp"

namespace isorun::serialization {

class ISORUN_INTERNAL_API blob_placement {
 public:
  /// @brief Storage for a new blob of `size` bytes (at least detail::parallel_threshold), or
  ///        nullptr for pages of its own. Called from any of the task's threads.
  virtual std::byte* place(std::size_t size) noexcept = 0;
  /// @brief Takes back the storage of a blob being freed; false if place() did not give it.
  virtual bool take_back(std::byte* data) noexcept = 0;
  /// @brief Whether `data` is a blob place() gave that still lies where the result goes (not
  ///        taken back, nor moved out of the way).
  virtual bool holds(const std::byte* data) noexcept = 0;

 protected:
  ~blob_placement() = default;
};

/// @brief Installs `placement` for every later allocation and freeing of a large blob in this
///        process (nullptr: none). It must outlive every blob it placed.
void set_blob_placement(blob_placement* placement) noexcept;

}  // namespace isorun::serialization
