// isorun::init: what a re-executed copy of the program is asked to be: a worker. (The arguments
// are part of the API so that a future role can read them; a worker takes its work from the
// assignment, not from argv.)
#include <cstdlib>

#include "isorun/serialization/protocol.hpp"
#include "isorun/worker/init.hpp"

namespace isorun {

void init(int /*argc*/, char** /*argv*/) {
  if (!is_worker_process()) return;
  ::unsetenv(serialization::env::worker.data());  // the task's own children are ordinary processes
  detail::run_worker();
}

}  // namespace isorun
