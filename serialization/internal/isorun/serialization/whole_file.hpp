#pragma once
/// @file whole_file.hpp
/// Files written into a folder others may write to as well (a sweep's output folder, the page
/// of --memory-timeline): whole or not at all, and never through a symbolic link. The worker
/// writes its memory timeline this way, the sweep every file it replaces.

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

/// @brief The temporary name write_whole_file uses for `name`: `name.XXXXXXXXXXXX.tmp`, twelve
///        random hex digits (what a reader of the folder skips by its ".tmp").
[[nodiscard]] ISORUN_INTERNAL_API std::string temporary_name(const std::string& name);

}  // namespace isorun::serialization
