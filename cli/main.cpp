// isorun-cli: the whole command line (`isorun`, the front end, execs it for all but `-- CMD`).
// main() parses the command line (options.hpp) and hands it to the command it names. The same
// executable is also its own worker (re-executed with ISORUN_WORKER=1): isorun::init() takes that
// over.
#include <cstdio>
#include <iostream>
#include <string>

#include "entry.hpp"
#include "gpus_command.hpp"
#include "isorun/runner/containment.hpp"
#include "isorun/runner/errors.hpp"
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

}  // namespace

int main(int argc, char** argv) {
  isorun::init(argc, argv);
  cli::stop_with_parent();
  return cli::guarded(argc, argv, [&] { return dispatch(argc, argv); });
}
