#include "isorun/runner/host_memory.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string_view>
#include <utility>

#include "isorun/runner/containment.hpp"
#include "isorun/runner/errors.hpp"
#include "isorun/runner/units.hpp"
#include "read_text.hpp"

namespace isorun::runner {
namespace {

using detail::read_text;

// Writes `text` to a cgroup file; errno on failure, 0 on success.
int write_file(const std::string& path, std::string_view text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  const int err = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) ? 0 : errno;
  ::close(fd);
  return err;
}

// "key N" from a flat keyed file (memory.events, memory.oom_control).
std::uint64_t keyed(const std::string& text, std::string_view key) {
  std::istringstream in(text);
  for (std::string k; in >> k;) {
    std::uint64_t v = 0;
    if (!(in >> v)) break;
    if (k == key) return v;
  }
  return 0;
}

std::optional<std::uint64_t> number_in(const std::string& path) {
  const std::string text = read_text(path);
  if (text.empty() || text[0] < '0' || text[0] > '9') return std::nullopt;
  return std::stoull(text);
}

// The v1 memory hierarchy's directory for this process's workers' cgroups (made once, removed at
// exit; what a killed isorun left is removed by the next), or "" with the reason in `why_not`.
struct v1_base {
  std::string dir;
  std::string why_not;
  pid_t owner = 0;
};

void remove_v1_dir(const std::string& dir) {
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d))
      if (e->d_type == DT_DIR && e->d_name[0] != '.') ::rmdir((dir + "/" + e->d_name).c_str());
    ::closedir(d);
  }
  ::rmdir(dir.c_str());
}

const v1_base& v1() {
  // Never destroyed: the exit handler below reads it after static destructors would have run.
  static const v1_base& base = *new v1_base([] {
    v1_base b;
    std::string relative;
    {
      std::istringstream in(read_text("/proc/self/cgroup"));
      for (std::string line; std::getline(in, line);) {
        // ID:CONTROLLERS:PATH, the controllers comma-separated
        const auto a = line.find(':'), z = line.find(':', a + 1);
        if (a == std::string::npos || z == std::string::npos) continue;
        std::istringstream controllers(line.substr(a + 1, z - a - 1));
        for (std::string c; std::getline(controllers, c, ',');)
          if (c == "memory") relative = line.substr(z + 1);
      }
    }
    if (relative.empty()) {
      b.why_not = "this process is in no memory cgroup";
      return b;
    }
    std::string mount;
    std::istringstream in(read_text("/proc/self/mountinfo"));
    for (std::string line; std::getline(in, line);) {
      const auto dash = line.find(" - ");
      if (dash == std::string::npos || line.compare(dash + 3, 7, "cgroup ") != 0) continue;
      std::istringstream tail(line.substr(dash + 3));
      std::string type, source, super;
      tail >> type >> source >> super;
      if (("," + super + ",").find(",memory,") == std::string::npos) continue;
      std::istringstream fields(line.substr(0, dash));
      std::string id, parent, dev, root;
      fields >> id >> parent >> dev >> root >> mount;
      if (root != "/") mount.clear();  // a bind mount of a subtree: paths would not line up
      break;
    }
    if (mount.empty()) {
      b.why_not = "no memory controller is mounted";
      return b;
    }
    const std::string own = mount + (relative == "/" ? "" : relative);
    // What an isorun killed (-9) left: directories named after pids that are gone.
    if (DIR* d = ::opendir(own.c_str())) {
      while (dirent* e = ::readdir(d)) {
        if (e->d_type != DT_DIR || std::strncmp(e->d_name, "isorun-", 7) != 0) continue;
        char* end = nullptr;
        const long pid = std::strtol(e->d_name + 7, &end, 10);
        if (pid > 0 && *end == '\0' && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)
          remove_v1_dir(own + "/" + e->d_name);
      }
      ::closedir(d);
    }
    b.dir = own + "/isorun-" + std::to_string(::getpid());
    if (::mkdir(b.dir.c_str(), 0755) != 0 && errno != EEXIST) {
      b.why_not = "cannot create " + b.dir + ": " + std::strerror(errno);
      b.dir.clear();
      return b;
    }
    b.owner = ::getpid();
    std::atexit([] {
      if (::getpid() == v1().owner) remove_v1_dir(v1().dir);
    });
    return b;
  }());
  return base;
}

}  // namespace

std::string host_memory_cap::unavailable() {
  const auto& c = containment();
  if (!c.cgroup)
    return "a host memory cap is enforced by the worker's cgroup, and there is none here (" + c.why_not +
           "); run where a cgroup v2 subtree is delegated to this user";
  if (c.memory_peak) return "";  // the v2 memory controller is on for the workers' cgroups
  const auto& b = v1();
  if (!b.dir.empty()) return "";
  return "the workers' cgroups have no memory controller (it is not enabled in " + c.where + "'s parent, and " +
         b.why_not + "); enable it with +memory in cgroup.subtree_control";
}

bool host_memory_cap::cap_v2(const std::string& cgroup) {
  if (!containment().memory_peak || cgroup.empty()) return false;
  v2_ = cgroup;
  if (const int err = write_file(v2_ + "/memory.max", std::to_string(limit_)))
    throw internal_error("cannot set " + v2_ + "/memory.max: " + std::strerror(err));
  write_file(v2_ + "/memory.swap.max", "0");  // absent without swap accounting: nothing to page out to
  return true;
}

void host_memory_cap::make_v1() {
  const auto& b = v1();
  if (b.dir.empty()) throw internal_error("host memory cap: " + b.why_not);
  static std::atomic<std::uint64_t> next{0};
  const std::string dir = b.dir + "/" + std::to_string(next++);
  if (::mkdir(dir.c_str(), 0755) != 0)
    throw internal_error("cannot create a memory cgroup in " + b.dir + ": " + std::strerror(errno));
  v1_ = dir;
  const std::string value = std::to_string(limit_);
  int err = write_file(v1_ + "/memory.limit_in_bytes", value);
  // memsw is memory and swap together: the same limit leaves no room to swap.
  if (!err && ::access((v1_ + "/memory.memsw.limit_in_bytes").c_str(), F_OK) == 0)
    err = write_file(v1_ + "/memory.memsw.limit_in_bytes", value);
  if (err) {
    ::rmdir(std::exchange(v1_, {}).c_str());
    throw internal_error("cannot set the host memory cap in " + dir + ": " + std::strerror(err));
  }
}

host_memory_cap::host_memory_cap(const child& worker, std::uint64_t limit) : limit_{limit} {
  if (cap_v2(worker.cgroup())) return;
  make_v1();
  if (const int err = write_file(v1_ + "/cgroup.procs", std::to_string(worker.pid()))) {
    ::rmdir(std::exchange(v1_, {}).c_str());
    throw internal_error(std::string("cannot move the worker into its memory cgroup: ") + std::strerror(err));
  }
}

host_memory_cap::host_memory_cap(const std::string& cgroup, std::uint64_t limit, before_start_t) : limit_{limit} {
  if (cap_v2(cgroup)) return;
  make_v1();
  join_ = ::open((v1_ + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC);
  if (join_ < 0) {
    const int err = errno;
    ::rmdir(std::exchange(v1_, {}).c_str());
    throw internal_error("cannot open the memory cgroup's cgroup.procs: " + std::string(std::strerror(err)));
  }
}

void host_memory_cap::started() noexcept {
  if (join_ >= 0) ::close(std::exchange(join_, -1));
}

host_memory_cap::~host_memory_cap() {
  started();
  if (!v1_.empty()) ::rmdir(v1_.c_str());  // empty by now: the child's cgroup v2 was killed
}

void host_memory_cap::classify(outcome& o, const reading& r, std::uint64_t limit, const std::string& who) {
  if (!r.oom_kills || o.ok() || o.kind == outcome_kind::cancelled || o.kind == outcome_kind::timeout) return;
  // The cgroup's OOM killer ended it (or a process it waited for): its cap, not a crash.
  o.message = "host memory: the " + who + " reached its host_mem_limit of " + format_size(limit) + " (peak " +
              format_size(o.host_memory_peak) + "); the kernel's OOM killer killed " + std::to_string(r.oom_kills) +
              " of its processes (" + who + " " + describe(o.exit) + ")";
  o.kind = outcome_kind::out_of_memory;
  o.error_type = "host_memory";
}

host_memory_cap::reading host_memory_cap::read() const {
  reading r;
  if (!v2_.empty()) {
    r.peak = number_in(v2_ + "/memory.peak");
    r.oom_kills = keyed(read_text(v2_ + "/memory.events"), "oom_kill");
  } else if (!v1_.empty()) {
    r.peak = number_in(v1_ + "/memory.max_usage_in_bytes");
    r.oom_kills = keyed(read_text(v1_ + "/memory.oom_control"), "oom_kill");
  }
  return r;
}

}  // namespace isorun::runner
