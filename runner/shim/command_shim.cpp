// isorun-command-shim: runs a `-- CMD` program for the supervisor (command_shim.hpp says what
// the two agree on). It uses the C library alone: it is on the path of every command's start.
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "isorun/runner/command_shim.hpp"
#include "isorun/serialization/protocol.hpp"

extern char** environ;

namespace {

constexpr int channel = isorun::serialization::control_fd;
// The signals a stop sends the group first (the warning of a sweep that keeps checkpoints among
// them): the program's to act on, never the shim's.
constexpr int program_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM};

[[noreturn]] void fail(const char* what) {
  const int e = errno;
  dprintf(2, "isorun shim: %s%s%s\n", what, e ? ": " : "", e ? strerror(e) : "");
  _exit(125);
}

// The environment for the program: this one, with the cap library (if any) put in front of
// LD_PRELOAD. The shim itself was started without it, so it never preloads the cap into itself.
// What it allocates goes back with free_environment (a sanitizer build checks for leaks).
char** program_environment() {
  const auto& cap_name = isorun::serialization::env::cap_preload;  // a NUL-terminated literal
  const char* cap = getenv(cap_name.data());
  if (!cap) return environ;
  const char* other = getenv("LD_PRELOAD");
  const size_t length = strlen("LD_PRELOAD=") + strlen(cap) + (other && *other ? 1 + strlen(other) : 0) + 1;
  char* preload = static_cast<char*>(malloc(length));
  if (!preload) fail("out of memory");
  snprintf(preload, length, "LD_PRELOAD=%s%s%s", cap, other && *other ? ":" : "", other && *other ? other : "");
  size_t n = 0;
  while (environ[n]) ++n;
  char** env = static_cast<char**>(calloc(n + 2, sizeof(char*)));
  if (!env) fail("out of memory");
  size_t k = 0;
  for (size_t i = 0; i < n; ++i)
    if (strncmp(environ[i], "LD_PRELOAD=", 11) != 0 &&
        !(strncmp(environ[i], cap_name.data(), cap_name.size()) == 0 && environ[i][cap_name.size()] == '='))
      env[k++] = environ[i];
  env[k++] = preload;
  env[k] = nullptr;
  return env;
}

void free_environment(char** env) {
  if (env == environ) return;
  for (char** e = env; *e; ++e)
    if (strncmp(*e, "LD_PRELOAD=", 11) == 0) free(*e);  // the one entry made here
  free(env);
}

// Starts the program with the signals the shim ignores back at their defaults, nothing blocked.
pid_t start(char** argv, char** env, int& error) {
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t defaults, none;
  sigemptyset(&defaults);
  for (int s : program_signals) sigaddset(&defaults, s);
  sigemptyset(&none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  pid_t pid = -1;
  error = posix_spawn(&pid, argv[0], nullptr, &attr, argv, env);
  posix_spawnattr_destroy(&attr);
  return error ? -1 : pid;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || fcntl(channel, F_SETFD, FD_CLOEXEC) != 0) fail("started without a command or channel");
  // Only the program should react to Ctrl-C, SIGTERM or a warning; the shim waits to report its end.
  for (int s : program_signals) signal(s, SIG_IGN);
  // The supervisor's death must take the program's group with it, which this process does when
  // the channel closes: it must outlive the supervisor for that, so no death signal of its own.
  prctl(PR_SET_PDEATHSIG, 0);

  isorun::runner::command_shim_report report{127, 0};
  int error = 0;
  char** env = program_environment();
  const pid_t pid = start(argv + 1, env, error);
  free_environment(env);
  if (pid < 0) {
    errno = error;
    dprintf(2, "isorun: cannot start %s: %s\n", argv[1], strerror(error));
    report.code = error == ENOENT ? 127 : 126;
  } else {
    // Wait for the program, or for the supervisor to go: then the whole group goes with it.
    const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
    if (pidfd < 0) fail("pidfd_open");
    for (;;) {
      pollfd watch[2] = {{pidfd, POLLIN, 0}, {channel, POLLRDHUP, 0}};
      if (poll(watch, 2, -1) < 0) {
        if (errno == EINTR) continue;
        fail("poll");
      }
      if (watch[1].revents & (POLLRDHUP | POLLHUP | POLLERR)) {
        kill(0, SIGKILL);
        _exit(137);
      }
      if (watch[0].revents) break;
    }
    siginfo_t info{};
    while (waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED) != 0)
      if (errno != EINTR) fail("waitid");
    if (info.si_code == CLD_EXITED) report = {info.si_status, 0};
    else report = {-1, info.si_status};  // as exit_status has it: no code when a signal ended it
  }
  send(channel, &report, sizeof report, MSG_NOSIGNAL);
  return 0;
}
