#pragma once
// The result payload of a Python call: the pickle of what the function returned (or raised) and
// its out-of-band buffers, laid out in the result segment. Read by isorun/_payload.py, after
// the runner has validated its checksum and bounds. Little endian:
//
//   u32 magic "ISPY", u32 tag (0: value, 1: the function raised), u64 buffers,
//   u64 table offset, u64 pickle offset, u64 pickle bytes;
//   at the table offset, per buffer {u64 offset, u64 size}.
//
// Every offset is from the payload's start and every piece lies inside the payload. A buffer laid
// out on its own starts 64-byte aligned (the payload itself starts 64 bytes into a page-aligned
// mapping, so any dtype is aligned); buffers inside the placed storage keep their place in it.
//
// A payload with a large buffer (32 MiB and more) holds its largest one at `placed_offset`, the
// other pieces after it: where the worker places the first large array a function makes
// (numpy_results.hpp), so that such an array is written in place, not copied. In place, the
// storage is held up to the end of the last buffer in it (views of the same array lie inside
// it at their own offsets); copied, the buffer alone.

#include <Python.h>

#include <cstdint>
#include <span>

#include "isorun/worker/task.hpp"

namespace isorun_python {

/// Where a payload holds its largest buffer's storage (task_info::placed_blob_offset): past the
/// head, on a page of its own.
inline constexpr std::uint64_t placed_offset = 4096;

/// @brief Writes and commits the payload of `tag` with `pickle` and `buffers` into `sink`,
///        checksummed. Buffers lying in the storage the worker placed in the segment stay
///        where they are. Call without the GIL (the buffers are held by the caller).
/// @throws what the sink throws (a result too large, a segment that cannot grow).
void write_payload(isorun::worker::result_sink& sink, std::uint32_t tag, const Py_buffer& pickle,
                   std::span<const Py_buffer> buffers);

}  // namespace isorun_python
