#pragma once
// A trial source that asks a searcher program for each trial (docs/sweeps.md#search): isorun's
// searcher protocol, JSON lines on the program's stdin and stdout, one answer per message:
//
//   isorun -> searcher                                         searcher -> isorun
//   {"op": "hello", "protocol": 1, "objectives": [...], ...}   {}            (before anything else)
//   {"op": "ask", "number": N}                                 {"params": {...}} | {"wait": true} | {"done": true}
//   {"op": "tell", "number": N, "params": {...}, "outcome": "success", "values": [...], "result": {...}}
//                                                              {}
//
// Every ask it answered with parameters and every tell is appended, fsync'ed, to OUT/search.jsonl
// before it counts. A resumed sweep starts the searcher afresh and replays that conversation to
// it, in its order (the messages carry "replay": true), before asking anything new: a seeded
// searcher is then where it was, and proposes what it would have proposed. Trials it proposed
// that are not done (the sweep's journal says) are given out again first, with their numbers, ids
// and parameters.
//
// A searcher that exits, prints a line that is not an answer, or takes longer than the search's
// timeout stops the sweep with an error naming it and its stderr log (OUT/search.err); what was
// journaled stays.

#include <chrono>
#include <cstddef>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "isorun/runner/unique_fd.hpp"
#include "isorun/sweep/spec.hpp"
#include "isorun/sweep/trial_source.hpp"

namespace isorun::runner {
class child;
}

namespace isorun::sweep {

/// What the searcher source needs of the sweep.
struct searcher_setup {
  const sweep_spec* spec = nullptr;  ///< its search, metric and constants; outlives the source
  std::string subject;               ///< trial ids are made from it
  std::filesystem::path out;         ///< the output folder: search.jsonl, search.err
  std::vector<std::string> argv;     ///< the searcher program (found in PATH) and its arguments
  std::size_t slots = 1;             ///< trials that may run at once (told in hello)
  std::size_t first_index = 0;       ///< the first trial's index (after the spec's own)
};

/// @brief The searcher program of `s.search`: its command, or, for type optuna, the Python
///        package's (`python -m isorun.search.optuna`).
std::vector<std::string> searcher_command(const sweep_spec& s);

/// @brief Refuses a search that cannot start (exit 2, naming the spec's line): a searcher
///        program not found, Optuna not installed where type optuna needs it.
/// @throws spec_error.
void check_searcher(const sweep_spec& s);

class searcher_source final : public trial_source {
 public:
  /// @brief Starts the searcher, says hello, and replays OUT/search.jsonl to it.
  /// @throws std::exception naming the searcher if it cannot be started or fails the replay.
  explicit searcher_source(searcher_setup setup);
  ~searcher_source() override;
  searcher_source(const searcher_source&) = delete;
  searcher_source& operator=(const searcher_source&) = delete;

  std::optional<new_trial> next() override;
  [[nodiscard]] bool exhausted() const override;
  void tell(const trial_record& record) override;

  /// @brief The trials asked for so far (the budget counts them).
  [[nodiscard]] std::size_t asked() const noexcept { return asked_; }

 private:
  // One message, and its answer (an object).
  nlohmann::json exchange(const nlohmann::json& message);
  void log(const nlohmann::json& line);
  [[noreturn]] void fail(const std::string& what) const;
  // It is gone (its end of the socket closed): reaped, and the sweep stopped saying how it ended.
  [[noreturn]] void exited(const std::string& instead_of);
  new_trial made(std::size_t number, const nlohmann::json& params) const;
  nlohmann::json tell_message(std::size_t number, const nlohmann::json& params, const trial_record& r) const;

  searcher_setup setup_;
  std::unique_ptr<runner::child> process_;
  unique_fd to_, log_;  // its stdin and stdout (one socket); OUT/search.jsonl
  std::string buffer_;  // what was read past the last answer's line
  std::size_t asked_ = 0;
  bool done_ = false;
  std::deque<new_trial> pending_;                   // proposed in an earlier run: given out first
  std::map<std::string, std::size_t> number_of_;    // trial id -> its number
  std::map<std::string, nlohmann::json> searched_;  // trial id -> the searcher's parameters
  std::set<std::string> told_;                      // ids the searcher has been told of
};

}  // namespace isorun::sweep
