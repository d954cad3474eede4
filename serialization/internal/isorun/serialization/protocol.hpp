#pragma once
/// @file protocol.hpp
/// The worker protocol in one place: how a worker is recognised, which descriptor it talks on,
/// which environment variables carry its assignment, and the order of the messages.
///
///   supervisor                                     worker (exec'd; fd 3 is its only channel)
///     launch: spawn with ISORUN_WORKER=1, fd 3 = control socket, no GPU visible
///     assign_message {env, request?, cpus?} + SCM_RIGHTS [request segment?, result segment,
///                                        stdout?, result ring + its start eventfd?]  -->
///                                         restores its CPU affinity (cpu_handoff.hpp),
///                                         applies env (CUDA_VISIBLE_DEVICES, ...) and stdout,
///                                         maps request, runs the task, writes its result: a
///                                         small one into `done` itself, a larger one into the
///                                         result segment (a result made on a device may stream
///                                         through the ring first: result_stream.hpp; its
///                                         header then says so)
///                          <--  done_message {pid, visible devices as it sees them, status,
///                                             peaks, timings, the small result}
///                                         exits; the supervisor classifies the end
///     (early_result: the result handed over)
///     let_go (one byte)  -->              exits (it waits for this, a second at most)
///
/// Launching and assigning are separate steps, so a worker can be started before its work is
/// known (standby workers) or somewhere the supervisor does not spawn directly; everything a
/// worker needs that is not in its environment at exec arrives with the assignment.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "isorun/internal_api.hpp"

namespace isorun::serialization {

/// Bumped whenever a message, the request or the result ring's control page changes shape.
inline constexpr std::uint32_t protocol_version = 12;

/// The descriptor a worker (and the `-- CMD` shim) finds its control socket under.
inline constexpr int control_fd = 3;

/// Sent by the supervisor once it has handed an early result over, to a worker that waits for it
/// before it exits. Unix socket wake-ups are synchronous (the woken thread goes to the waker's CPU,
/// which is expected to sleep): a worker going on into its exit right after `done` kept the
/// supervisor's thread waiting behind the teardown on that CPU (milliseconds for an interpreter)
/// while another CPU idled. Waiting, it sleeps as the hint says; it goes once the caller has its
/// result. (A second at most: a supervisor that never says so does not keep it.)
inline constexpr std::byte let_go{1};
inline constexpr int let_go_wait_ms = 1000;

/// Environment variables of the protocol. Set by the supervisor; the first is removed by
/// the process they start, so a task's own children are ordinary processes.
namespace env {
inline constexpr std::string_view worker = "ISORUN_WORKER";        ///< "1": run as a worker
inline constexpr std::string_view gpu = "ISORUN_GPU";              ///< assigned GPUs' indices ("0,1"), "" for none
inline constexpr std::string_view mem_limit = "ISORUN_MEM_LIMIT";  ///< the cap per device in bytes, "0" for none
inline constexpr std::string_view visible_devices = "CUDA_VISIBLE_DEVICES";  ///< the assigned GPUs' UUIDs
inline constexpr std::string_view device_order = "CUDA_DEVICE_ORDER";        ///< always PCI_BUS_ID
inline constexpr std::string_view warm = "ISORUN_WARM";  ///< a warm_device: prepare it before the assignment
/// `-- CMD` under --mem-limit: the cap's ledger ("/proc/PID/fd/N") the preloaded library charges.
inline constexpr std::string_view cap_region = "ISORUN_CAP_REGION";
/// `-- CMD` under --mem-limit: the cap's sealed terms ("/proc/PID/fd/N"): the limit.
inline constexpr std::string_view cap_terms = "ISORUN_CAP_TERMS";
/// `-- CMD` under --mem-limit: the library the shim preloads into the command (only into it).
inline constexpr std::string_view cap_preload = "ISORUN_CAP_PRELOAD";
/// A worker whose cap region comes with its call (a Python interpreter launched ahead): the cap
/// in bytes per device, which what it allocates before the call stays within; bound to the
/// call's region once that comes.
inline constexpr std::string_view cap_deferred = "ISORUN_CAP_DEFERRED";
/// "1": a zygote (a Python interpreter that forks each worker): the preloaded cap library refuses
/// every CUDA call until a forked child thaws it (isorun_cap_thaw), so the zygote never has
/// driver state for its children to inherit.
inline constexpr std::string_view cap_zygote = "ISORUN_CAP_ZYGOTE";
/// A file the worker writes its task's memory timeline to (its allocators' history and, after an
/// out-of-memory failure, what was live): for `isorun report` and --memory-timeline.
inline constexpr std::string_view memory_timeline = "ISORUN_MEMORY_TIMELINE";
/// "1": isorun set LD_BIND_NOW for this worker's start (one launched ahead, which binds its
/// symbols while it waits); the worker removes both, so that its task's children do not bind so.
inline constexpr std::string_view bind_now = "ISORUN_BIND_NOW";
/// Every variable above: removed from the environment a worker inherits, set only by isorun.
inline constexpr std::string_view all[] = {
    worker,    gpu,         mem_limit,    visible_devices, device_order,    warm,    cap_region,
    cap_terms, cap_preload, cap_deferred, cap_zygote,      memory_timeline, bind_now};
}  // namespace env

/// The device a *warm* worker prepares while it waits for its assignment: it creates its CUDA
/// context and capped allocator at launch (CUDA_VISIBLE_DEVICES is then set at exec), so its
/// task starts at once. Its assignment must be for exactly this device, cap and configuration.
struct warm_device {
  int index = 0;                    ///< physical GPU index
  bool simulated = false;           ///< a simulated GPU (ISORUN_SIMULATE_GPUS)
  std::uint64_t device_memory = 0;  ///< the GPU's total memory, bytes
  std::uint64_t mem_limit = 0;      ///< the cap, bytes; 0 = none
  std::string uuid;
  std::string alloc_conf;

  friend bool operator==(const warm_device&, const warm_device&) = default;
};

/// @brief `d` as the value of env::warm ("INDEX;sim|cuda;MEMORY;LIMIT;UUID;ALLOC_CONF").
std::string to_env(const warm_device& d);

/// @brief The warm_device in an env::warm value; nullopt if it is malformed.
ISORUN_INTERNAL_API std::optional<warm_device> parse_warm_device(std::string_view value);

/// @brief Starts a thread that, when the supervisor's end of `control` hangs up (it exited, even
///        by SIGKILL), kills this process's whole group and exits 137: nothing a worker or the
///        shim started outlives its supervisor. Clears PR_SET_PDEATHSIG first, which would race
///        the thread and leave grandchildren behind.
void exit_with_supervisor(int control);

}  // namespace isorun::serialization
