#include "isorun/runner/isolated.hpp"

#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "isorun/alloc/config.hpp"
#include "isorun/worker/init.hpp"
#include "isorun/runner/placement.hpp"
#include "isorun/runner/standby.hpp"
#include "isorun/runner/units.hpp"

namespace isorun {

const runner::gpu_inventory& gpus() {
  static const runner::gpu_inventory inventory = runner::gpu_inventory::detect();
  return inventory;
}

namespace detail {

std::shared_ptr<runner::job> start_isolated(const void* fn, blob args, const isolated_options& opts) {
  if (is_worker_process()) {
    std::fprintf(stderr,
                 "isorun: this worker process never called isorun::init(argc, argv); call it first thing in "
                 "main so the program can serve as its own worker\n");
    std::_Exit(70);
  }
  const worker::task_info* task = worker::registry::instance().find_function(fn);
  if (!task) throw usage_error("isolated(): this function is not a registered task; add ISORUN_TASK(fn) at namespace scope");

  // isolated() defaults to the CPU
  auto placed = runner::place_job(gpus(), runner::gpu_request_for(opts), false, opts.mem_limit);
  auto spec = runner::job_spec_for(task->name, serialization::encoding::binary, std::move(args), std::move(placed), opts);
  spec.result_stream = task->result_type == "isorun::blob";
  if (!opts.standby) return runner::job::start(std::move(spec));
  auto& pool = runner::standby_for(runner::launch_spec_for(spec), opts.standby);
  return runner::job::start(std::move(spec), pool);
}

}  // namespace detail

void stop_standby() { runner::stop_standby(); }

}  // namespace isorun
