#pragma once
/// @file containment.hpp
/// What holds the processes isorun starts, so that every one of them can be killed when a
/// worker or command ends. A process group is always there, but a descendant that calls
/// setsid() leaves it. Where a cgroup v2 directory is writable, each child also gets a cgroup of
/// its own (born in it with clone3, or moved there between fork and exec on kernels before 5.7,
/// so nothing of it runs outside), and its end kills the
/// whole cgroup (`cgroup.kill`) before anything it produced is looked at: an escaped descendant
/// can then neither outlive it nor change its result after validation. Where this process may
/// (CAP_SYS_ADMIN), each child is born in a cgroup namespace rooted at its cgroup, so its tree
/// cannot move out (with nsdelegate); elsewhere a process that means to can move itself into this
/// process's cgroup, which is why the exit kills whatever is in it. This guards against
/// accidents, not against a task written to escape.

#include <cstdint>
#include <optional>
#include <string>

#include "isorun/internal_api.hpp"

namespace isorun::runner {

/// How children are contained here.
struct containment_info {
  bool cgroup = false;       ///< true: a cgroup v2 per child; false: the process group alone
  std::string where;         ///< the directory the children's cgroups are made in ("" without)
  std::string why_not;       ///< why there is no cgroup ("" with one)
  bool memory_peak = false;  ///< the cgroups report memory.peak (the memory controller is on)
};

/// @brief How children are contained: a cgroup v2 subtree under this process's own cgroup when
///        it can be made and joined (detected once per process), else the process group alone.
///        ISORUN_CONTAINMENT=process-group (read at each call) chooses the process group alone.
ISORUN_INTERNAL_API const containment_info& containment();

/// @brief What is wrong with ISORUN_CONTAINMENT, or "" if it is unset or valid (the CLI refuses
///        to start with a bad value; a program using the library gets the process group).
ISORUN_INTERNAL_API std::string containment_setting_error();

/// @brief A new, empty cgroup for one child, or "" where children are contained by their
///        process group alone (or this one cannot be made).
ISORUN_INTERNAL_API std::string new_child_cgroup();

/// @brief Kills every process in `cgroup`, waits (up to 10 s, for a process in uninterruptible
///        sleep such as a CUDA teardown) until it is empty, then removes it. A cgroup that does
///        not empty in time is left for the next isorun to remove.
/// @return its memory.peak in bytes, read before the kill, where the cgroup reports one.
ISORUN_INTERNAL_API std::optional<std::uint64_t> kill_and_remove_cgroup(const std::string& cgroup) noexcept;

}  // namespace isorun::runner
