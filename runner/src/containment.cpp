#include "isorun/runner/containment.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string_view>
#include <utility>
#include <vector>

#include "read_text.hpp"

namespace isorun::runner {
namespace {

using detail::read_text;

constexpr std::string_view prefix = "isorun-";

bool write_text(const std::string& path, std::string_view text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  return ok;
}

// This process's cgroup v2 directory: the cgroup2 mount plus the path /proc/self/cgroup gives.
std::string own_cgroup_dir(std::string& why_not) {
  std::string relative;
  {
    std::istringstream in(read_text("/proc/self/cgroup"));
    for (std::string line; std::getline(in, line);)
      if (line.rfind("0::", 0) == 0) relative = line.substr(3);
  }
  if (relative.empty()) {
    why_not = "this process is in no cgroup v2 hierarchy";
    return "";
  }
  std::istringstream in(read_text("/proc/self/mountinfo"));
  for (std::string line; std::getline(in, line);) {
    // ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTIONS
    const auto dash = line.find(" - ");
    if (dash == std::string::npos || line.compare(dash + 3, 8, "cgroup2 ") != 0) continue;
    std::istringstream fields(line.substr(0, dash));
    std::string id, parent, dev, root, mount;
    fields >> id >> parent >> dev >> root >> mount;
    if (root != "/") continue;  // a bind mount of a subtree: paths would not line up
    return mount + (relative == "/" ? "" : relative);
  }
  why_not = "no cgroup v2 file system is mounted";
  return "";
}

// Kills what is in `dir` and removes it, its child cgroups first: the cgroups of a supervisor
// that is ending or gone, where nothing is to be kept. A process may have moved itself into the
// supervisor's own directory (a task's child, where workers share this namespace): it goes too,
// or the directory could not be removed.
void remove_tree(const std::string& dir) {
  if (DIR* d = ::opendir(dir.c_str())) {
    std::vector<std::string> subdirs;
    while (dirent* e = ::readdir(d))
      if (e->d_type == DT_DIR && std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0)
        subdirs.push_back(dir + "/" + e->d_name);
    ::closedir(d);
    for (const auto& s : subdirs) remove_tree(s);  // nested cgroups first
  }
  kill_and_remove_cgroup(dir);
}

// What an isorun that was killed (-9) left: its directory, named after its pid, which is gone.
void remove_stale(const std::string& parent) {
  DIR* d = ::opendir(parent.c_str());
  if (!d) return;
  std::vector<std::string> stale;
  while (dirent* e = ::readdir(d)) {
    const std::string_view name = e->d_name;
    if (e->d_type != DT_DIR || name.substr(0, prefix.size()) != prefix) continue;
    char* end = nullptr;
    const long pid = std::strtol(e->d_name + prefix.size(), &end, 10);
    if (pid > 0 && *end == '\0' && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)
      stale.push_back(parent + "/" + e->d_name);
  }
  ::closedir(d);
  for (const auto& s : stale) remove_tree(s);
}

std::string base_dir;  // the directory of this process's children's cgroups, removed at exit
pid_t base_owner = 0;  // the process that made it: a forked child's exit must not kill its workers

void remove_base() {
  if (::getpid() == base_owner) remove_tree(base_dir);
}

// ISORUN_CONTAINMENT: "cgroup" (the default) or "process-group", read at each call so that a
// program (or a test) can choose for some children only.
enum class choice { cgroup, process_group, invalid };

choice chosen() {
  const char* value = std::getenv("ISORUN_CONTAINMENT");
  if (!value || !*value || std::string_view(value) == "cgroup") return choice::cgroup;
  return std::string_view(value) == "process-group" ? choice::process_group : choice::invalid;
}

containment_info detect() {
  containment_info info;
  const std::string own = own_cgroup_dir(info.why_not);
  if (own.empty()) return info;
  // Moving a child from this cgroup into one below it needs write access to this one's procs.
  if (::access((own + "/cgroup.procs").c_str(), W_OK) != 0) {
    info.why_not = own + " is not writable by this user (not delegated)";
    return info;
  }
  remove_stale(own);
  const std::string base = own + "/" + std::string(prefix) + std::to_string(::getpid());
  if (::mkdir(base.c_str(), 0755) != 0 && errno != EEXIST) {
    info.why_not = "cannot create " + base + ": " + std::strerror(errno);
    return info;
  }
  base_dir = base;
  base_owner = ::getpid();
  std::atexit(remove_base);
  if (::access((base + "/cgroup.kill").c_str(), F_OK) != 0) {  // (the root cgroup has none of its own)
    info.why_not = base + " has no cgroup.kill (Linux 5.14 or newer is needed)";
    return info;
  }
  info.cgroup = true;
  info.where = base;
  info.memory_peak = read_text(own + "/cgroup.subtree_control").find("memory") != std::string::npos;
  if (info.memory_peak) write_text(base + "/cgroup.subtree_control", "+memory");
  return info;
}

}  // namespace

const containment_info& containment() {
  static const containment_info off{.why_not = "ISORUN_CONTAINMENT=process-group"};
  static const containment_info invalid{.why_not = "ISORUN_CONTAINMENT is neither cgroup nor process-group"};
  switch (chosen()) {
    case choice::process_group: return off;
    case choice::invalid: return invalid;
    case choice::cgroup: break;
  }
  static const containment_info detected = detect();
  return detected;
}

std::string containment_setting_error() {
  if (chosen() != choice::invalid) return "";
  return std::string("ISORUN_CONTAINMENT=") + std::getenv("ISORUN_CONTAINMENT") +
         ": expected cgroup (the default) or process-group";
}

std::string new_child_cgroup() {
  const auto& info = containment();
  if (!info.cgroup) return "";
  static std::atomic<std::uint64_t> next{0};
  std::string dir = info.where + "/" + std::to_string(next++);
  if (::mkdir(dir.c_str(), 0755) != 0) return "";
  return dir;
}

std::optional<std::uint64_t> kill_and_remove_cgroup(const std::string& cgroup) noexcept {
  std::optional<std::uint64_t> peak;
  try {
    // (Not containment().memory_peak: this also runs while containment() is being detected.)
    if (::access((cgroup + "/memory.peak").c_str(), R_OK) == 0)
      if (const std::string text = read_text(cgroup + "/memory.peak"); !text.empty()) peak = std::stoull(text);
    // cgroup.events says "populated 0" once the last process has exited; a change wakes poll()
    // with POLLPRI. Usually nothing is left, and nothing needs killing.
    const int events = ::open((cgroup + "/cgroup.events").c_str(), O_RDONLY | O_CLOEXEC);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    bool killed = false;
    while (events >= 0) {
      char buf[256];
      const ssize_t n = ::pread(events, buf, sizeof buf - 1, 0);
      if (n <= 0 || std::string_view(buf, static_cast<std::size_t>(n)).find("populated 0") != std::string_view::npos)
        break;
      if (!std::exchange(killed, true)) {
        write_text(cgroup + "/cgroup.kill", "1");
        continue;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                                              std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      pollfd p{events, POLLPRI, 0};
      ::poll(&p, 1, static_cast<int>(left.count()));
    }
    if (events >= 0) ::close(events);
    ::rmdir(cgroup.c_str());
  } catch (...) {
  }
  return peak;
}

}  // namespace isorun::runner
