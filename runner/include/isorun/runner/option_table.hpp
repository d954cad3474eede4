#pragma once
/// @file option_table.hpp
/// isolated_options by name, once. What turns the options into a job (job_spec_for) and what
/// binds them for another language (the Python module's CallOptions) walk this table, so a new
/// option is its field in isolated_options and its row here.

#include <type_traits>

#include "isorun/runner/job.hpp"
#include "isorun/runner/options.hpp"

namespace isorun::runner {

/// One option: its name, its field, and the job_spec field it sets as it is (nullptr where it
/// sets none: where the call runs, which placement decides, or what job_spec_for computes).
template <class T>
struct option_row {
  const char* name;
  T isolated_options::*field;
  T job_spec::*sets = nullptr;
};
template <class T>
option_row(const char*, T isolated_options::*) -> option_row<T>;
template <class T>
option_row(const char*, T isolated_options::*, T job_spec::*) -> option_row<T>;

/// Calls `visit(row)` for each option, in the order of isolated_options.
template <class Visit>
constexpr void for_each_option(Visit&& visit) {
  using o = isolated_options;
  using j = job_spec;
  visit(option_row{"gpu", &o::gpu});
  visit(option_row{"gpus", &o::gpus});
  visit(option_row{"gpu_count", &o::gpu_count});
  visit(option_row{"mem_limit", &o::mem_limit, &j::mem_limit});
  visit(option_row{"host_mem_limit", &o::host_mem_limit, &j::host_mem_limit});
  visit(option_row{"cpus_per_call", &o::cpus_per_call});  // the workers' thread limits, computed
  visit(option_row{"timeout", &o::timeout, &j::timeout});
  visit(option_row{"grace", &o::grace, &j::grace});
  visit(option_row{"alloc_conf", &o::alloc_conf, &j::alloc_conf});
  visit(option_row{"env", &o::env});                  // with the thread limits, computed
  visit(option_row{"echo_stderr", &o::echo_stderr});  // a descriptor, computed
  visit(option_row{"max_result", &o::max_result, &j::max_result});
  visit(option_row{"standby", &o::standby});  // the pool's, not the job's
  visit(option_row{"warm_context", &o::warm_context, &j::warm_context});
  visit(option_row{"early_result", &o::early_result, &j::early_result});
}

}  // namespace isorun::runner
