#pragma once
/// @file blob.hpp
/// `isorun::blob`: a byte buffer that crosses the process boundary without being copied on
/// the receiving side.
///
/// In a worker a blob owns its bytes; encoding copies them once into the result segment, unless
/// they are there already: a worker whose task returns a blob places the first large blob the
/// task makes in that segment, where the encoder would copy it (blob_placement.hpp), so returning
/// it copies nothing. When the supervisor decodes a result, every blob in it becomes a read-only
/// view into the mapped segment, which stays mapped for as long as any such view lives.

#include <cereal/archives/binary.hpp>
#include <cereal/cereal.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "isorun/export.hpp"
#include "isorun/serialization/streams.hpp"

namespace isorun {

namespace serialization::detail {

/// @brief Storage for an owned blob of `size` bytes, uninitialized. Large blobs (32 MiB and
///        more) are placed in the worker's result segment where one is installed and free, or
///        else get pages of their own, mapped, so that freeing them can give the pages back on
///        several threads: a worker frees the blob it returned on the result's way back.
/// @throws std::bad_alloc
ISORUN_API std::byte* allocate_blob(std::size_t size);

/// @brief As allocate_blob, its bytes zero: placed storage is cleared, pages of its own are
///        zero already (and stay unfaulted until written).
/// @throws std::bad_alloc
ISORUN_API std::byte* allocate_zeroed_blob(std::size_t size);

/// @brief Whether allocate_blob put `data` where the worker's result goes, and it is still
///        there: a payload that holds it at the placement's offset is then written in place.
ISORUN_API bool blob_in_place(const std::byte* data) noexcept;

/// @brief Frees what allocate_blob(size) or allocate_zeroed_blob(size) returned.
ISORUN_API void free_blob(std::byte* data, std::size_t size) noexcept;

/// The deleter of an owned blob's storage: free_blob with the size it was allocated with.
struct blob_deleter {
  std::size_t size = 0;
  void operator()(std::byte* data) const noexcept { free_blob(data, size); }
};

}  // namespace serialization::detail

class blob {
 public:
  blob() = default;

  /// @brief An owned, uninitialized buffer of `size` bytes.
  /// @throws std::bad_alloc
  explicit blob(std::size_t size)
      : storage_{serialization::detail::allocate_blob(size), {size}}, data_{storage_.get()}, size_{size} {}

  /// @brief An owned copy of `size` bytes at `data`.
  blob(const void* data, std::size_t size) : blob(size) {
    if (size) std::memcpy(storage_.get(), data, size);
  }

  /// @brief A read-only view of `size` bytes at `data`, kept valid by `owner`.
  blob(std::shared_ptr<const void> owner, const std::byte* data, std::size_t size) noexcept
      : owner_{std::move(owner)}, data_{data}, size_{size} {}

  /// @brief A writable view of `size` bytes at `data` owned elsewhere (the worker's result
  ///        segment: see worker_context::output_blob).
  static blob external(std::byte* data, std::size_t size) noexcept {
    blob b;
    b.external_ = data;
    b.data_ = data;
    b.size_ = size;
    return b;
  }

  /// @brief Stands for `size` bytes a worker has already streamed to the supervisor (see
  ///        worker_context::device_result): it has no bytes here, and is only returned.
  static blob streamed(std::size_t size) noexcept {
    blob b;
    b.size_ = size;
    b.streamed_ = true;
    return b;
  }

  blob(blob&& o) noexcept
      : storage_{std::move(o.storage_)},
        external_{std::exchange(o.external_, nullptr)},
        owner_{std::move(o.owner_)},
        data_{std::exchange(o.data_, nullptr)},
        size_{std::exchange(o.size_, 0)},
        streamed_{std::exchange(o.streamed_, false)} {}
  blob& operator=(blob&& o) noexcept {
    storage_ = std::move(o.storage_);
    external_ = std::exchange(o.external_, nullptr);
    owner_ = std::move(o.owner_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    streamed_ = std::exchange(o.streamed_, false);
    return *this;
  }
  blob(const blob& other) : blob(other.data_, other.size_) {
    if (other.streamed_) *this = streamed(other.size_);
  }
  blob& operator=(const blob& other) {
    if (this != &other) *this = blob(other);
    return *this;
  }

  [[nodiscard]] const std::byte* data() const noexcept { return data_; }
  /// Writable bytes; nullptr for a view of a received result (those are read-only).
  [[nodiscard]] std::byte* mutable_data() noexcept { return storage_ ? storage_.get() : external_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
  [[nodiscard]] std::span<const std::byte> bytes() const noexcept { return {data_, size_}; }
  /// True when this blob aliases a shared-memory result instead of owning its bytes.
  [[nodiscard]] bool is_view() const noexcept { return data_ != nullptr && !storage_ && !external_; }
  /// True for the stand-in of a streamed result (blob::streamed).
  [[nodiscard]] bool is_streamed() const noexcept { return streamed_; }

  template <class Archive>
  void save(Archive& ar) const {
    if (streamed_)  // its bytes are with the supervisor already, in place of the whole result
      throw std::logic_error("a blob from device_result() can only be returned as the task's whole result");
    ar(cereal::make_size_tag(static_cast<cereal::size_type>(size_)));
    if constexpr (std::is_same_v<Archive, cereal::BinaryOutputArchive>) {
      ar(cereal::binary_data(data_, size_));
    } else {
      // Text archives (CLI JSON) carry only the size: bytes are not meant to be printed.
    }
  }

  template <class Archive>
  void load(Archive& ar) {
    cereal::size_type n = 0;
    ar(cereal::make_size_tag(n));
    if constexpr (std::is_same_v<Archive, cereal::BinaryInputArchive>) {
      if (auto* scope = serialization::in_place_scope::current()) {
        const std::byte* at = scope->reader().current();
        scope->reader().skip(n);
        *this = blob(scope->owner(), at, static_cast<std::size_t>(n));
        return;
      }
      blob owned(static_cast<std::size_t>(n));
      ar(cereal::binary_data(owned.mutable_data(), owned.size()));
      *this = std::move(owned);
    } else {
      *this = blob(static_cast<std::size_t>(n));
    }
  }

 private:
  std::unique_ptr<std::byte[], serialization::detail::blob_deleter> storage_;
  std::byte* external_ = nullptr;
  std::shared_ptr<const void> owner_;
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  bool streamed_ = false;
};

}  // namespace isorun
