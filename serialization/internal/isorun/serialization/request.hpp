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


struct request {
  std::uint32_t protocol = protocol_version;
  std::string task;                          ///< registered task name
  std::uint32_t encoding = 1;                ///< serialization::encoding of args and result
  std::vector<std::string> task_libraries;   ///< shared objects to dlopen before lookup
  std::uint64_t mem_limit = 0;               ///< bytes; 0 = no cap
  std::int32_t gpu_index = -1;               ///< physical index; -1 = CPU only
  std::string gpu_uuid;
  std::uint64_t gpu_memory = 0;              ///< total device memory, bytes
  bool gpu_simulated = false;                ///< a simulated GPU (ISORUN_SIMULATE_GPUS)
  std::string alloc_conf;                    ///< ISORUN_ALLOC_CONF-style configuration
  std::uint64_t max_result = 0;              ///< largest result the supervisor accepts
  /// The supervisor may hand the result over before this process exits: release what the task
  /// held and unmap the result before reporting done, so the supervisor can seal it.
  bool early_result = false;
  blob args;                                 ///< encoded arguments

  template <class Archive>
  void serialize(Archive& ar) {
    ar(protocol, task, encoding, task_libraries, mem_limit, gpu_index, gpu_uuid, gpu_memory, gpu_simulated, alloc_conf, max_result,
       early_result, args);
  }
};

}  // namespace isorun::serialization
