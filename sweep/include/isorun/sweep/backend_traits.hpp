#pragma once
// What a sweep's backend can do, for those that choose around it (the CLI plans no slots of its
// own for a backend whose trials run elsewhere). The backends themselves are internal.

#include "isorun/sweep/spec.hpp"
#include "isorun/sweep/sweep_options.hpp"

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

/// @brief The traits of the backend a run of `s` with `options` uses (backend_name(s), except
///        that an array task of a cluster submission runs its share here).
const backend_traits& backend_traits_of(const sweep_spec& s, const sweep_options& options);

}  // namespace isorun::sweep
