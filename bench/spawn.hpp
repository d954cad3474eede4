#pragma once
// Starting a program and waiting for it: the floors the benchmarks measure beside isorun.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <string>
#include <vector>

extern char** environ;

namespace isorun::bench {

/// @brief posix_spawn + waitpid of `args` (argv[0] first, a path) with `env` added to this
///        process's environment and stdout to /dev/null, in milliseconds. A program that fails
///        ends the benchmark: its figure would be meaningless.
inline double spawn_ms(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<std::string> all(env);
  std::vector<char*> envp;
  if (!env.empty()) {
    for (char** e = environ; *e; ++e) all.emplace_back(*e);
    for (auto& e : all) envp.push_back(e.data());
    envp.push_back(nullptr);
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  const auto t0 = std::chrono::steady_clock::now();
  pid_t pid;
  if (::posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), env.empty() ? environ : envp.data()) != 0) {
    std::fprintf(stderr, "cannot start %s\n", args[0].c_str());
    std::exit(1);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  posix_spawn_file_actions_destroy(&fa);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "%s failed\n", args[0].c_str());
    std::exit(1);
  }
  return ms;
}

/// @brief The exit of a process that has started and waits: `args` is spawned with a pipe for
///        stdout, says one byte there once it waits, and is then sent SIGTERM; milliseconds from
///        the signal to waitpid's return (its exit and reap, nothing of its start).
inline double exit_ms(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) std::abort();
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  pid_t pid;
  if (::posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ) != 0) {
    std::fprintf(stderr, "cannot start %s\n", args[0].c_str());
    std::exit(1);
  }
  posix_spawn_file_actions_destroy(&fa);
  ::close(out[1]);
  char ready;
  if (::read(out[0], &ready, 1) != 1) {
    std::fprintf(stderr, "%s did not start\n", args[0].c_str());
    std::exit(1);
  }
  ::close(out[0]);
  const auto t0 = std::chrono::steady_clock::now();
  ::kill(pid, SIGTERM);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

/// @brief `tasks` starts of the program `path` (no arguments, stdout to /dev/null) with
///        `in_flight` running at once, as fast as they go: starts per second.
inline double spawn_rate(const char* path, int tasks, int in_flight) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  char* argv[] = {const_cast<char*>(path), nullptr};
  std::deque<pid_t> running;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < tasks; ++i) {
    if (static_cast<int>(running.size()) >= in_flight) {
      ::waitpid(running.front(), nullptr, 0);
      running.pop_front();
    }
    pid_t pid;
    if (::posix_spawn(&pid, path, &fa, nullptr, argv, environ) != 0) std::abort();
    running.push_back(pid);
  }
  for (pid_t p : running) ::waitpid(p, nullptr, 0);
  posix_spawn_file_actions_destroy(&fa);
  return tasks / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace isorun::bench
