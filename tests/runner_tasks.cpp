// Registers the runner tests' tasks (runner_tasks.hpp), once for the whole test binary.
#include <cstdlib>

#include "runner_tasks.hpp"

// Before main: the API's inventory is read once, from this simulated 2-GPU machine.
static const int simulated_gpus = (::setenv("ISORUN_SIMULATE_GPUS", "2x16G", 1), 0);

using namespace runner_tests;

ISORUN_TASK(echo_point);
ISORUN_TASK(concat);
ISORUN_TASK(scale);
ISORUN_TASK(make_pattern);
ISORUN_TASK(sum_blob);
ISORUN_TASK(fill_in_place);
ISORUN_TASK(locate_pattern);
ISORUN_TASK(view_of_kept);
ISORUN_TASK(one_of_two);
ISORUN_TASK(forked_writer);
ISORUN_TASK(from_device);
ISORUN_TASK(streams_wrongly);
ISORUN_TASK(wrap_in_place);
ISORUN_TASK(throws);
ISORUN_TASK(segfaults);
ISORUN_TASK(aborts);
ISORUN_TASK(exits_early);
ISORUN_TASK(visible_devices);
ISORUN_TASK(on_devices);
ISORUN_TASK(pid_and_calls);
ISORUN_TASK(sleeps_long);
ISORUN_TASK(runs_until_told);
ISORUN_TASK(floods_until_told);
ISORUN_TASK(hang_with_grandchild);
ISORUN_TASK(no_result);
ISORUN_TASK(hold);
ISORUN_TASK(eats_host);
ISORUN_TASK(thread_vars);
ISORUN_TASK(bind_vars);
ISORUN_TASK(threads_cpus);
ISORUN_TASK(twice);
ISORUN_TASK(warm_state);
ISORUN_TASK(prints);
ISORUN_TASK(escapee);
ISORUN_TASK(escapes_to_rewrite);
ISORUN_TASK(clings);
ISORUN_TASK(segments_held);
ISORUN_TASK(frees_slowly);
ISORUN_TASK(frees_slowly_after_large_request);
