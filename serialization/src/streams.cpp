#include "isorun/serialization/streams.hpp"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <new>

#include "isorun/serialization/wire.hpp"

namespace isorun::serialization {
namespace {
// Big enough to amortize the hash call, small enough to still be in L2 when hashed.
constexpr std::uint64_t hash_chunk = 256 * 1024;
thread_local in_place_scope* current_scope = nullptr;
}  // namespace

span_writer::span_writer(std::byte* begin, std::uint64_t capacity)
    : begin_{begin}, capacity_{capacity}, state_{XXH3_createState()} {
  if (!state_) throw std::bad_alloc();
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}

span_writer::~span_writer() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void span_writer::hash_pending() {
  if (pos_ > hashed_) XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), begin_ + hashed_, pos_ - hashed_);
  hashed_ = pos_;
}

std::streamsize span_writer::xsputn(const char* s, std::streamsize n) {
  const auto len = static_cast<std::uint64_t>(n);
  if (len > capacity_ - pos_) return 0;  // cereal turns a short write into an exception
  if (len == 0) return 0;
  if (reinterpret_cast<const std::byte*>(s) == begin_ + pos_) {
    // Written in place by the task (worker_context::output_blob): only hash it.
    pos_ += len;
    hash_pending();
    return n;
  }
  if (len < hash_chunk) {
    std::memcpy(begin_ + pos_, s, len);
    pos_ += len;
    return n;
  }
  hash_pending();
  for (std::uint64_t done = 0; done < len;) {
    const std::uint64_t step = std::min(hash_chunk, len - done);
    std::memcpy(begin_ + pos_, s + done, step);
    pos_ += step;
    done += step;
    hash_pending();
  }
  return n;
}

span_writer::int_type span_writer::overflow(int_type c) {
  if (traits_type::eq_int_type(c, traits_type::eof())) return traits_type::not_eof(c);
  if (pos_ >= capacity_) return traits_type::eof();
  begin_[pos_++] = static_cast<std::byte>(traits_type::to_char_type(c));
  return c;
}

std::uint64_t span_writer::finish_checksum() {
  hash_pending();
  return XXH3_64bits_digest(static_cast<XXH3_state_t*>(state_));
}

span_reader::span_reader(const std::byte* begin, std::uint64_t size) {
  // std::streambuf wants mutable pointers; nothing here ever writes through them.
  auto* b = const_cast<char*>(reinterpret_cast<const char*>(begin));
  setg(b, b, b + size);
}

void span_reader::skip(std::uint64_t n) {
  if (n > remaining())
    throw wire_error("payload truncated: need " + std::to_string(n) + " bytes, " + std::to_string(remaining()) +
                     " remain");
  setg(eback(), gptr() + n, egptr());  // gbump takes an int: too small for >2 GiB
}

std::streamsize span_reader::xsgetn(char* s, std::streamsize n) {
  const auto len = std::min<std::uint64_t>(static_cast<std::uint64_t>(n), remaining());
  if (len == 0) return 0;
  std::memcpy(s, gptr(), len);
  setg(eback(), gptr() + len, egptr());
  return static_cast<std::streamsize>(len);
}

in_place_scope::in_place_scope(span_reader& reader, std::shared_ptr<const void> owner) noexcept
    : reader_{reader}, owner_{std::move(owner)}, previous_{current_scope} {
  current_scope = this;
}

in_place_scope::~in_place_scope() { current_scope = previous_; }

in_place_scope* in_place_scope::current() noexcept { return current_scope; }

}  // namespace isorun::serialization
