// A supervisor to be killed with SIGKILL by a test. Its isolated task starts a grandchild,
// prints "WORKER_PID GRANDCHILD_PID" on the inherited stdout and waits forever.
#include <signal.h>
#include <unistd.h>

#include <cstdio>

#include "isorun/isorun.hpp"

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
  isorun::isolated(hang_forever)(0);
  return 1;  // never reached: the test kills us
}
