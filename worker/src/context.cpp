#include "isorun/this_worker.hpp"

namespace isorun {

void worker_context::assign(int device, std::string uuid, std::uint64_t device_memory, std::uint64_t mem_limit,
                            std::string task, std::string alloc_conf) {
  in_worker_ = true;
  device_ = device;
  device_uuid_ = std::move(uuid);
  device_memory_ = device_memory;
  mem_limit_ = mem_limit;
  task_ = std::move(task);
  alloc_conf_ = std::move(alloc_conf);
}

worker_context& this_worker() noexcept {
  static worker_context context;
  return context;
}

}  // namespace isorun
