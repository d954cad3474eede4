#pragma once
// The parts of isorun._core (module.cpp): each binds its own functions and types.
#include <nanobind/nanobind.h>

namespace isorun_python {

/// The task every Python worker serves (worker_side.cpp), named in each call's job (caller.cpp).
inline constexpr const char* python_task = "isorun.python";

/// The caller's side (caller.cpp): options, calls, admissions, standby pools, result segments.
void bind_caller(nanobind::module_& m);
/// The worker's side (worker_side.cpp): the task that runs a call, the worker's main, its environment.
void bind_worker(nanobind::module_& m);
/// A zygote's loop and its forked children's first steps (zygote.cpp).
void bind_zygote(nanobind::module_& m);

}  // namespace isorun_python
