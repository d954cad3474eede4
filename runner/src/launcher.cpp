#include "isorun/runner/launcher.hpp"

#include "isorun/runner/containment.hpp"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "isorun/runner/errors.hpp"
#include "isorun/runner/worker_env.hpp"
#include "isorun/serialization/protocol.hpp"

namespace isorun::runner {
namespace ser = isorun::serialization;

worker_ends make_worker_ends(const launch_spec& spec, launched_worker& w) {
  worker_ends ends;
  int sv[2], err_pipe[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
    throw internal_error(std::string("socketpair: ") + std::strerror(errno));
  w.control.reset(sv[0]);
  ends.control.reset(sv[1]);
  if (spec.before_start) spec.before_start(w.control.get());
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) throw internal_error(std::string("pipe2: ") + std::strerror(errno));
  w.stderr_read.reset(err_pipe[0]);
  ends.stderr_write.reset(err_pipe[1]);
  ::fcntl(err_pipe[0], F_SETFL, O_NONBLOCK);
  ends.stdin_null.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!ends.stdin_null)
    throw internal_error(std::string("cannot open /dev/null for the worker's stdin: ") + std::strerror(errno));
  ends.stdout_fd = spec.stdout_to_stderr ? ends.stderr_write.get() : STDOUT_FILENO;
  return ends;
}

launched_worker local_launcher::launch(const launch_spec& spec) {
  launched_worker w;
  const worker_ends ends = make_worker_ends(spec, w);

  spawn_options opts;
  opts.executable = spec.executable.empty() ? self_executable() : spec.executable;
  if (!spec.argv.empty()) {
    opts.args = spec.argv;
  } else {
    opts.args = {"isorun-worker"};
    if (!spec.label.empty()) opts.args.push_back(spec.label);
  }
  opts.env = inherited_environment();
  if (spec.warm) {
    // The device is known ahead: the worker sees it from exec on and prepares it while it waits.
    const gpu_info gpu{.index = spec.warm->index, .uuid = spec.warm->uuid, .simulated = spec.warm->simulated};
    for (auto& e : assignment_environment({gpu}, spec.warm->mem_limit)) opts.env.push_back(std::move(e));
    opts.env.push_back(std::string(ser::env::warm) + "=" + ser::to_env(*spec.warm));
  } else {
    // No GPU until the assignment says which: CUDA initialised before it would see none.
    opts.env.push_back(std::string(ser::env::visible_devices) + "=");
  }
  // An extra variable replaces an inherited one of the same name: with both in the environment,
  // getenv (and the dynamic loader, for LD_PRELOAD) would find the inherited one first.
  for (const auto& extra : spec.extra_env) {
    const auto eq = extra.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    const std::string key = extra.substr(0, eq + 1);  // "KEY="
    std::erase_if(opts.env, [&](const std::string& e) { return e.compare(0, key.size(), key) == 0; });
  }
  opts.env.insert(opts.env.end(), spec.extra_env.begin(), spec.extra_env.end());
  opts.env.push_back(std::string(ser::env::worker) + "=1");
  opts.fds = {{0, ends.stdin_null.get()},
              {1, ends.stdout_fd},
              {2, ends.stderr_write.get()},
              {ser::control_fd, ends.control.get()}};
  opts.cgroup = new_child_cgroup();
  opts.cgroup_namespace = !spec.zygote;
  w.started = std::chrono::steady_clock::now();
  try {
    w.process = spawn(opts);
  } catch (const spawn_error& e) {
    throw internal_error(std::string("cannot start worker: ") + e.what());
  }
  return w;
}

}  // namespace isorun::runner
