#pragma once
/// @file sweep_options.hpp
/// How a sweep runs beyond its spec: what the command line and the embedding program decide
/// (worker program, progress, where trials come from, Slurm's node role). Its own header, so
/// that the parts of a sweep that read it (its backends, its stop source) need not see the run.

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace isorun::runner {
class admission;
}

namespace isorun::sweep {

class trial_source;
class list_source;

/// How a sweep runs, beyond its spec.
struct sweep_options {
  std::vector<std::string> task_libraries;
  std::string executable;  ///< worker program; empty = this program
  bool rerun_failed = false;
  bool progress = true;        ///< live progress line on a terminal, plain lines otherwise
  bool wait_for_lock = false;  ///< wait for another sweep using the output folder instead of failing
  std::chrono::milliseconds grace{5000};
  /// With the Slurm backend: the command each array task runs on its node, in `submit_dir`
  /// (the isorun command line that made this sweep; `--node FILE:K` is added).
  std::vector<std::string> node_command;
  std::string submit_dir = ".";
  /// With the Slurm backend: submit, and return without waiting (`isorun status OUT` shows
  /// progress; running the same command again follows the arrays and journals their results).
  bool detach = false;
  /// This process is array task K of a Slurm submission ("FILE:K"): it runs the trials listed
  /// for K here, and leaves each one's record in OUT/slurm/results/ for the submitter to journal.
  std::string node;
  /// Where the trials come from, where not the spec's list alone (trial_source.hpp): made with
  /// the spec's trials still to run as a list_source, which it may give out among its own. Not
  /// with the Slurm backend, whose arrays are submitted for the spec's list.
  std::function<std::unique_ptr<trial_source>(std::unique_ptr<list_source> listed)> source;
  /// The source's name and settings, part of which sweep an output folder holds: resuming with
  /// another source is refused.
  std::string source_name;
  /// Where each trial is admitted before it starts, beside the other calls of this process
  /// (runner/admission.hpp); null: the process's, runner::admission::process().
  runner::admission* admission = nullptr;
};

}  // namespace isorun::sweep
