// isorun: the command-line supervisor; main() parses the command line (options.hpp) and hands
// it to the command it names. The same executable is also its own worker (re-executed with
// ISORUN_WORKER=1) and the -- CMD shim (ISORUN_SHIM=1): isorun::init() takes those over.
#include <sys/prctl.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "gpus_command.hpp"
#include "isorun/runner/containment.hpp"
#include "isorun/runner/errors.hpp"
#include "isorun/runner/printable.hpp"
#include "isorun/runner/units.hpp"
#include "isorun/worker/init.hpp"
#include "options.hpp"
#include "report_command.hpp"
#include "run_command.hpp"
#include "run_task.hpp"
#include "sweep_command.hpp"
#include "task_libraries.hpp"
#include "tasks_command.hpp"
#include "version.hpp"

namespace {
using namespace isorun;

int dispatch(int argc, char** argv) {
  const cli::cli_options o = cli::parse_command_line(argc, argv);
  if (const std::string bad = runner::containment_setting_error(); !bad.empty()) throw usage_error(bad);
  switch (o.what) {
    case cli::mode::help: std::cout << cli::help_text(o.help_of); return 0;
    case cli::mode::nothing: std::fputs(cli::help_text(cli::mode::run_task).c_str(), stderr); return 2;
    case cli::mode::version: std::cout << "isorun " << cli::version << "\n"; return 0;
    case cli::mode::list_gpus: return cli::list_gpus(o);
    case cli::mode::status: return cli::show_status(o);
    case cli::mode::report: return cli::write_report(o);
    case cli::mode::run_command: return cli::run_command(o);
    case cli::mode::list_tasks:
    case cli::mode::sweep:
    case cli::mode::run_task: break;
  }
  // The task libraries are loaded here too, to check a task's arguments before a worker starts.
  const auto libs = cli::task_libraries(o);
  cli::load_libraries(libs);
  if (o.what == cli::mode::list_tasks) return cli::list_tasks(o);
  if (o.what == cli::mode::sweep) return cli::run_sweep(o, libs);
  return cli::run_task(o, libs);
}

// A failure before or outside the task: on stderr, and as a record on stdout under --json.
int report_failure(bool as_json, const char* outcome, int code, const std::string& what) {
  // The message may quote what others wrote: a spec, a folder's files, a task's words.
  std::fprintf(stderr, "isorun: %s: %s\n", code == 2 ? "error" : "internal error", printable(what).c_str());
  if (as_json) std::cout << nlohmann::json{{"outcome", outcome}, {"exit_code", code}, {"message", what}}.dump() << std::endl;
  return code;
}

// A program that runs isorun as its child (isorun.sweep() from Python) names itself in
// ISORUN_STOP_WITH_PARENT: if it dies, isorun gets SIGTERM and stops what it runs as a Ctrl-C
// would, instead of running on orphaned.
void stop_with_parent() {
  const char* parent = std::getenv("ISORUN_STOP_WITH_PARENT");
  if (!parent) return;
  const long pid = std::strtol(parent, nullptr, 10);
  ::unsetenv("ISORUN_STOP_WITH_PARENT");  // not for the programs isorun runs
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (pid > 0 && ::getppid() != pid) std::raise(SIGTERM);  // it died before this took effect
}

}  // namespace

int main(int argc, char** argv) {
  isorun::init(argc, argv);
  stop_with_parent();
  const bool as_json = cli::wants_json(argc, argv);
  try {
    return dispatch(argc, argv);
  } catch (const usage_error& e) {
    return report_failure(as_json, "usage", 2, e.what());
  } catch (const parse_error& e) {
    return report_failure(as_json, "usage", 2, e.what());
  } catch (const std::exception& e) {
    return report_failure(as_json, "internal_error", 125, e.what());
  }
}
