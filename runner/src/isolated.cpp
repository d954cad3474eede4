#include "isorun/runner/isolated.hpp"

#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "isorun/alloc/config.hpp"
#include "isorun/worker/init.hpp"
#include "isorun/runner/placement.hpp"
#include "isorun/runner/units.hpp"

namespace isorun {

const runner::gpu_inventory& gpus() {
  static const runner::gpu_inventory inventory = runner::gpu_inventory::detect();
  return inventory;
}

namespace detail {

std::shared_ptr<runner::job> start_isolated(const void* fn, blob args, const options& opts) {
  if (is_worker_process()) {
    std::fprintf(stderr,
                 "isorun: this worker process never called isorun::init(argc, argv); call it first thing in "
                 "main so the program can serve as its own worker\n");
    std::_Exit(70);
  }
  const worker::task_info* task = worker::registry::instance().find_function(fn);
  if (!task) throw usage_error("isolated(): this function is not a registered task; add ISORUN_TASK(fn) at namespace scope");

  runner::job_spec spec;
  spec.task = task->name;
  spec.encoding = serialization::encoding::binary;
  spec.args = std::move(args);
  spec.gpu = runner::place_job(gpus(), opts.gpu, false, opts.mem_limit);  // isolated() defaults to the CPU
  spec.mem_limit = opts.mem_limit;
  spec.timeout = opts.timeout;
  spec.grace = opts.grace;
  spec.alloc_conf = opts.alloc_conf;
  spec.extra_env = opts.env;
  spec.stderr_echo_fd = opts.echo_stderr ? 2 : -1;
  spec.max_result = opts.max_result;
  return runner::job::start(std::move(spec));
}

}  // namespace detail
}  // namespace isorun
