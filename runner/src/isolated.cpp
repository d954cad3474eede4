#include "isorun/runner/isolated.hpp"

#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "isorun/alloc/config.hpp"
#include "isorun/runner/admission.hpp"
#include "isorun/runner/placement.hpp"
#include "isorun/runner/standby.hpp"
#include "isorun/runner/units.hpp"
#include "isorun/worker/init.hpp"

namespace isorun {

const runner::gpu_inventory& gpus() {
  static const runner::gpu_inventory inventory = runner::gpu_inventory::detect();
  return inventory;
}

namespace detail {

std::shared_ptr<runner::queued_job> submit_isolated(const void* fn, blob args, const isolated_options& opts,
                                                    runner::admission* executor) {
  if (is_worker_process()) {
    std::fprintf(stderr,
                 "isorun: this worker process never called isorun::init(argc, argv); call it first thing in "
                 "main so the program can serve as its own worker\n");
    std::_Exit(70);
  }
  const worker::task_info* task = worker::registry::instance().find_function(fn);
  if (!task)
    throw usage_error("isolated(): this function is not a registered task; add ISORUN_TASK(fn) at namespace scope");

  runner::admission& process = runner::admission::process();
  runner::admission& first = executor ? *executor : process;
  isolated_options o = opts;
  runner::admission_request request = runner::admission_request_at(first, executor != nullptr, o);
  // Checked now, on the GPUs it asks for (isolated() defaults to the CPU): a call that cannot work
  // is refused before it waits; admission then says which GPUs it gets.
  auto spec = std::make_shared<runner::job_spec>(
      runner::job_spec_for(task->name, serialization::encoding::binary, blob(),
                           runner::place_job(gpus(), runner::gpu_request_for(o), false, o.mem_limit), o));
  spec->result_stream = task->result_type == "isorun::blob";
  runner::check_job_spec(*spec);
  return runner::queue_call(first, executor ? &process : nullptr, std::move(request), std::move(spec), std::move(args),
                            {.standby = o.standby});
}

}  // namespace detail

void stop_standby() { runner::stop_standby(); }

}  // namespace isorun
