#pragma once
/// @file request.hpp
/// What the supervisor asks a worker to do. Written into the request segment, whose descriptor
/// reaches the worker with its assignment; the worker validates it like any other untrusted input.

#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "isorun/serialization/blob.hpp"
#include "isorun/serialization/control.hpp"

namespace isorun::serialization {

/// One GPU of an assignment.
struct request_gpu {
  std::int32_t index = 0;  ///< physical (NVML) index
  std::string uuid;
  std::uint64_t memory = 0;  ///< total device memory, bytes
  bool simulated = false;    ///< a simulated GPU (ISORUN_SIMULATE_GPUS)

  template <class Archive>
  void serialize(Archive& ar) {
    ar(index, uuid, memory, simulated);
  }
};

struct request {
  std::uint32_t protocol = protocol_version;
  std::string task;                         ///< registered task name
  std::uint32_t encoding = 1;               ///< serialization::encoding of args and result
  std::vector<std::string> task_libraries;  ///< shared objects to dlopen before lookup
  std::uint64_t mem_limit = 0;              ///< bytes per device; 0 = no cap
  std::vector<request_gpu> gpus;            ///< in CUDA ordinal order; empty = CPU only
  std::string alloc_conf;                   ///< ISORUN_ALLOC_CONF-style configuration
  std::uint64_t max_result = 0;             ///< largest result the supervisor accepts
  /// The supervisor may hand the result over before this process exits: release what the task
  /// held and unmap the result before reporting done, so the supervisor can seal it.
  bool early_result = false;
  /// A CPU task's result small enough to travel in `done` is handed over at once, as with
  /// early_result (this process then waits for let_go); a larger one waits for the exit, its
  /// segment left unsealed for the supervisor to pool.
  bool early_small_result = false;
  /// The size of this task's last result in this supervisor (0: none yet): a CPU worker maps
  /// that much of its result segment ahead, while the task runs, when it is large.
  std::uint64_t expected_result = 0;
  blob args;  ///< encoded arguments

  template <class Archive>
  void serialize(Archive& ar) {
    ar(protocol, task, encoding, task_libraries, mem_limit, gpus, alloc_conf, max_result, early_result,
       early_small_result, expected_result, args);
  }
};

}  // namespace isorun::serialization
