#pragma once
/// @file whole_file.hpp
/// Files in a folder others may write to as well (a sweep's output folder, the page of
/// --memory-timeline): written whole or not at all, read with bounds, never through a symbolic
/// link. The worker writes its memory timeline this way, the sweep every file it replaces.

#include <cstddef>
#include <string>
#include <string_view>

#include "isorun/internal_api.hpp"

namespace isorun::serialization {

/// @brief Writes `content` to the file `name` in the directory open as `dir_fd`: into a new
///        temporary file of a random name beside it (created exclusively, so nothing planted
///        there is written through), fsync'ed when `durable`, then renamed over `name`, which
///        replaces whatever is there (a symbolic link is replaced, not followed). Readers see
///        the old file or the whole new one.
/// @return 0, or the errno of the step that failed; nothing is left behind then.
[[nodiscard]] ISORUN_INTERNAL_API int write_whole_file(int dir_fd, const std::string& name, std::string_view content,
                                                       bool durable);

/// @brief write_whole_file into the folder of `path` (the working folder for a bare name), opened
///        for the call, as the file named by the rest of `path`.
/// @return 0, or the errno of the step that failed (ENOTDIR: the folder is none).
[[nodiscard]] ISORUN_INTERNAL_API int write_whole_file(const std::string& path, std::string_view content, bool durable);

/// @brief Opens the file `name` in the directory open as `dir_fd` with `flags` (created 0644 with
///        O_CREAT), as a file others may have planted there is opened: not through a symbolic
///        link (ELOOP), only a regular file (EINVAL; a FIFO there neither blocks the open nor is
///        used). The descriptor blocks as usual.
/// @return the descriptor, or -1 with errno set (ENOENT: there is none).
[[nodiscard]] ISORUN_INTERNAL_API int open_regular_file(int dir_fd, const std::string& name, int flags);

/// @brief Reads `fd` from where it is to its end into `out`, at most `limit` bytes (EFBIG).
/// @return 0, or the errno of the step that failed; `out` is then empty.
[[nodiscard]] ISORUN_INTERNAL_API int read_bounded(int fd, std::size_t limit, std::string& out);

/// @brief open_regular_file(`dir_fd`, `name`, O_RDONLY), then read_bounded: the whole file.
/// @return 0, or the errno of the step that failed; `out` is then empty.
[[nodiscard]] ISORUN_INTERNAL_API int read_whole_file(int dir_fd, const std::string& name, std::size_t limit,
                                                      std::string& out);

/// @brief The temporary name write_whole_file uses for `name`: `name.XXXXXXXXXXXX.tmp`, twelve
///        random hex digits (what a reader of the folder skips by its ".tmp").
[[nodiscard]] ISORUN_INTERNAL_API std::string temporary_name(const std::string& name);

}  // namespace isorun::serialization
