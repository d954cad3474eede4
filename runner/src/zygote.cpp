#include "isorun/runner/zygote.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>

#include "isorun/preload/cap_region.hpp"
#include "isorun/runner/containment.hpp"
#include "isorun/runner/driver_cap.hpp"
#include "isorun/runner/errors.hpp"
#include "isorun/serialization/control.hpp"

namespace isorun::runner {
namespace wire = zygote_wire;
namespace ser = isorun::serialization;

namespace {

bool names_cap_library(const std::string& entry) {
  return entry.rfind("LD_PRELOAD=", 0) == 0 && entry.find(preload::library_name) != std::string::npos;
}

// Sends `req` with `fds`; receives the reply and, with a child, its pidfd. Throws what failed.
wire::reply exchange(int control, const wire::request& req, const int* fds, int nfds, unique_fd& pidfd) {
  ssize_t n = ser::send_with_fds(control, std::as_bytes(std::span(&req, 1)),
                                 std::span<const int>(fds, static_cast<std::size_t>(nfds)));
  if (n != static_cast<ssize_t>(sizeof req))
    throw internal_error(std::string("the zygote does not take requests: ") + std::strerror(errno));

  wire::reply rep;
  int got[1];
  std::size_t ngot = 0;
  int flags = 0;
  n = ser::receive_with_fds(control, std::as_writable_bytes(std::span(&rep, 1)), got, ngot, 0, &flags);
  if (ngot == 1) pidfd.reset(got[0]);
  if (n == 0) throw internal_error("the zygote has exited");
  if (n != static_cast<ssize_t>(sizeof rep) || (flags & (MSG_TRUNC | MSG_CTRUNC)))
    throw internal_error("the zygote's reply is malformed");
  return rep;
}

}  // namespace

launch_spec zygote_spec(const launch_spec& spec) {
  launch_spec z = spec;
  z.zygote = true;
  z.label = "zygote";
  z.before_start = nullptr;
  z.extra_env.push_back(std::string(wire::zygote_env) + "=1");
  z.extra_env.push_back(std::string(serialization::env::cap_zygote) + "=1");
  // The cap library refuses CUDA in the zygote; a capped call's workers have it already (with
  // their deferred cap), others get it only for the zygote: their children restore LD_PRELOAD.
  if (std::none_of(z.extra_env.begin(), z.extra_env.end(), names_cap_library)) {
    std::string preload = driver_cap::library();
    const auto given = std::find_if(z.extra_env.begin(), z.extra_env.end(),
                                    [](const std::string& e) { return e.rfind("LD_PRELOAD=", 0) == 0; });
    std::string children;
    if (given != z.extra_env.end()) {
      children = given->substr(sizeof "LD_PRELOAD=" - 1);
      z.extra_env.erase(given);
    } else if (const char* inherited = std::getenv("LD_PRELOAD")) {
      children = inherited;
    }
    if (!children.empty()) preload += ":" + children;
    z.extra_env.push_back("LD_PRELOAD=" + preload);
    z.extra_env.push_back(std::string(wire::child_preload_env) + "=" + (children.empty() ? "-" : children));
  }
  return z;
}

namespace {
std::string threads_started(int threads) {
  return "it runs " + std::to_string(threads) + " threads, which a preload started: forking it would not be safe";
}

void say_exec_instead(const std::string& why) {
  const std::string line = "isorun: the zygote cannot fork workers (" + why + "): each worker is exec'd instead\n";
  [[maybe_unused]] auto n = ::write(2, line.data(), line.size());
}
}  // namespace

zygote_launcher::zygote_launcher(const launch_spec& spec) : interrupted_{::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)} {
  try {
    if (!interrupted_) throw internal_error(std::string("eventfd: ") + std::strerror(errno));
    zygote_.emplace(exec_.launch(zygote_spec(spec)));
  } catch (const std::exception& e) {
    broken_ = true;
    say_exec_instead(e.what());
  }
}

zygote_launcher::~zygote_launcher() {
  std::lock_guard lock(mutex_);
  if (!zygote_) return;
  zygote_->control.reset();  // it reads the hang-up, and exits
  zygote_->process.stop(stop_plan::immediate());
  forward_stderr();
}

pid_t zygote_launcher::zygote_pid() const {
  std::lock_guard lock(mutex_);
  return zygote_ && !broken_ ? zygote_->process.pid() : -1;
}

bool zygote_launcher::forking() const {
  std::lock_guard lock(mutex_);
  return !broken_;
}

void zygote_launcher::forward_stderr() noexcept {
  // What the zygote itself writes (a preload that failed to import) goes to this process's
  // stderr; its children write to their own.
  if (!zygote_ || !zygote_->stderr_read) return;
  char buf[4096];
  for (ssize_t n; (n = ::read(zygote_->stderr_read.get(), buf, sizeof buf)) > 0;) {
    [[maybe_unused]] auto w = ::write(2, buf, static_cast<std::size_t>(n));
  }
}

void zygote_launcher::interrupt() noexcept {
  const std::uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(interrupted_.get(), &one, sizeof one);
}

void zygote_launcher::give_up(const std::string& why) noexcept {
  broken_ = true;
  forward_stderr();
  say_exec_instead(why);
  if (zygote_) {
    zygote_->control.reset();
    zygote_->process.stop(stop_plan::immediate());
    zygote_.reset();
  }
}

bool zygote_launcher::wait_ready() {
  int control = -1;
  {
    std::lock_guard lock(mutex_);
    if (ready_ || broken_) return ready_;
    control = zygote_->control.get();
  }
  // Without the lock: nothing else reads the socket before the zygote is ready (launch() execs
  // until then), and the zygote stays open until this object goes.
  std::string failed;
  for (;;) {
    pollfd fds[2] = {{control, POLLIN, 0}, {interrupted_.get(), POLLIN, 0}};
    const int n = ::poll(fds, 2, -1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      failed = std::string("poll: ") + std::strerror(errno);
      break;
    }
    if (fds[1].revents) return false;
    wire::reply rep;
    ssize_t got;
    while ((got = ::recv(control, &rep, sizeof rep, 0)) < 0 && errno == EINTR) {
    }
    if (got == 0) failed = "it exited before it was ready";
    else if (got != static_cast<ssize_t>(sizeof rep) || rep.pid != 0) failed = "its first message is malformed";
    else if (rep.threads != 1) failed = threads_started(rep.threads);
    break;
  }
  std::lock_guard lock(mutex_);
  if (!failed.empty()) {
    give_up(failed);
    return false;
  }
  ready_ = true;
  return true;
}

launched_worker zygote_launcher::launch(const launch_spec& spec) {
  {
    std::lock_guard lock(mutex_);
    if (!broken_ && ready_) {
      try {
        auto w = fork_one(spec);
        forward_stderr();
        return w;
      } catch (const std::exception& e) {
        give_up(e.what());
      }
    }
  }
  // Not forking (not yet: the zygote is still importing, or may never finish; or no more):
  // exec'd, with the same isolation, and nothing on a call's path waits for the zygote's imports.
  launch_spec exec_spec = spec;
  exec_spec.zygote = false;
  return exec_.launch(exec_spec);
}

launched_worker zygote_launcher::fork_one(const launch_spec& spec) {
  if (!zygote_ || zygote_->process.peek()) throw internal_error("the zygote has exited");
  launched_worker w;
  const worker_ends ends = make_worker_ends(spec, w);

  // The cgroup is this call's until the child owns it.
  struct cgroup_guard {
    std::string dir;
    bool owned = false;
    ~cgroup_guard() {
      if (!dir.empty() && !owned) kill_and_remove_cgroup(dir);
    }
  } cgroup{new_child_cgroup()};
  unique_fd cgroup_dir;
  wire::request req;
  int fds[wire::child_fds + 1] = {ends.stdin_null.get(), ends.stdout_fd, ends.stderr_write.get(), ends.control.get(),
                                  -1};
  int nfds = wire::child_fds;
  if (!cgroup.dir.empty()) {
    cgroup_dir.reset(::open(cgroup.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!cgroup_dir) throw internal_error("cannot open cgroup " + cgroup.dir + ": " + std::strerror(errno));
    fds[nfds++] = cgroup_dir.get();
    req.flags |= wire::with_cgroup;
    if (cgroup_namespaces_enabled()) req.flags |= wire::with_namespace;
  }
  unique_fd pidfd;
  w.started = std::chrono::steady_clock::now();
  const wire::reply rep = exchange(zygote_->control.get(), req, fds, nfds, pidfd);
  if (rep.pid <= 0) {
    if (rep.error == wire::error_threads) throw internal_error(threads_started(rep.threads));
    throw internal_error(std::string("clone3: ") + std::strerror(rep.error));
  }
  if (!pidfd) throw internal_error("the zygote forked a worker but sent no pidfd for it");
  cgroup.owned = true;
  w.process = child(rep.pid, pidfd.release(), true, std::move(cgroup.dir));
  return w;
}

}  // namespace isorun::runner
