#pragma once
// The process's watcher: one thread that watches every call no thread waits for at once (futures,
// executors, maps), and every worker after its result was handed over early, through one epoll
// set over their descriptors and one timerfd for their deadlines. A queued call is a record in
// its admission's queue, a running one a few descriptors here: calls in flight cost no thread.
//
// It also runs what it is given (post): the start of calls admitted for it, so that their workers
// belong to its thread, which lives as long as the process (a worker is killed when the thread
// that started it ends: PR_SET_PDEATHSIG).

#include <functional>
#include <memory>

#include "job_state.hpp"

namespace isorun::runner {

class watcher {
 public:
  // The one watcher, started on first use; never destroyed (calls may end as the process exits).
  static watcher& instance();

  // From now on the watcher watches the started job `s` (claimed for it) to the end of its watch
  // (worker_watch), then publishes that end (publish_end) and, after an early hand-over, sees the
  // worker's exit as adopt() does. Wakes nothing: the watcher hears of the job through its
  // descriptors and its deadline.
  void watch(std::shared_ptr<job::state> s);

  // After an early hand-over watched elsewhere: the worker has its grace to exit (a CUDA
  // context's teardown), a cancel or the end of the grace kills its group, and it is reaped once
  // gone; then what it held is released. Tells the worker it may go (let_go), last.
  void adopt(std::shared_ptr<job::state> s);

  // Runs `task` on the watcher's thread, soon (it must not throw).
  void post(std::function<void()> task);

  // Waits until the watcher holds no job (each watched one ended, each exiting worker reaped)
  // and has run what was posted: for a test that counts descriptors or children.
  void wait_idle();

 private:
  watcher();
  struct impl;
  impl* impl_;  // never destroyed
};

}  // namespace isorun::runner
