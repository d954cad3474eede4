#pragma once
/// @file zygote.hpp
/// A zygote: one exec'd worker program (a Python interpreter that has imported its preloads and
/// never initialized CUDA) that forks each worker instead of each being exec'd. Each child is
/// made the supervisor's own (CLONE_PARENT): the supervisor holds its pidfd, reaps it, signals
/// its process group; it is born in a cgroup of its own (CLONE_INTO_CGROUP, with the supervisor's
/// directory descriptor), in a cgroup namespace where workers get one, with its parent-death
/// signal, and then waits for its assignment on its own control socket like any launched worker.
///
/// The zygote's side (the fork) lives in the program that is the zygote (python/src/zygote.cpp);
/// this header is the wire between the two, and the supervisor's side.

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

#include "isorun/internal_api.hpp"
#include "isorun/runner/launcher.hpp"

namespace isorun::runner {

namespace zygote_wire {
/// Set in the zygote's environment at exec: "1" makes the worker program a zygote.
inline constexpr const char* zygote_env = "ISORUN_PY_ZYGOTE";
/// Set in the zygote's environment where the zygote's LD_PRELOAD differs from its children's
/// (the cap library added only to refuse CUDA in the zygote): the children's value, "-" for none.
inline constexpr const char* child_preload_env = "ISORUN_ZYGOTE_LD_PRELOAD";

inline constexpr std::uint32_t magic = 0x3147'595aU;  // "ZYG1"
inline constexpr std::uint32_t with_cgroup = 1;       // the last descriptor is the cgroup's directory
inline constexpr std::uint32_t with_namespace = 2;    // born in a cgroup namespace rooted there
/// Descriptors of a request: the child's 0, 1, 2 and 3 (its control socket), then the cgroup's.
inline constexpr int child_fds = 4;

/// Supervisor -> zygote: fork one worker.
struct request {
  std::uint32_t magic = zygote_wire::magic;
  std::uint32_t flags = 0;
};

/// Zygote -> supervisor: the child's pid (its pidfd with SCM_RIGHTS), or why there is none. The
/// zygote's first message, once its preloads are imported and before any request, has pid 0:
/// it is ready.
struct reply {
  std::int32_t pid = -1;
  std::int32_t error = 0;    ///< errno of the fork, or one of the codes below
  std::int32_t threads = 0;  ///< the zygote's threads, when it refused for them
};
/// The zygote runs more than one thread (a preload started some): it refuses to fork.
inline constexpr std::int32_t error_threads = -1;
}  // namespace zygote_wire

/// Starts workers by forking them from one zygote, launched by the calling thread from `spec`
/// (its children's parent-death signal follows that thread, as its own does). Where the zygote
/// cannot fork (it exited, a preload started threads, the kernel lacks clone3), it says why once
/// on stderr and launches exec'd workers instead: the same isolation, at an exec's cost.
class ISORUN_INTERNAL_API zygote_launcher final : public launcher {
 public:
  /// @brief Launches the zygote (one that cannot be launched: exec'd workers, said on stderr).
  explicit zygote_launcher(const launch_spec& spec);
  ~zygote_launcher() override;
  zygote_launcher(const zygote_launcher&) = delete;
  zygote_launcher& operator=(const zygote_launcher&) = delete;

  /// @brief A worker forked from the zygote once it is ready; before that (its preloads still
  ///        importing, or stuck in an import) and where it cannot fork, an exec'd one: nothing
  ///        waits for the zygote's imports, so a call's timeout and cancellation hold as for any
  ///        worker.
  launched_worker launch(const launch_spec& spec) override;

  /// @brief Waits until the zygote is ready (its first message: its preloads are imported),
  ///        however long that takes, or until interrupt(). One thread only (a pool's filler).
  /// @return true once ready; false if interrupted, or if the zygote failed (said on stderr).
  bool wait_ready();

  /// @brief Ends a wait_ready() (the pool is stopping).
  void interrupt() noexcept;

  /// @brief The zygote's pid (for tests); -1 once it is gone.
  [[nodiscard]] pid_t zygote_pid() const;
  /// @brief Whether workers are still forked (false once it fell back to exec).
  [[nodiscard]] bool forking() const;

 private:
  launched_worker fork_one(const launch_spec& spec);
  void forward_stderr() noexcept;
  void give_up(const std::string& why) noexcept;

  local_launcher exec_;
  mutable std::mutex mutex_;
  std::optional<launched_worker> zygote_;
  unique_fd interrupted_;  // an eventfd: interrupt() was called
  bool ready_ = false;
  bool broken_ = false;
};

/// @brief The environment a zygote is launched with, beside `spec`'s: the worker program made a
///        zygote, and the cap library (refusing CUDA until a child thaws it) preloaded into it.
ISORUN_INTERNAL_API launch_spec zygote_spec(const launch_spec& spec);

}  // namespace isorun::runner
