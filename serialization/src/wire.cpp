#include "isorun/serialization/wire.hpp"

#include <xxhash.h>

#include <cstring>
#include <vector>

#include "parallel.hpp"

namespace isorun::serialization {

std::uint64_t checksum(std::span<const std::byte> bytes) {
  if (bytes.size() <= checksum_chunk) return XXH3_64bits(bytes.data(), bytes.size());
  const std::size_t n = (bytes.size() + checksum_chunk - 1) / checksum_chunk;
  std::vector<std::uint64_t> chunks(n);
  detail::for_each_chunk(n, detail::threads_for(bytes.size()), [&](std::size_t i) {
    const std::size_t at = i * checksum_chunk;
    chunks[i] = XXH3_64bits(bytes.data() + at, std::min<std::size_t>(checksum_chunk, bytes.size() - at));
  });
  return XXH3_64bits(chunks.data(), n * sizeof(std::uint64_t));
}

void write_header(std::byte* segment, std::uint64_t magic, encoding enc, std::uint64_t payload_size,
                  std::uint64_t payload_checksum) noexcept {
  segment_header h{};
  h.magic = magic;
  h.version = wire_version;
  h.encoding = static_cast<std::uint32_t>(enc);
  h.payload_size = payload_size;
  h.checksum = payload_checksum;
  std::memcpy(segment, &h, sizeof h);
}

segment_header read_header(const std::byte* segment, std::uint64_t mapped_size, std::uint64_t magic,
                           std::uint64_t max_payload) {
  if (segment == nullptr || mapped_size < header_size)
    throw wire_error("segment of " + std::to_string(mapped_size) + " bytes is smaller than its 64-byte header");
  segment_header h;
  std::memcpy(&h, segment, sizeof h);  // one snapshot: the other side cannot change it under us
  if (h.magic != magic) throw wire_error("segment has a wrong magic number (not an isorun segment, or never written)");
  if (h.version != wire_version)
    throw wire_error("segment has wire version " + std::to_string(h.version) + ", expected " +
                     std::to_string(wire_version));
  if (h.encoding != static_cast<std::uint32_t>(encoding::binary) &&
      h.encoding != static_cast<std::uint32_t>(encoding::json))
    throw wire_error("segment has unknown encoding " + std::to_string(h.encoding));
  if (h.payload_size > max_payload)
    throw wire_error("payload of " + std::to_string(h.payload_size) + " bytes exceeds the limit of " +
                     std::to_string(max_payload) + " bytes");
  return h;
}

std::span<const std::byte> open_payload(const std::byte* segment, std::uint64_t mapped_size, std::uint64_t magic,
                                        std::uint64_t max_payload, encoding& enc) {
  const segment_header h = read_header(segment, mapped_size, magic, max_payload);
  if (h.payload_size > mapped_size - header_size)
    throw wire_error("payload claims " + std::to_string(h.payload_size) + " bytes but the segment holds only " +
                     std::to_string(mapped_size - header_size));
  std::span<const std::byte> payload{segment + header_size, static_cast<std::size_t>(h.payload_size)};
  if (checksum(payload) != h.checksum) throw wire_error("payload checksum mismatch (corrupt or truncated result)");
  enc = static_cast<encoding>(h.encoding);
  return payload;
}

}  // namespace isorun::serialization
