#pragma once
// A child's stderr as the supervisor passes it on: copied to where it should go (within a bound,
// for a file isorun keeps), its last lines kept for the outcome. Shared by jobs (workers),
// commands and a sweep's searcher.

#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "isorun/runner/printable.hpp"
#include "isorun/runner/units.hpp"

namespace isorun::runner::detail {

inline void write_all(int fd, const char* data, std::size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return;  // a broken echo target must not break the job
    }
    data += w;
    n -= static_cast<std::size_t>(w);
  }
}

// Keeps the last N lines of a stream, each capped, without unbounded growth.
class line_tail {
 public:
  explicit line_tail(std::size_t max_lines) : max_lines_{max_lines} {}
  void feed(const char* data, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      if (data[i] == '\n') {
        push();
      } else if (partial_.size() < max_line) {
        partial_.push_back(data[i]);
      }
    }
  }
  // Valid UTF-8 (valid_utf8): a task may write any bytes, and a line cut at max_line may end
  // inside a character.
  std::vector<std::string> lines() {
    if (!partial_.empty()) push();
    std::vector<std::string> out;
    out.reserve(lines_.size());
    for (const auto& l : lines_) out.push_back(valid_utf8(l));
    return out;
  }

 private:
  static constexpr std::size_t max_line = 1000;
  void push() {
    lines_.push_back(std::move(partial_));
    partial_.clear();
    while (lines_.size() > max_lines_) lines_.pop_front();
  }
  std::size_t max_lines_;
  std::string partial_;
  std::deque<std::string> lines_;
};

// Where a stream is copied: `fd` (-1: nowhere), its first `limit` bytes (0: all of it), then a
// line saying it was cut there, and nothing more. The bound is for the files a sweep keeps (a
// trial's OUT/logs/ID.err, OUT/search.err): a child that writes without end must not fill the
// disk through them. A terminal gets all of it.
class capped_echo {
 public:
  capped_echo(int fd, std::uint64_t limit) : fd_{fd}, limit_{limit} {}
  void write(const char* data, std::size_t n) {
    if (fd_ < 0 || cut_ || n == 0) return;
    if (limit_ == 0 || n <= limit_ - written_) {
      write_all(fd_, data, n);
      written_ += n;
      ends_line_ = data[n - 1] == '\n';
      return;
    }
    const auto room = static_cast<std::size_t>(limit_ - written_);
    write_all(fd_, data, room);
    if (room) ends_line_ = data[room - 1] == '\n';
    const std::string note = std::string(ends_line_ ? "" : "\n") + "isorun: truncated at " + format_size(limit_) +
                             ": what it wrote after this was not kept\n";
    write_all(fd_, note.data(), note.size());
    cut_ = true;
  }

 private:
  int fd_;
  std::uint64_t limit_, written_ = 0;
  bool ends_line_ = true, cut_ = false;
};

/// @brief Reads what the non-blocking `fd` holds now, up to about `most` bytes (one look must not
///        starve the other streams a loop watches): keeps its tail in `tail` (nullptr: none),
///        copies it to `echo`. @return false once the stream has ended (EOF).
inline bool drain(int fd, line_tail* tail, capped_echo& echo, std::size_t most = SIZE_MAX) {
  char buf[16384];
  for (std::size_t read = 0; read < most;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      if (tail) tail->feed(buf, static_cast<std::size_t>(n));
      echo.write(buf, static_cast<std::size_t>(n));
      read += static_cast<std::size_t>(n);
      continue;
    }
    if (n == 0) return false;
    if (errno == EINTR) continue;
    return true;  // EAGAIN: more may come
  }
  return true;  // more may be there: the next look reads on
}

}  // namespace isorun::runner::detail
