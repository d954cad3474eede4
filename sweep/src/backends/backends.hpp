#pragma once
// Where trials can run, as a table: one row per backend, with what it supports (the engine asks
// these, never which backend a sweep has) and how it is made. A new backend is its own files, a
// row in backends.cpp, the spec's parse of its section, its docs and its tests.

#include <chrono>
#include <memory>
#include <string_view>

#include "engine/run_state.hpp"
#include "isorun/sweep/trial_backend.hpp"

namespace isorun::sweep {

/// What a backend can do.
struct backend_traits {
  /// Its trials run on this machine's slots, so each trial's GPUs, the host cap and the slots'
  /// room for out-of-memory retries are checked here (a cluster's slots are on its nodes).
  bool runs_here = true;
  /// It takes trials from a source the caller made (sweep_options::source) as they come; a
  /// backend that submits ahead runs the spec's list (or its searcher's).
  bool caller_sources = true;
  /// It retries a trial that ran out of memory at a larger cap, every attempt journaled as it
  /// ends (a cluster's records reach the journal only as each trial's end).
  bool oom_retry = true;
  /// It can submit and return, its trials running on elsewhere (--detach).
  bool detach = false;
};

/// One backend: its name (the spec's `backend:`), its traits, and its parts.
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

}  // namespace isorun::sweep
