#pragma once
/// @file sweep.hpp
/// Hyperparameter sweeps, all of it: a spec (YAML or flags) expands into trials; trials run
/// isolated and capped on slots packed per GPU; every finished trial is journaled durably, so
/// re-running the same command resumes; the results are ranked and tabulated.

#include "isorun/sweep/backend_traits.hpp"
#include "isorun/sweep/html_report.hpp"
#include "isorun/sweep/journal.hpp"
#include "isorun/sweep/report.hpp"
#include "isorun/sweep/run.hpp"
#include "isorun/sweep/spec.hpp"
