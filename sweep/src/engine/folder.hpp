#pragma once
// Files in a sweep's output folder, which others may write to as well: created and read by
// name inside the folder opened once (openat), never through a symbolic link, never anything
// but a regular file, read with bounds. The folder itself may be a link (a user's own).

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>

#include "isorun/runner/unique_fd.hpp"

namespace isorun::sweep::detail {

/// What isorun keeps of a child's stderr in a log file of the folder (a trial's OUT/logs/ID.err,
/// each attempt; the searcher's OUT/search.err, each run), then a line saying it was cut there.
/// 8 MiB is some 100,000 lines: more than anyone reads of one trial's log, and what a progress bar
/// redrawn a few times a second writes in hours, while 10,000 trials' logs stay within 80 GiB.
/// The start is kept, where things first went wrong; a failed trial's record quotes the end.
inline constexpr std::uint64_t max_log = std::uint64_t{8} << 20;

/// How a refusal of the output folder ends: its way out in the command line's words and
/// Python's, since `isorun.sweep` passes the command's messages on.
inline constexpr std::string_view another_out = "choose another output folder (--out; out= in Python)";

/// @brief Opens the folder `dir`, following a symbolic link to it (the one link allowed).
/// @return an empty descriptor if it does not exist or is not a folder.
/// @throws internal_error if it is there but cannot be opened.
unique_fd open_folder(const std::filesystem::path& dir);

/// @brief Opens the folder `name` inside `dir` (creating it with `create`), not through a link.
/// @return an empty descriptor if it does not exist and !`create`.
/// @throws usage_error naming `shown` if a link or a file is there; internal_error if it cannot
///         be made or opened.
unique_fd open_subfolder(int dir, const std::string& name, bool create, const std::filesystem::path& shown);

/// @brief Opens the folder `out`/`names[0]`/`names[1]`/..., each below `out` not through a link
///        (open_folder, then open_subfolder for each name), creating them with `create`.
/// @return an empty descriptor if `out` or one of them does not exist and !`create`.
/// @throws as open_subfolder does.
unique_fd open_subfolders(const std::filesystem::path& out, std::initializer_list<const char*> names, bool create);

/// @brief Opens the file `name` in `dir` with `flags` (O_RDONLY, or O_WRONLY/O_RDWR with
///        O_CREAT, O_TRUNC, O_APPEND; created 0644), not through a link, and only if it is a
///        regular file: a FIFO planted there neither blocks the open nor is used.
/// @return an empty descriptor if it does not exist and `flags` has no O_CREAT.
/// @throws usage_error naming `shown` if a link or anything but a regular file is there;
///         internal_error if it cannot be opened.
unique_fd open_file(int dir, const std::string& name, int flags, const std::filesystem::path& shown);

/// @brief The whole of the regular file `fd` if it holds at most `limit` bytes.
/// @throws usage_error naming `shown` if it is larger; internal_error if it cannot be read.
std::string read_all(int fd, std::size_t limit, const std::filesystem::path& shown);

/// What read_lines read.
struct lines_read {
  std::size_t complete = 0;  ///< the bytes up to the end of the last complete line
  std::size_t read = 0;      ///< the bytes read: those, and the start of a line with no newline yet
  bool long_tail = false;    ///< that last, unended line is already longer than `max_line`
};

/// @brief Reads `fd` line by line from where it is, holding one line at a time: `line` gets each
///        complete line (without its newline) and its number, or, for a line longer than
///        `max_line`, an empty view and `too_long` (its bytes are skipped, not kept). A last line
///        without its newline is not passed: it is being written, or was cut short. Reads at
///        most `budget` bytes, stopping there as at the file's end. With `in_long_line`, the
///        bytes up to the first newline are the rest of a line already found too long (an
///        earlier read's long_tail), passed as too long.
/// @throws internal_error naming `shown` if a read fails.
lines_read read_lines(int fd, std::size_t max_line, std::size_t budget, bool in_long_line,
                      const std::filesystem::path& shown,
                      const std::function<void(std::string_view line, int number, bool too_long)>& line);

/// @brief read_lines over the whole of `fd` from its start.
/// @return the bytes up to the end of the last complete line.
/// @throws internal_error naming `shown` if a read fails.
std::size_t for_each_line(int fd, std::size_t max_line, const std::filesystem::path& shown,
                          const std::function<void(std::string_view line, int number, bool too_long)>& line);

/// @brief Cuts the file `fd` back to its first `complete` bytes (what for_each_line returned) if
///        it is longer: a line a crash left half written goes, so that the next append starts a
///        line of its own.
/// @throws internal_error naming `shown` if it cannot be cut.
void drop_cut_line(int fd, std::size_t complete, const std::filesystem::path& shown);

/// @brief Writes all of `s` to `fd` (retrying short writes and EINTR). @return 0, or the errno
///        of the write that failed (EIO for a write of nothing).
int write_all(int fd, std::string_view s);

/// @brief The name in OUT/logs of the memory timeline of trial `id`'s attempt `attempt`: one per
///        attempt (ID.memory.json, then ID.attemptN.memory.json), so that an attempt retried at a
///        larger cap keeps the timeline that shows why. Made from the record's id and attempt
///        only: the report finds a timeline by them, never by a path a folder's files name.
std::string timeline_file(const std::string& id, int attempt);

}  // namespace isorun::sweep::detail
