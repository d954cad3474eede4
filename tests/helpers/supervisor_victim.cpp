// A supervisor to be killed with SIGKILL by a test. Its isolated task starts a grandchild,
// prints "WORKER_PID GRANDCHILD_PID" on the inherited stdout and waits forever. With the
// argument "standby" it instead keeps three standby workers waiting, prints their pids and
// waits forever. With the argument "escape" it is to end normally: it moves a process that left
// its group into its own cgroup (where its workers' cgroups are made), prints
// "CGROUP_DIRECTORY PID" and returns 0. With "forks" it makes a call, forks a child that returns
// from main (running the exit handlers a copy of the library registered), then prints 1 if the
// directory of its workers' cgroups is still there (0 if the child's exit removed it) and
// returns 0 if a call still succeeds.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "isorun/isorun.hpp"
#include "isorun/runner/containment.hpp"
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

int echo(int x) { return x; }
ISORUN_TASK(echo);

int main(int argc, char** argv) {
  isorun::init(argc, argv);
  if (argc == 2 && std::string(argv[1]) == "standby") {
    auto& pool = isorun::runner::standby_for({.label = "standby"}, 3);
    pool.fill();
    for (pid_t pid : pool.snapshot().waiting) std::printf("%d ", static_cast<int>(pid));
    std::printf("\n");
    std::fflush(stdout);
    for (;;) ::pause();
  }
  if (argc == 2 && std::string(argv[1]) == "forks") {
    isorun::isolated(echo)(0);
    const std::string where = isorun::runner::containment().where;
    const pid_t child = ::fork();
    if (child == 0) return 0;
    int status = 0;
    ::waitpid(child, &status, 0);
    std::printf("%d\n", ::access(where.c_str(), F_OK) == 0 ? 1 : 0);
    std::fflush(stdout);
    return isorun::isolated(echo)(7) == 7 ? 0 : 5;
  }
  if (argc == 2 && std::string(argv[1]) == "escape") {
    // What a task's child can do where workers share this process's cgroup namespace.
    const std::string where = isorun::runner::containment().where;
    if (where.empty()) return 3;
    const pid_t stray = ::fork();
    if (stray == 0) {
      ::setsid();
      for (;;) ::pause();
    }
    const std::string pid = std::to_string(stray);
    const int procs = ::open((where + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC);
    if (procs < 0 || ::write(procs, pid.data(), pid.size()) != static_cast<ssize_t>(pid.size())) {
      std::fprintf(stderr, "cannot move %s into %s: %s\n", pid.c_str(), where.c_str(), std::strerror(errno));
      ::kill(stray, SIGKILL);
      return 4;
    }
    ::close(procs);
    std::printf("%s %s\n", where.c_str(), pid.c_str());
    return 0;  // the exit removes the cgroup
  }
  isorun::isolated(hang_forever)(0);
  return 1;  // never reached: the test kills us
}
