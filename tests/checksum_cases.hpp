#pragma once
// The cases both the simulated device (test_alloc) and a real GPU (test_gpu) must agree with
// libxxhash on, through backend::checksum_chunks: XXH3's short forms (0, 1-3, 4-8, 9-16, 17-128,
// 129-240 bytes) and the long one around its 64-byte stripes and 1 KiB blocks; headers of 0 to
// 16 bytes; device bytes that start unaligned; chunks that leave a short last piece.
#include <xxhash.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "isorun/alloc/backend.hpp"

namespace isorun::test {

struct checksum_tally {
  std::uint64_t compared = 0, wrong = 0, declined = 0;
  std::string first_wrong;  // which case, for the failure message
};

/// @brief Checksums every case of `bytes`, which lie at `device` in `memory`'s device memory, and
///        compares each chunk with XXH3_64bits of the same bytes on the host.
inline checksum_tally check_chunk_checksums(isorun::alloc::backend& memory, const unsigned char* device,
                                            const std::vector<unsigned char>& bytes) {
  const unsigned char header[16] = {9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 11, 12, 13, 14, 15, 16};
  checksum_tally t;
  for (const std::size_t header_bytes : {0, 1, 8, 16})
    for (const std::size_t shift : {0, 3, 8})
      for (const std::size_t total :
           {0,   1,   3,   4,    8,    9,    16,   17,   33,        65,    97,      128,        129,
            200, 240, 241, 1024, 1025, 1087, 1088, 1089, 4096 + 63, 65536, 1000003, 3 * 1048576})
        for (const std::size_t chunk : {std::size_t{1000}, std::size_t{4 << 20}}) {
          if (total < header_bytes || total - header_bytes + shift > bytes.size()) continue;
          const std::size_t n = total - header_bytes;
          std::vector<unsigned char> whole(header, header + header_bytes);  // what the host will receive
          whole.insert(whole.end(), bytes.begin() + static_cast<std::ptrdiff_t>(shift),
                       bytes.begin() + static_cast<std::ptrdiff_t>(shift + n));
          std::vector<std::uint64_t> got((total + chunk - 1) / chunk, 0);
          if (!memory.checksum_chunks(header, header_bytes, device + shift, n, chunk, got.data())) {
            ++t.declined;
            continue;
          }
          for (std::size_t c = 0; c < got.size(); ++c, ++t.compared) {
            if (got[c] == XXH3_64bits(whole.data() + c * chunk, std::min(chunk, total - c * chunk))) continue;
            if (t.wrong++ == 0) {
              std::ostringstream why;
              why << "header " << header_bytes << ", shift " << shift << ", total " << total << ", chunk " << c
                  << " of " << chunk << " bytes";
              t.first_wrong = why.str();
            }
          }
        }
  return t;
}

}  // namespace isorun::test
