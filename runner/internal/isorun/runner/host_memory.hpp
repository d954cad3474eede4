#pragma once
/// @file host_memory.hpp
/// The host memory cap of one worker (isolated_options::host_mem_limit): the memory controller
/// of the worker's own cgroup v2 (`memory.max`, and `memory.swap.max` 0 so that it cannot page
/// out past the cap), or, where the memory controller is on a cgroup v1 hierarchy instead (a
/// hybrid layout, as many container hosts have), a v1 memory cgroup of the worker's own
/// (`memory.limit_in_bytes`, and `memory.memsw.limit_in_bytes` the same). The kernel enforces
/// it: past the cap the worker's processes are reclaimed, then killed by the cgroup's OOM
/// killer, and the call ends out of memory. The caller and every other worker live on.

#include <cstdint>
#include <optional>
#include <string>

#include "isorun/internal_api.hpp"
#include "isorun/runner/outcome.hpp"
#include "isorun/runner/process.hpp"

namespace isorun::runner {

class ISORUN_INTERNAL_API host_memory_cap {
 public:
  /// @brief "" where a cap can be applied to workers here; else why not (for the message that
  ///        refuses the option).
  static std::string unavailable();

  /// @brief Caps `worker` (already started, in its cgroup) at `limit` bytes, before its task is
  ///        assigned. @throws internal_error if the cgroup files cannot be written.
  host_memory_cap(const child& worker, std::uint64_t limit);
  /// @brief Caps a child about to be started in the cgroup v2 `cgroup` (made, still empty):
  ///        spawn it with spawn_options::join_cgroup_procs = join_fd(), then call started().
  struct before_start_t {};
  host_memory_cap(const std::string& cgroup, std::uint64_t limit, before_start_t);
  /// @brief The descriptor the child writes itself into (a v1 memory cgroup's cgroup.procs), or -1.
  [[nodiscard]] int join_fd() const noexcept { return join_; }
  /// @brief The child is started: the descriptor is closed.
  void started() noexcept;
  ~host_memory_cap();  // removes the v1 cgroup (the worker's v2 cgroup goes with its reap)
  host_memory_cap(const host_memory_cap&) = delete;
  host_memory_cap& operator=(const host_memory_cap&) = delete;

  struct reading {
    std::optional<std::uint64_t> peak;  ///< the cgroup's peak, bytes
    std::uint64_t oom_kills = 0;        ///< processes its OOM killer killed
  };
  /// @brief What the cgroup saw; read once the worker has exited, before it is reaped.
  [[nodiscard]] reading read() const;

  [[nodiscard]] std::uint64_t limit() const noexcept { return limit_; }

  /// @brief An outcome that failed after the cgroup's OOM killer killed a process of `who` (the
  ///        worker, the command) becomes out_of_memory (error type "host_memory"), saying so.
  static void classify(outcome& o, const reading& r, std::uint64_t limit, const std::string& who);

 private:
  std::uint64_t limit_;
  std::string v2_;  // the worker's cgroup v2, with the memory controller
  std::string v1_;  // or its v1 memory cgroup
  int join_ = -1;   // v1_'s cgroup.procs, until the child is started

  bool cap_v2(const std::string& cgroup);  // where the v2 memory controller is on
  void make_v1();                          // the v1 cgroup, with its limits
};

}  // namespace isorun::runner
