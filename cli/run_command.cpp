#include "run_command.hpp"

#include <signal.h>

#include <atomic>
#include <cstdio>

#include "isorun/runner/command.hpp"
#include "isorun/runner/printable.hpp"
#include "isorun/runner/units.hpp"

namespace isorun::cli {
namespace {

std::atomic<runner::command*> running{nullptr};

// Ctrl-C, SIGTERM, SIGHUP and SIGQUIT stop the command the way its own terminal would: with
// that signal first (command::cancel describes the escalation). Async-signal-safe.
void forward(int sig) {
  if (auto* c = running.load()) c->cancel(sig);
}

}  // namespace

int run_command(const cli_options& o, const std::vector<runner::gpu_info>& gpus) {
  if (o.mem_limit && o.mem_limit_advisory && !o.quiet)
    std::fprintf(stderr, "isorun: note: --mem-limit %s is advisory: exported as ISORUN_MEM_LIMIT, not enforced\n",
                 format_size(o.mem_limit).c_str());
  auto cmd = runner::command::start({.argv = o.command,
                                     .gpus = gpus,
                                     .mem_limit = o.mem_limit,
                                     .enforce_cap = !o.mem_limit_advisory,
                                     .timeout = o.timeout,
                                     .grace = o.grace});
  running = cmd.get();
  struct sigaction sa {};
  sa.sa_handler = forward;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) ::sigaction(sig, &sa, nullptr);
  const runner::command_result& r = cmd->wait();
  sa.sa_handler = SIG_DFL;
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) ::sigaction(sig, &sa, nullptr);
  running = nullptr;

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
