#pragma once
// A child's stderr as the supervisor passes it on: copied to where it should go, its last lines
// kept for the outcome. Shared by jobs (workers) and commands.

#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "isorun/runner/printable.hpp"

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

/// @brief Reads what the non-blocking `fd` holds now, up to about `most` bytes: keeps its tail in
///        `tail`, copies it to `echo_fd` (-1: nowhere). @return false once the stream has ended
///        (EOF).
inline bool drain(int fd, line_tail& tail, int echo_fd, std::size_t most = SIZE_MAX) {
  char buf[16384];
  for (std::size_t read = 0; read < most;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      tail.feed(buf, static_cast<std::size_t>(n));
      if (echo_fd >= 0) write_all(echo_fd, buf, static_cast<std::size_t>(n));
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
