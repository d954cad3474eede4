// A supervisor to be killed with SIGKILL by a test. Its isolated task starts a grandchild,
// prints "WORKER_PID GRANDCHILD_PID" on the inherited stdout and waits forever. With the
// argument "standby" it instead keeps three standby workers waiting, prints their pids and
// waits forever.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "isorun/isorun.hpp"
#include "isorun/runner/standby.hpp"

int hang_forever(int) {
  pid_t g = ::fork();
  if (g == 0) {
    for (;;) ::pause();
  }
  std::printf("%d %d\n", static_cast<int>(::getpid()), static_cast<int>(g));
  std::fflush(stdout);
  for (;;) ::pause();
}
ISORUN_TASK(hang_forever);

int main(int argc, char** argv) {
  isorun::init(argc, argv);
  if (argc == 2 && std::string(argv[1]) == "standby") {
    auto& pool = isorun::runner::standby_for({.label = "standby"}, 3);
    pool.fill();
    for (pid_t pid : pool.waiting_pids()) std::printf("%d ", static_cast<int>(pid));
    std::printf("\n");
    std::fflush(stdout);
    for (;;) ::pause();
  }
  isorun::isolated(hang_forever)(0);
  return 1;  // never reached: the test kills us
}
