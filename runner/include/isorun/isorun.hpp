#pragma once
/// @file isorun.hpp
/// Everything a user program needs: tasks, init, the isolated() wrapper, outcomes, units.

#include "isorun/runner/errors.hpp"
#include "isorun/runner/executor.hpp"
#include "isorun/runner/isolated.hpp"
#include "isorun/runner/map.hpp"
#include "isorun/runner/outcome.hpp"
#include "isorun/runner/units.hpp"
#include "isorun/serialization/blob.hpp"
#include "isorun/worker/init.hpp"
#include "isorun/worker/task.hpp"
#include "isorun/worker/this_worker.hpp"
