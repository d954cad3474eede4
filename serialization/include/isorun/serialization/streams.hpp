#pragma once
/// @file streams.hpp
/// Stream buffers that let cereal write straight into, and read straight out of, a mapped
/// segment: no intermediate buffer, one copy on the way in, none on the way out.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <streambuf>
#include <vector>

#include "isorun/export.hpp"

namespace isorun::serialization {

/// Counts the bytes written to it; used to size a segment exactly before encoding into it.
class counting_buf final : public std::streambuf {
 public:
  [[nodiscard]] std::uint64_t count() const noexcept { return count_; }

 protected:
  std::streamsize xsputn(const char*, std::streamsize n) override {
    count_ += static_cast<std::uint64_t>(n);
    return n;
  }
  int_type overflow(int_type c) override {
    ++count_;
    return traits_type::not_eof(c);
  }

 private:
  std::uint64_t count_ = 0;
};

/// Writes into a fixed region and computes the payload checksum (serialization::checksum) on the
/// way; large writes are hashed piece by piece while each piece is still in cache, and very
/// large ones (a big blob, or one written in place) on several threads, chunk by chunk.
class ISORUN_API span_writer final : public std::streambuf {
 public:
  span_writer(std::byte* begin, std::uint64_t capacity);
  ~span_writer() override;
  span_writer(const span_writer&) = delete;
  span_writer& operator=(const span_writer&) = delete;

  /// Bytes written so far.
  [[nodiscard]] std::uint64_t written() const noexcept { return pos_; }
  /// Checksum of everything written; call once, after the last write.
  [[nodiscard]] std::uint64_t finish_checksum();

 protected:
  std::streamsize xsputn(const char* s, std::streamsize n) override;
  int_type overflow(int_type c) override;

 private:
  void hash_pending();
  void feed(const std::byte* p, std::uint64_t n);
  void copy_and_feed(std::byte* dst, const char* src, std::uint64_t n, bool in_place);
  std::byte* begin_;
  std::uint64_t capacity_;
  std::uint64_t pos_ = 0;
  std::uint64_t hashed_ = 0;
  void* state_;                        // XXH3_state_t of the current checksum chunk, kept out of this header
  std::uint64_t chunk_filled_ = 0;     // bytes of the current chunk hashed so far
  std::vector<std::uint64_t> chunks_;  // the hashes of the completed chunks
};

/// Reads from a fixed region; exposes the read position so that `blob` can alias the bytes
/// instead of copying them.
class ISORUN_API span_reader final : public std::streambuf {
 public:
  span_reader(const std::byte* begin, std::uint64_t size);

  [[nodiscard]] const std::byte* current() const noexcept { return reinterpret_cast<const std::byte*>(gptr()); }
  [[nodiscard]] std::uint64_t remaining() const noexcept { return static_cast<std::uint64_t>(egptr() - gptr()); }
  /// @brief Advances past `n` bytes. @throws wire_error if fewer remain.
  void skip(std::uint64_t n);

 protected:
  std::streamsize xsgetn(char* s, std::streamsize n) override;
};

/// While alive, `blob`s decoded on this thread alias the reader's bytes and keep `owner` alive.
class ISORUN_API in_place_scope {
 public:
  in_place_scope(span_reader& reader, std::shared_ptr<const void> owner) noexcept;
  ~in_place_scope();
  in_place_scope(const in_place_scope&) = delete;
  in_place_scope& operator=(const in_place_scope&) = delete;

  /// The innermost active scope on this thread, or nullptr.
  static in_place_scope* current() noexcept;
  span_reader& reader() const noexcept { return reader_; }
  const std::shared_ptr<const void>& owner() const noexcept { return owner_; }

 private:
  span_reader& reader_;
  std::shared_ptr<const void> owner_;
  in_place_scope* previous_;
};

}  // namespace isorun::serialization
