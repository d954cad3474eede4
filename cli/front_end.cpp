// isorun: the command users run. It runs `isorun [OPTIONS] -- CMD` itself, and execs isorun-cli
// (the whole command line, in the library folder) with the same arguments for everything else:
// a task, a sweep, any other command, and a command line it cannot parse, whose message is then
// isorun-cli's, as for every other mistake. cli/CMakeLists.txt says why there are two programs.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

#include "entry.hpp"
#include "isorun/runner/containment.hpp"
#include "isorun/runner/driver_cap.hpp"
#include "isorun/runner/errors.hpp"
#include "isorun/worker/init.hpp"
#include "options.hpp"
#include "run_command.hpp"

namespace {
using namespace isorun;

// The command line, if it asks for `-- CMD` and parses; nothing otherwise.
std::optional<cli::cli_options> command_to_run(int argc, char** argv) {
  if (is_worker_process()) return std::nullopt;  // a worker is isorun-cli's to be
  // Without a `--` it asks for something else: handed over before the parser is built, which costs
  // a task run more than the rest of this program's start.
  if (std::find(argv + 1, argv + argc, std::string_view("--")) == argv + argc) return std::nullopt;
  try {
    cli::cli_options o = cli::parse_command_line(argc, argv);
    if (o.what == cli::mode::run_command) return o;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

[[noreturn]] void exec_whole_cli(int argc, char** argv) {
  std::exit(cli::guarded(argc, argv, [&]() -> int {
    const std::string cli = runner::beside_library("isorun-cli", "isorun can run no task or sweep");
    cli::hand_on_error_file();
    ::execv(cli.c_str(), argv);
    throw internal_error("cannot start " + cli + ": " + std::strerror(errno) + "; reinstall isorun");
  }));
}

}  // namespace

int main(int argc, char** argv) {
  auto o = command_to_run(argc, argv);
  if (!o) exec_whole_cli(argc, argv);
  cli::stop_with_parent();
  return cli::guarded(argc, argv, [&] {
    if (const std::string bad = runner::containment_setting_error(); !bad.empty()) throw usage_error(bad);
    return cli::run_command(*o);
  });
}
