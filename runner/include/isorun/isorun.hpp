#pragma once
/// @file isorun.hpp
/// Everything a user program needs: tasks, init, the isolated() wrapper, outcomes, units.

#include "isorun/errors.hpp"
#include "isorun/init.hpp"
#include "isorun/isolated.hpp"
#include "isorun/map.hpp"
#include "isorun/outcome.hpp"
#include "isorun/serialization/blob.hpp"
#include "isorun/task.hpp"
#include "isorun/this_worker.hpp"
#include "isorun/units.hpp"
