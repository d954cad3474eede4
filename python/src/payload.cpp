#include "payload.hpp"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <vector>

#include "isorun/serialization/blob.hpp"
#include "isorun/serialization/codec.hpp"
#include "numpy_results.hpp"

namespace isorun_python {
namespace {

constexpr std::uint32_t magic = 0x59505349;  // "ISPY"
constexpr std::uint64_t head_size = 40;
constexpr std::uint64_t entry_size = 16;
constexpr std::uint64_t alignment = 64;

std::uint64_t aligned(std::uint64_t at, std::uint64_t to) { return (at + to - 1) / to * to; }

const std::byte* bytes_of(const Py_buffer& b) { return static_cast<const std::byte*>(b.buf); }
std::uint64_t size_of(const Py_buffer& b) { return static_cast<std::uint64_t>(b.len); }

// Whether all of buffer `b` lies in `storage`.
bool inside(std::span<const std::byte> storage, const Py_buffer& b) {
  return lies_in(storage, b.buf, static_cast<std::size_t>(b.len));
}

// Where each piece goes. `lead` is the storage laid at placed_offset (empty: none); buffers inside
// it go with it.
struct layout {
  std::span<const std::byte> lead;
  bool lead_in_place = false;
  std::vector<std::uint64_t> buffer_at;
  std::vector<bool> in_lead;
  std::uint64_t table_at = 0, pickle_at = 0, total = 0;
};

layout lay_out(const Py_buffer& pickle, std::span<const Py_buffer> buffers, std::span<const std::byte> lead,
               bool in_place) {
  layout l;
  l.lead = lead;
  l.lead_in_place = in_place;
  l.buffer_at.resize(buffers.size());
  l.in_lead.resize(buffers.size());
  std::uint64_t at = head_size;
  if (!lead.empty()) {
    for (std::size_t i = 0; i < buffers.size(); ++i) {
      if (inside(lead, buffers[i])) {
        l.in_lead[i] = true;
        l.buffer_at[i] = placed_offset + static_cast<std::uint64_t>(bytes_of(buffers[i]) - lead.data());
      }
    }
    at = placed_offset + lead.size();
  }
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    if (l.in_lead[i]) continue;
    l.buffer_at[i] = at = aligned(at, alignment);
    at += size_of(buffers[i]);
  }
  l.table_at = at = aligned(at, sizeof(std::uint64_t));
  at += entry_size * buffers.size();
  l.pickle_at = at;
  l.total = at + size_of(pickle);
  return l;
}

// Writes the pieces, and zeroes what lies between them: the checksum covers the whole payload.
void write(std::byte* dst, const layout& l, std::uint32_t tag, const Py_buffer& pickle,
           std::span<const Py_buffer> buffers) {
  auto put = [&](std::uint64_t at, auto value) { std::memcpy(dst + at, &value, sizeof value); };
  put(0, magic);
  put(4, tag);
  put(8, static_cast<std::uint64_t>(buffers.size()));
  put(16, l.table_at);
  put(24, l.pickle_at);
  put(32, size_of(pickle));
  struct piece {
    std::uint64_t at, size;
  };
  std::vector<piece> written{{0, head_size}};
  if (!l.lead.empty()) {
    if (!l.lead_in_place) std::memcpy(dst + placed_offset, l.lead.data(), l.lead.size());
    written.push_back({placed_offset, l.lead.size()});
  }
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    put(l.table_at + entry_size * i, l.buffer_at[i]);
    put(l.table_at + entry_size * i + 8, size_of(buffers[i]));
    if (l.in_lead[i]) continue;
    std::memcpy(dst + l.buffer_at[i], buffers[i].buf, static_cast<std::size_t>(buffers[i].len));
    written.push_back({l.buffer_at[i], size_of(buffers[i])});
  }
  written.push_back({l.table_at, entry_size * buffers.size()});
  std::memcpy(dst + l.pickle_at, pickle.buf, static_cast<std::size_t>(pickle.len));
  written.push_back({l.pickle_at, size_of(pickle)});
  std::sort(written.begin(), written.end(), [](const piece& a, const piece& b) { return a.at < b.at; });
  std::uint64_t end = 0;
  for (const piece& p : written) {
    if (p.at > end) std::memset(dst + end, 0, p.at - end);
    end = std::max(end, p.at + p.size);
  }
}

}  // namespace

void write_payload(isorun::worker::result_sink& sink, std::uint32_t tag, const Py_buffer& pickle,
                   std::span<const Py_buffer> buffers) {
  // The largest buffer, if large, leads: where it lies, if the worker placed its storage where
  // the result goes; else copied to where that storage would have been, so that the segment has
  // room for it the next time.
  const Py_buffer* largest = nullptr;
  for (const Py_buffer& b : buffers)
    if (size_of(b) >= placed_from && (!largest || b.len > largest->len)) largest = &b;
  layout l = lay_out(pickle, buffers, {}, false);
  std::byte* dst = nullptr;
  if (largest) {
    const std::span<std::byte> storage = numpy_storage_holding(largest->buf, size_of(*largest));
    if (!storage.empty() && isorun::serialization::detail::blob_in_place(storage.data())) {
      // The storage up to the end of the last buffer in it: a slice near its start does not
      // carry the rest of the array into the payload, whose next pieces go over that rest (the
      // function has returned; nothing of the array past its last returned byte is read again).
      std::uint64_t end = 0;
      for (const Py_buffer& b : buffers)
        if (inside(storage, b))
          end = std::max<std::uint64_t>(end, static_cast<std::uint64_t>(bytes_of(b) - storage.data()) + size_of(b));
      l = lay_out(pickle, buffers, storage.first(end), true);
      dst = sink.reserve(l.total, storage.data());
      // Kept in place only if the payload fits the mapping the storage lies in; otherwise the
      // sink moved it out of the way (to private pages at the same address), and it is copied.
      if (dst + placed_offset != storage.data()) dst = nullptr;
    }
    if (!dst) l = lay_out(pickle, buffers, {bytes_of(*largest), size_of(*largest)}, false);
  }
  if (!dst) dst = sink.reserve(l.total, nullptr);
  write(dst, l, tag, pickle, buffers);
  sink.commit(l.total, isorun::serialization::checksum({dst, l.total}), isorun::serialization::encoding::binary);
}

}  // namespace isorun_python
