#include "isorun/runner/executor.hpp"

#include <algorithm>
#include <atomic>

#include "isorun/runner/errors.hpp"
#include "isorun/runner/placement.hpp"

namespace isorun {

struct executor::state {
  executor_options options;
  std::shared_ptr<runner::admission> admission;  // its calls' queue, and what they hold
  std::string plan;
  std::atomic<bool> shut{false};
};

namespace detail {
// The executor's admission: its slots as runner::plan_slots decides them (the one place caps are
// packed per GPU), as limits: per GPU the most slots a GPU got, with the caps' memory deciding the
// rest.
std::shared_ptr<runner::admission> executor_admission(const executor_options& o, std::string& plan) {
  if (o.call.gpu || !o.call.gpus.empty() || o.call.gpu_count || o.call.mem_limit)
    throw usage_error(
        "an executor places its calls itself: give gpus, all_gpus, mem_limit, per_gpu or cpu_slots to "
        "the executor, not gpu, gpus, gpu_count or mem_limit in its call options");
  if (o.per_gpu < 0 || o.cpu_slots < 0) throw usage_error("per_gpu and cpu_slots cannot be negative");
  const auto slots = runner::plan_slots({.gpus = o.gpus,
                                         .all_gpus = o.all_gpus,
                                         .mem_limit = o.mem_limit,
                                         .per_gpu = o.per_gpu,
                                         .cpu_slots = o.cpu_slots},
                                        gpus());
  plan = slots.how;
  runner::admission::limits l{.cpu_slots = 0, .name = "the executor"};
  std::vector<std::size_t> per;
  for (const auto& s : slots.slots) {
    if (s.gpus.empty()) {
      ++l.cpu_slots;
      continue;
    }
    const auto& g = s.gpus.front();
    auto at = std::find_if(l.gpus.begin(), l.gpus.end(), [&](const runner::gpu_info& x) { return x.index == g.index; });
    if (at == l.gpus.end()) {
      l.gpus.push_back(g);
      per.push_back(0);
      at = l.gpus.end() - 1;
    }
    ++per[static_cast<std::size_t>(at - l.gpus.begin())];
    ++l.gpu_slots;
  }
  if (!l.gpus.empty()) l.per_gpu = *std::max_element(per.begin(), per.end());
  const std::size_t cpu_slots = l.cpu_slots;
  auto a = std::make_shared<runner::admission>(std::move(l));
  // CPU slots given beyond the cores are the executor's behind it too, while it lives.
  if (o.cpu_slots > 0) a->keep(runner::admission::process().widen_cpu_slots(cpu_slots));
  return a;
}
}  // namespace detail

executor::executor(executor_options options) : state_{std::make_shared<state>()} {
  state_->admission = detail::executor_admission(options, state_->plan);
  state_->options = std::move(options);
  state_->options.call.mem_limit = state_->options.mem_limit;
}

executor::~executor() {
  shutdown(true);
  state_->admission->wait_idle();  // the running calls' workers are gone
}

std::shared_ptr<runner::queued_job> executor::queue(const void* fn, blob args) {
  if (state_->shut) throw usage_error("this executor was shut down: it takes no more calls");
  return detail::submit_isolated(fn, std::move(args), state_->options.call, state_->admission.get());
}

void executor::shutdown(bool cancel_waiting) {
  state_->shut = true;
  if (cancel_waiting) state_->admission->cancel_waiting();  // one that started meanwhile runs on
}

std::size_t executor::waiting() const { return state_->admission->waiting(); }
std::size_t executor::running() const { return state_->admission->running(); }
const std::string& executor::plan() const noexcept { return state_->plan; }

std::size_t executor::window() const noexcept {
  const auto& l = state_->admission->shares();
  return std::max<std::size_t>(8, 4 * (l.cpu_slots + l.gpu_slots));
}

}  // namespace isorun
