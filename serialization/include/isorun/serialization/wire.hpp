#pragma once
/// @file wire.hpp
/// The layout of a shared-memory segment: a 64-byte header followed by the payload.
///
/// Everything read from a worker is untrusted. `open_payload` checks magic, version, encoding,
/// bounds and the XXH3-64 checksum before handing out a view, and throws `wire_error` naming the
/// first thing that was wrong.

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>

#include "isorun/export.hpp"

namespace isorun::serialization {

/// A malformed, truncated, oversized or corrupt segment or message.
class ISORUN_API wire_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// How the payload is encoded.
enum class encoding : std::uint32_t {
  binary = 1,  ///< cereal binary archive (C++ API)
  json = 2,    ///< UTF-8 JSON text (CLI)
};

inline constexpr std::uint64_t request_magic = 0x3151'4e55'524f'5349ULL;  // "ISORUNQ1"
inline constexpr std::uint64_t result_magic = 0x3152'4e55'524f'5349ULL;   // "ISORUNR1"
/// A result whose payload came through the result stream (result_stream.hpp): its header's size
/// and checksum describe the streamed bytes, and no payload follows it in the segment.
inline constexpr std::uint64_t streamed_result_magic = 0x3153'4e55'524f'5349ULL;  // "ISORUNS1"
inline constexpr std::uint32_t wire_version = 2;

/// First 64 bytes of every segment. Plain data, written last by the producer.
struct segment_header {
  std::uint64_t magic;
  std::uint32_t version;
  std::uint32_t encoding;
  std::uint64_t payload_size;
  std::uint64_t checksum;  ///< serialization::checksum of the payload bytes
  std::uint64_t reserved[4];
};
static_assert(sizeof(segment_header) == 64);

inline constexpr std::uint64_t header_size = sizeof(segment_header);

/// Payloads are checksummed in chunks of this size, so that both sides can hash a large payload
/// on several cores at once.
inline constexpr std::uint64_t checksum_chunk = 4ULL << 20;

/// @brief The payload checksum: XXH3-64 of `bytes` when they fit in one checksum_chunk, else
///        XXH3-64 of the chunks' XXH3-64 values (little-endian, in order). Large payloads are
///        hashed on several threads.
ISORUN_API std::uint64_t checksum(std::span<const std::byte> bytes);

/// @brief Writes the header for a payload already in place after it.
ISORUN_API void write_header(std::byte* segment, std::uint64_t magic, encoding enc, std::uint64_t payload_size,
                             std::uint64_t payload_checksum) noexcept;

/// @brief Reads and validates a segment's header (not its payload): magic, version, encoding,
///        and the payload size against `max_payload`.
/// @throws wire_error for a segment smaller than its header or a header that fails a check.
ISORUN_API segment_header read_header(const std::byte* segment, std::uint64_t mapped_size, std::uint64_t magic,
                                      std::uint64_t max_payload);

/// @brief Validates a segment and returns its payload.
/// @param segment     start of the mapped segment
/// @param mapped_size bytes mapped at `segment`
/// @param magic       expected magic (request_magic or result_magic)
/// @param max_payload largest payload the reader accepts
/// @param enc         receives the payload encoding
/// @throws wire_error if the segment is too small, has a wrong magic/version/encoding, claims a
///         payload beyond the mapping or above `max_payload`, or fails its checksum.
ISORUN_API std::span<const std::byte> open_payload(const std::byte* segment, std::uint64_t mapped_size,
                                                   std::uint64_t magic, std::uint64_t max_payload, encoding& enc);

}  // namespace isorun::serialization
