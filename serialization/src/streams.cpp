#include "isorun/serialization/streams.hpp"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <new>

#include "isorun/serialization/wire.hpp"
#include "parallel.hpp"

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
  if (pos_ > hashed_) feed(begin_ + hashed_, pos_ - hashed_);
  hashed_ = pos_;
}

// Hashes `n` bytes into the current chunk, closing each chunk as it fills.
void span_writer::feed(const std::byte* p, std::uint64_t n) {
  auto* state = static_cast<XXH3_state_t*>(state_);
  while (n > 0) {
    const std::uint64_t take = std::min(checksum_chunk - chunk_filled_, n);
    XXH3_64bits_update(state, p, take);
    chunk_filled_ += take;
    p += take;
    n -= take;
    if (chunk_filled_ == checksum_chunk) {
      chunks_.push_back(XXH3_64bits_digest(state));
      XXH3_64bits_reset(state);
      chunk_filled_ = 0;
    }
  }
}

// Copies (unless the bytes are already in place) and hashes, one cache-sized piece at a time.
void span_writer::copy_and_feed(std::byte* dst, const char* src, std::uint64_t n, bool in_place) {
  for (std::uint64_t done = 0; done < n;) {
    const std::uint64_t step = std::min(hash_chunk, n - done);
    if (!in_place) std::memcpy(dst + done, src + done, step);
    feed(dst + done, step);
    done += step;
  }
}

std::streamsize span_writer::xsputn(const char* s, std::streamsize n) {
  const auto len = static_cast<std::uint64_t>(n);
  if (len > capacity_ - pos_) return 0;  // cereal turns a short write into an exception
  if (len == 0) return 0;
  // Written in place by the task (worker_context::output_blob): only hashed.
  const bool in_place = reinterpret_cast<const std::byte*>(s) == begin_ + pos_;
  if (!in_place && len < hash_chunk) {  // small: copied now, hashed with what follows
    std::memcpy(begin_ + pos_, s, len);
    pos_ += len;
    return n;
  }
  hash_pending();
  std::byte* dst = begin_ + pos_;
  std::uint64_t done = 0;
  if (len >= detail::parallel_threshold) {
    // Up to a chunk boundary here, then whole chunks on several threads, then the rest here.
    done = chunk_filled_ ? std::min(len, checksum_chunk - chunk_filled_) : 0;
    copy_and_feed(dst, s, done, in_place);
    const std::size_t whole = (len - done) / checksum_chunk;
    std::vector<std::uint64_t> hashes(whole);
    detail::for_each_chunk(whole, detail::threads_for(len), [&](std::size_t i) {
      const std::uint64_t at = done + i * checksum_chunk;
      XXH3_state_t* st = XXH3_createState();
      if (!st) std::terminate();
      XXH3_64bits_reset(st);
      for (std::uint64_t off = 0; off < checksum_chunk; off += hash_chunk) {
        if (!in_place) std::memcpy(dst + at + off, s + at + off, hash_chunk);
        XXH3_64bits_update(st, dst + at + off, hash_chunk);
      }
      hashes[i] = XXH3_64bits_digest(st);
      XXH3_freeState(st);
    });
    chunks_.insert(chunks_.end(), hashes.begin(), hashes.end());
    done += whole * checksum_chunk;
  }
  copy_and_feed(dst + done, s + done, len - done, in_place);
  pos_ += len;
  hashed_ = pos_;
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
  auto* state = static_cast<XXH3_state_t*>(state_);
  // The same value as checksum() over the written bytes: one chunk or less is hashed whole.
  if (chunks_.empty()) return XXH3_64bits_digest(state);
  if (chunks_.size() == 1 && chunk_filled_ == 0) return chunks_.front();
  if (chunk_filled_) chunks_.push_back(XXH3_64bits_digest(state));
  return XXH3_64bits(chunks_.data(), chunks_.size() * sizeof(std::uint64_t));
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
