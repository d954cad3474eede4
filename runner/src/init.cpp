// isorun::init: what a re-executed copy of the program is asked to be. It lives at the top of
// the library because the shim is the runner's (command.hpp) and the worker is the worker's.
#include <cstdlib>

#include "isorun/runner/command.hpp"
#include "isorun/serialization/protocol.hpp"
#include "isorun/worker/init.hpp"

namespace isorun {

void init(int argc, char** argv) {
  if (runner::is_command_shim()) runner::run_command_shim(argc, argv);
  if (!is_worker_process()) return;
  ::unsetenv(serialization::env::worker.data());  // the task's own children are ordinary processes
  detail::run_worker();
}

}  // namespace isorun
