#include "run_command.hpp"

#include <atomic>
#include <cstdio>
#include <memory>

#include "gpu_choice.hpp"
#include "interrupt.hpp"
#include "isorun/runner/command.hpp"
#include "isorun/runner/printable.hpp"
#include "isorun/runner/units.hpp"

namespace isorun::cli {
namespace {

std::atomic<runner::command*> running{nullptr};  // what interrupt_scope stops

}  // namespace

int run_command(const cli_options& o) {
  auto gpus = pick_gpus(o);
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
                                     .enforce_cap = !o.mem_limit_advisory,
                                     .timeout = o.timeout,
                                     .grace = o.grace});
  running = cmd.get();
  stop.hand_to([](int sig) noexcept { running.load()->cancel(sig); });
  const runner::command_result& r = cmd->wait();

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
  if (!o.quiet && r.program->signal) std::fprintf(stderr, "isorun: command %s\n", runner::describe(*r.program).c_str());
  return r.program->shell_code();
}

}  // namespace isorun::cli
