#include "run_command.hpp"

#include <atomic>
#include <cstdio>
#include <memory>

#include <nlohmann/json.hpp>
#include "gpu_choice.hpp"
#include "interrupt.hpp"
#include "memory_timeline.hpp"

#include "isorun/runner/command.hpp"
#include "isorun/runner/errors.hpp"
#include "isorun/runner/printable.hpp"
#include "isorun/runner/units.hpp"

namespace isorun::cli {
namespace {

std::atomic<runner::command*> running{nullptr};  // what interrupt_scope stops

// The changes of what the command holds that its memory timeline keeps: the last quarter of a
// million (8 MiB of the ledger's file at most, touched only as far as used).
constexpr std::size_t memory_events = 1 << 18;

}  // namespace

int run_command(const cli_options& o) {
  auto gpus = pick_gpus(o);
  // (As Python's isolated() refuses mem_limit without a GPU: a cap on nothing is not a cap.)
  if (o.mem_limit && !o.mem_limit_advisory && gpus.empty())
    throw usage_error("--mem-limit caps the GPU memory of -- CMD, and it runs with no GPU (" +
                      std::string(o.cpu ? "--cpu" : "this machine has none") +
                      "): nothing would be capped. Give it a GPU (--gpu N), or cap its host memory with "
                      "--host-mem-limit SIZE");
  if (!o.memory_timeline.empty()) {
    if (gpus.empty())
      throw usage_error("--memory-timeline with -- CMD draws what the cap sees on the command's GPUs: give it --gpu N");
    check_timeline_page(o.memory_timeline);
  }
  if (o.mem_limit && o.mem_limit_advisory && !o.quiet)
    std::fprintf(stderr, "isorun: note: --mem-limit %s is advisory: exported as ISORUN_MEM_LIMIT, not enforced\n",
                 format_size(o.mem_limit).c_str());
  // The command is stopped the way its own terminal would stop it: with the signal isorun got
  // (command::cancel escalates). It prints its own words, if any: no notice.
  std::unique_ptr<runner::command> cmd;  // outlives the scope that may stop it
  interrupt_scope stop;
  cmd = runner::command::start({.argv = o.command,
                                .gpus = std::move(gpus),
                                .mem_limit = o.mem_limit,
                                .host_mem_limit = o.host_mem_limit,
                                .enforce_cap = !o.mem_limit_advisory,
                                .timeout = o.timeout,
                                .grace = o.grace,
                                .memory_events = o.memory_timeline.empty() ? 0u : memory_events});
  running = cmd.get();
  stop.hand_to([](int sig) noexcept { running.load()->cancel(sig); });
  const runner::command_result& r = cmd->wait();
  if (!r.memory_timeline.empty()) {
    std::string program = o.command.front();
    if (const auto slash = program.rfind('/'); slash != std::string::npos) program = program.substr(slash + 1);
    write_timeline_page(o.memory_timeline, nlohmann::json::parse(r.memory_timeline),
                        program + " on " + r.status.device + ": " + std::string(to_string(r.status.kind)), o.quiet);
  }

  if (!o.quiet && !r.cap_report.empty()) std::fprintf(stderr, "isorun: %s\n", printable(r.cap_report).c_str());
  if (r.status.kind == outcome_kind::timeout) {
    std::fprintf(stderr, "isorun: command %s\n", printable(r.status.message).c_str());
    return 124;
  }
  if (!r.program) {  // stopped before the shim could say how the command ended
    if (r.stopped_by) return 128 + r.stopped_by;
    std::fprintf(stderr, "isorun: %s\n", printable(r.status.message).c_str());  // (it may quote the command's stderr)
    return r.status.exit.shell_code();
  }
  // Killed by its cgroup's OOM killer past --host-mem-limit: said, with the program's own status.
  if (r.status.error_type == "host_memory") std::fprintf(stderr, "isorun: %s\n", printable(r.status.message).c_str());
  else if (!o.quiet && r.program->signal)
    std::fprintf(stderr, "isorun: command %s\n", runner::describe(*r.program).c_str());
  return r.program->shell_code();
}

}  // namespace isorun::cli
