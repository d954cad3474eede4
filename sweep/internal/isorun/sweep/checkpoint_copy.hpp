#pragma once
/// @file checkpoint_copy.hpp
/// A committed checkpoint copied into another trial's staging folder (population-based
/// training hands a parent's checkpoint down to its child, pbt.hpp), costing the disk what the
/// original costs: each file is cloned where the file system can (FICLONE: Btrfs, XFS), else
/// only its data is copied (SEEK_DATA and SEEK_HOLE find it, copy_file_range copies it), so that
/// a sparse file stays sparse. Symbolic links are copied as links, never followed; anything else
/// (a FIFO, a socket, a device) is refused, and the child then starts afresh.

#include <atomic>
#include <filesystem>

namespace isorun::sweep {

/// @brief Copies what the folder `from` holds into the empty folder `to`.
///
/// Refused before anything is written when its files add up, holes counted (their apparent
/// size), to more than the space free on `to`'s file system; a file that grows while it is
/// copied fails the copy too.
/// @param stop checked between pieces of at most 64 MiB: once true, the copy stops (throws).
///        What was written stays in `to`, for the caller to remove.
/// @throws std::runtime_error saying what and where (and, for one too large, the sizes).
void copy_checkpoint(const std::filesystem::path& from, const std::filesystem::path& to, const std::atomic<bool>& stop);

}  // namespace isorun::sweep
