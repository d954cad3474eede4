#pragma once
// Helpers shared by the test binaries: process liveness, /dev/shm and fd accounting.
#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "isorun/runner/process.hpp"
#include "isorun/runner/watcher_idle.hpp"

extern char** environ;

namespace isorun::test {

/// Entries in /dev/shm named "isorun*". isorun's segments are anonymous memory files and never
/// have a name there, so every such entry would be something left behind.
inline int shm_entries() {
  int n = 0;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d)) n += std::string(e->d_name).rfind("isorun", 0) == 0;
    ::closedir(d);
  }
  return n;
}

/// Starts a new peak of this process's resident memory (VmHWM); false where the kernel refuses.
inline bool reset_peak_resident() {
  return static_cast<bool>(std::ofstream("/proc/self/clear_refs") << "5" << std::flush);
}

/// This process's peak resident memory (VmHWM) in KiB since it started or the last reset.
inline std::size_t peak_resident_kib() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stoul(line.substr(6));
  return 0;
}

/// Which mapping of this process holds `p`, as /proc/self/maps names it ("" for an anonymous one).
inline std::string mapping_of(const void* p) {
  std::ifstream maps("/proc/self/maps");
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  for (std::string line; std::getline(maps, line);) {
    std::uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &lo, &hi) == 2 && at >= lo && at < hi) {
      const auto slash = line.find('/');
      const auto bracket = line.find('[');
      return line.substr(std::min(slash, bracket) == std::string::npos ? line.size() : std::min(slash, bracket));
    }
  }
  return "unmapped";
}

/// Open descriptors of this process, once the call watcher let go of what it held: the calls it
/// watched hold descriptors until it has seen them through.
inline int open_fds() {
  isorun::runner::wait_for_watcher_idle();
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (dirent* e = ::readdir(d))
      if (e->d_name[0] != '.') ++n;
    ::closedir(d);
  }
  return n - 1;  // the DIR's own descriptor
}

/// Waits until process `pid` (any process, not only a child) has exited, at most `bound_ms`
/// (a safety bound so that a regression fails instead of hanging). True if it is gone.
inline bool process_gone(pid_t pid, int bound_ms = 30000) {
  int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) return errno == ESRCH;
  pollfd p{fd, POLLIN, 0};
  int rc = ::poll(&p, 1, bound_ms);
  ::close(fd);
  return rc == 1;
}

/// A program started with its stdout and stderr on pipes.
struct started {
  runner::child process;
  int out = -1, err = -1;
};

/// A finished program: exit status (shell convention) and what it printed.
struct captured {
  int code = -1;
  std::string out, err;
};

/// Pass in `env_extra` to give a program the machine's real GPU inventory (NVML), for the
/// gpu-labelled tests; every other program started by a test sees the inventory it names.
inline const std::string real_gpus = "ISORUN_SIMULATE_GPUS=";

/// @brief The environment for a program a test starts: this one minus ISORUN_* variables, plus
///        `env_extra`, whose variables replace inherited ones of the same name (a test's
///        LD_LIBRARY_PATH is the one the program sees, whatever the caller's was). The GPU
///        inventory is pinned so a test gives the same verdict on any machine: no GPU
///        (`ISORUN_SIMULATE_GPUS=none`) unless `env_extra` sets ISORUN_SIMULATE_GPUS itself (a
///        simulated inventory, or `real_gpus`).
inline std::vector<std::string> test_environment(const std::vector<std::string>& env_extra) {
  auto name_of = [](const std::string& v) { return v.substr(0, v.find('=')); };
  auto set_here = [&](const std::string& v) {
    for (const auto& e : env_extra)
      if (name_of(e) == name_of(v)) return true;
    return false;
  };
  std::vector<std::string> env;
  for (char** v = environ; *v; ++v)
    if (std::string(*v).rfind("ISORUN_", 0) != 0 && !set_here(*v)) env.emplace_back(*v);
  bool pinned = false;
  for (const auto& v : env_extra) {
    pinned = pinned || v.rfind("ISORUN_SIMULATE_GPUS=", 0) == 0;
    if (v != real_gpus) env.push_back(v);
  }
  if (!pinned) env.emplace_back("ISORUN_SIMULATE_GPUS=none");
  return env;
}

/// @brief Starts `exe args...` in test_environment(env_extra).
inline started start_captured(const std::string& exe, const std::vector<std::string>& args,
                              const std::vector<std::string>& env_extra = {}) {
  int o[2], e[2];
  if (::pipe2(o, O_CLOEXEC) != 0 || ::pipe2(e, O_CLOEXEC) != 0) throw std::runtime_error("pipe2");
  runner::spawn_options opts;
  opts.executable = exe;
  opts.args = args;
  opts.env = test_environment(env_extra);
  opts.fds = {{1, o[1]}, {2, e[1]}};
  started s{runner::spawn(opts), o[0], e[0]};
  ::close(o[1]);
  ::close(e[1]);
  return s;
}

/// @brief Reads both pipes to the end, then reaps the program.
inline captured finish_captured(started& s) {
  const auto r = runner::collect_output(s.process, s.out, s.err);
  return {r.code, r.out, r.err};
}

/// @brief Runs a program to completion and captures its output.
inline captured run_captured(const std::string& exe, const std::vector<std::string>& args,
                             const std::vector<std::string>& env_extra = {}) {
  auto s = start_captured(exe, args, env_extra);
  return finish_captured(s);
}

}  // namespace isorun::test
