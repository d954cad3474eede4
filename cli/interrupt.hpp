#pragma once
// Ctrl-C, in one place for every mode. While something runs (a task's worker, a -- CMD, a
// sweep), SIGINT, SIGTERM, SIGHUP and SIGQUIT are handed to it; the escalation is the runner's
// own:
//
//   first signal:  a graceful stop. A task's worker gets SIGTERM, then SIGKILL after --grace
//                  (runner::job::cancel); a -- CMD's process group gets the very signal isorun
//                  got, as from its terminal, then SIGKILL after --grace (runner::command::
//                  cancel); a sweep launches no new trials and cancels the running ones
//                  (sweep::request_stop).
//   second signal: the next step at once: SIGKILL now. (A -- CMD takes it on a second SIGINT or
//                  SIGTERM; a second SIGHUP or SIGQUIT is passed on to it as such.)
//
// isorun then reports what ended and exits (130 after an interrupted task or sweep; a -- CMD's
// own status). Outside such a stretch the signals keep their default: nothing runs that would be
// orphaned, and a supervisor killed outright takes its workers down with it (containment).

#include <string>

namespace isorun::cli {

/// What a signal is handed to. Called in the signal handler: async-signal-safe, like the
/// runner's cancel() and sweep::request_stop().
using stop_function = void (*)(int signal) noexcept;

/// @brief For its lifetime, SIGINT, SIGTERM, SIGHUP and SIGQUIT are caught, and handed to the
///        stop function given here or later with hand_to(): each one, with its number. Before
///        the first and before the next ones, `first_notice` and `second_notice` (if not empty)
///        are written to stderr, so the user sees at once what happens. Restores the default
///        handling when it ends. One at a time.
///
/// Made before what it stops is started, and handed it after, it leaves no moment in which a
/// Ctrl-C would kill isorun and leave what just started to the containment's clean-up: a signal
/// that comes in between is handed on by hand_to().
class interrupt_scope {
 public:
  explicit interrupt_scope(std::string first_notice = {}, std::string second_notice = {});
  interrupt_scope(stop_function stop, std::string first_notice = {}, std::string second_notice = {});
  ~interrupt_scope();
  interrupt_scope(const interrupt_scope&) = delete;
  interrupt_scope& operator=(const interrupt_scope&) = delete;

  /// @brief From now on signals go to `stop`; those that came before are handed to it now.
  void hand_to(stop_function stop) noexcept;

  /// @brief Catches `signal` too, for the scope's life, as the others (on a Slurm node, the
  ///        warning Slurm sends ahead of the time limit).
  void also_catch(int signal) const noexcept;

 private:
  std::string first_, second_;  // read by the handler: fixed before it is installed
};

}  // namespace isorun::cli
