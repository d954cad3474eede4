#pragma once
/// @file errors.hpp
/// What a sweep throws besides bad input (spec_error, in spec.hpp, and runner::usage_error).

#include "isorun/runner/errors.hpp"

namespace isorun::sweep {

/// The searcher (`search:`) failed: it could not be started, exited, answered what is not an
/// answer, or took longer than its timeout; or OUT/search.jsonl, which a resumed search replays,
/// holds a line isorun does not write. The message names the searcher and OUT/search.err (or the
/// file and line). The sweep stopped; what was journaled stays, and running it again resumes it.
/// The CLI exits with 1 (docs/sweeps.md).
class search_error : public isorun::error {
 public:
  using error::error;
};

}  // namespace isorun::sweep
