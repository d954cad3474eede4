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
// The conversation after the replay runs on a thread of its own: the sweep goes on (trials end
// and are journaled, reports are judged, Ctrl-C stops it) while the searcher thinks. next()
// sends an ask and returns nothing; the answer, once it comes, is a trial ready for the next
// call, and the sweep is woken for it. Messages reach the searcher in the order the sweep made
// them.
//
// A searcher that exits, prints a line that is not an answer, or takes longer than the search's
// timeout stops the sweep with an error naming it and its stderr log (OUT/search.err); what was
// journaled stays. It runs in a process group (and, where isorun has them, a cgroup) of its own,
// killed whole when it exits or the source is destroyed: nothing it started outlives the sweep.

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
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

  /// @brief A trial proposed earlier, or one the searcher answered since; else nothing, and an
  ///        ask is sent if none is out and the budget allows. @throws what stopped the searcher.
  std::optional<new_trial> next() override;
  [[nodiscard]] bool exhausted() const override;
  /// @brief Queues the trial's end for the searcher. @throws what stopped the searcher.
  void tell(const trial_record& record) override;
  /// @brief An ask is out, or a tell not yet heard.
  [[nodiscard]] bool busy() const override;
  void on_ready(const std::function<void()>& wake) override;

 private:
  // One message to send: an ask, or a tell with the line journaled for it first.
  // NOLINTNEXTLINE(bugprone-exception-escape): its moves are nlohmann::json's, which do not throw
  struct outgoing {
    nlohmann::json message;
    nlohmann::json line;    // null for an ask
    std::size_t tells = 0;  // an ask's: the tells queued before it
  };
  // What an ask's answer says: a trial (checked, and journaled), wait, or done.
  // NOLINTNEXTLINE(bugprone-exception-escape): its moves are nlohmann::json's, which do not throw
  struct answer_to_ask {
    std::optional<new_trial> trial;
    nlohmann::json params;
    bool wait = false, done = false;
  };
  // The constructor's steps: the earlier conversation read, stderr's copy set up, the searcher
  // started, greeted, and told the earlier conversation again.
  std::vector<nlohmann::json> read_conversation(int dir);
  unique_fd copy_stderr(int dir);
  void start(unique_fd err_write);
  void greet(std::size_t replayed);
  void replay(const std::vector<nlohmann::json>& earlier);
  void converse();                                                           // the thread
  answer_to_ask answered(std::size_t number, const nlohmann::json& answer);  // the thread, no lock held
  void wake();
  // One message, and its answer (an object). Returns null where the source is being destroyed.
  nlohmann::json exchange(const nlohmann::json& message);
  // Appends `line` to OUT/search.jsonl, fsync'ed; nothing where it is longer than a line there may be.
  enum class logged { written, too_long };
  logged log(const nlohmann::json& line);
  [[noreturn]] void fail(const std::string& what) const;
  // Line `line` of OUT/search.jsonl cannot be replayed: the sweep stops, naming the file and line.
  [[noreturn]] void replay_failed(int line, const std::string& what) const;
  void check_replayed(const nlohmann::json& line, int number) const;
  // It is gone (exited, or its end of the socket closed): reaped with its process group and
  // cgroup, and the sweep stopped saying how it ended.
  [[noreturn]] void exited(const std::string& instead_of);
  new_trial made(std::size_t number, const nlohmann::json& params) const;
  nlohmann::json tell_message(std::size_t number, const nlohmann::json& params, const trial_record& r) const;

  // Copies the searcher's stderr (a pipe) into OUT/search.err, within detail::max_log, on a thread
  // of its own: until the pipe ends, or this is destroyed (what the pipe holds then copied first).
  class stderr_copy {
   public:
    stderr_copy(unique_fd from, unique_fd to);
    ~stderr_copy();
    stderr_copy(const stderr_copy&) = delete;
    stderr_copy& operator=(const stderr_copy&) = delete;

   private:
    void run();
    unique_fd from_, to_, stop_;  // the pipe's read end, the file, an eventfd written once to stop
    std::thread thread_;
  };

  searcher_setup setup_;
  std::unique_ptr<stderr_copy> stderr_;  // before process_: stopped once the searcher and its descendants are gone
  std::unique_ptr<runner::child> process_;
  unique_fd to_, log_;  // its stdin and stdout (one socket); OUT/search.jsonl (the thread's, after the replay)
  unique_fd quit_;      // an eventfd: written once, when the source is destroyed, to end a wait for an answer
  std::string buffer_;  // what was read past the last answer's line (the thread's)

  mutable std::mutex mutex_;  // what follows, shared by the sweep's calls and the thread
  std::condition_variable queued_;
  std::deque<outgoing> queue_;  // for the thread to send, in order
  bool sending_ = false;        // the thread is sending one (or waiting for its answer)
  bool asking_ = false;         // an ask is queued or out
  bool waiting_ = false;        // it answered wait: no ask before the next tell
  std::size_t tells_ = 0;       // tells queued so far
  bool quit_asked_ = false;
  std::exception_ptr error_;  // what stopped the conversation
  std::size_t asked_ = 0;
  bool done_ = false;
  std::deque<new_trial> pending_;                   // proposed in an earlier run: given out first
  std::deque<new_trial> ready_;                     // answered since: given out next
  std::map<std::string, std::size_t> number_of_;    // trial id -> its number
  std::map<std::string, nlohmann::json> searched_;  // trial id -> the searcher's parameters
  std::set<std::string> told_;                      // ids the searcher has been (or is to be) told of

  std::mutex wake_mutex_;  // held while the wake is called: a scheduler clears it before it goes
  std::function<void()> wake_;
  std::thread thread_;  // last: started once everything above is
};

}  // namespace isorun::sweep
