// Tasks that turn on the machinery around them: the worker's control socket, which is open in
// their own process. Real workers, as in test_runner.cpp (the tasks below run in re-executed
// copies of this binary).
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <system_error>

#include "isorun/isorun.hpp"
#include "isorun/serialization/control.hpp"
#include "test_support.hpp"

using namespace std::chrono_literals;
using isorun::test::process_gone;

namespace {
namespace ser = isorun::serialization;

// Writes junk to the worker's control socket, without waiting, until its buffer is full or the
// supervisor hangs up, then returns: the worker's own `done` would find no room left.
std::string jams_control(int) {
  const char junk[] = "not a control message";
  while (::send(ser::control_fd, junk, sizeof junk, MSG_DONTWAIT | MSG_NOSIGNAL) > 0) {
  }
  return "returned";
}

// One junk frame, then waits for ever: only the supervisor can end it.
std::string junk_then_waits(int) {
  const char junk[] = "not a control message";
  ::send(ser::control_fd, junk, sizeof junk, MSG_NOSIGNAL);
  for (;;) ::pause();
}

// Well-formed hellos, as many as the socket takes.
std::string floods_control(int) {
  ser::hello_message hello;
  hello.pid = ::getpid();
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) hello.visible_devices = v;
  if (const char* v = std::getenv("CUDA_DEVICE_ORDER")) hello.device_order = v;
  try {
    for (;;) ser::send_message(ser::control_fd, hello);
  } catch (const std::system_error&) {  // the supervisor hung up
  }
  return "returned";
}

// Reports `done` itself and returns: the worker's own `done` is one more than the protocol has.
std::string forges_done(int) {
  ser::send_message(ser::control_fd, ser::done_message{});
  return "returned";
}

}  // namespace

ISORUN_TASK(jams_control);
ISORUN_TASK(junk_then_waits);
ISORUN_TASK(floods_control);
ISORUN_TASK(forges_done);

TEST_CASE("a task that writes to its worker's control socket stops the worker at once, as invalid_result",
          "[runner][hostile]") {
  using k = isorun::outcome_kind;
  const int shm = isorun::test::shm_entries();
  struct expectation {
    const char* name;
    std::string (*task)(int);
    const char* says;
  };
  const expectation cases[] = {
      {"jams_control", jams_control, "malformed control message"},
      {"junk_then_waits", junk_then_waits, "malformed control message"},
      {"floods_control", floods_control, "second hello"},
      {"forges_done", forges_done, "second done"},
  };
  for (const bool early : {false, true}) {
    for (const auto& c : cases) {
      // An early result is handed over on the first `done`, which a forged one then is.
      if (early && c.task == forges_done) continue;
      INFO(c.name << (early ? " (early result)" : ""));
      // The timeout bounds a worker that is never stopped, so that it fails the test instead of
      // hanging it.
      const isorun::isolated_options opts{.timeout = 60s, .echo_stderr = false, .early_result = early};
      auto h = isorun::isolated(c.task, opts).async(0);
      const pid_t pid = h.pid();
      auto r = h.try_get();
      CHECK(r.status().kind == k::invalid_result);
      CHECK_THAT(r.status().message, Catch::Contains(c.says));
      CHECK_THAT(r.status().message, Catch::Contains("must not write to descriptor 3"));
      CHECK(process_gone(pid, 0));  // stopped and reaped before the call returned
    }
  }
  CHECK(isorun::test::shm_entries() == shm);
}
