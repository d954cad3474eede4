// The stop source: request_stop() counts a request and writes a byte to a pipe (all it may do in
// a signal handler); a watcher thread reads the pipe and passes the request on.
#include "isorun/sweep/stop_source.hpp"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <atomic>

#include "isorun/runner/errors.hpp"
#include "isorun/sweep/stop_request.hpp"

namespace isorun::sweep {

namespace {
std::atomic<int> stop_count{0};
std::atomic<int> stop_fd{-1};
}  // namespace

void request_stop() noexcept {
  stop_count.fetch_add(1);
  if (int fd = stop_fd.load(); fd >= 0) {
    [[maybe_unused]] auto n = ::write(fd, "x", 1);
  }
}

stop_source::stop_source() {
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC | O_NONBLOCK) != 0) throw internal_error("pipe2 failed");
  read_ = unique_fd(pipefd[0]);
  write_ = unique_fd(pipefd[1]);
  // A request that came before (a Ctrl-C while the sweep was being set up) stands: the count is
  // reset when a stop source ends, not when one begins.
  stop_fd = write_.get();
}

stop_source::~stop_source() {
  close();
  stop_fd = -1;
  stop_count = 0;
}

int stop_source::requests() const noexcept { return stop_count.load(); }

void stop_source::watch(std::function<void(int)> on_request) {
  watcher_ = std::thread([this, on_request = std::move(on_request)] {
    int seen = 0;
    if (const int early = stop_count.load(); early > 0) {  // before there was a pipe to write to
      seen = early;
      on_request(early);
    }
    for (;;) {
      pollfd p{read_.get(), POLLIN, 0};
      if (::poll(&p, 1, -1) <= 0) continue;
      char buf[16];
      while (::read(read_.get(), buf, sizeof buf) > 0) {
      }
      if (closing_.load()) return;
      if (const int n = stop_count.load(); n > seen) {
        seen = n;
        on_request(n);
      }
    }
  });
}

void stop_source::close() noexcept {
  if (!watcher_.joinable()) return;
  closing_ = true;
  [[maybe_unused]] auto woken = ::write(write_.get(), "", 1);  // wake the watcher now
  watcher_.join();
}

}  // namespace isorun::sweep
