#pragma once
// Where trials can run, as a table: one row per backend, with what it supports (the engine asks
// these, never which backend a sweep has) and how it is made. A new backend is its own files, a
// row in backends.cpp, the spec's parse of its section (its row in spec_yaml.cpp's table of
// names, which the CLI's --backend reads too), its docs and its tests.

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "engine/run_state.hpp"
#include "isorun/sweep/backend_traits.hpp"
#include "isorun/sweep/trial_backend.hpp"

namespace isorun::sweep {

/// One backend: its name (the spec's `backend:`, select_backend), its traits, and its parts.
struct backend_kind {
  std::string_view name;
  backend_traits traits;
  /// Refuses, before anything starts, what the spec asks that this backend cannot run (a
  /// spec_error naming the line); null where it takes every spec its traits allow.
  void (*check)(const sweep_spec& s) = nullptr;
  /// The backend for a run of `st`: `run` is the run's number in sweep.json (0 on a cluster's
  /// node), `run_start` when it began.
  std::unique_ptr<trial_backend> (*make)(const run_state& st, int run,
                                         std::chrono::steady_clock::time_point run_start) = nullptr;
};

/// @brief The backend this process runs a sweep's trials on: the spec's, except that an array
///        task of a cluster submission (options.node) runs its share on its own slots.
const backend_kind& backend_of(const sweep_spec& s, const sweep_options& options);

/// @brief The names of the backends that have `trait` ("slurm"), for messages that refuse it.
std::string backends_that(bool backend_traits::*trait);

}  // namespace isorun::sweep
