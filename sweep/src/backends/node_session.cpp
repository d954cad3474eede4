#include "backends/node_session.hpp"

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "isorun/runner/errors.hpp"
#include "isorun/runner/printable.hpp"
#include "isorun/sweep/scheduler.hpp"
#include "isorun/sweep/slurm.hpp"

namespace isorun::sweep {

// The submitter's verdicts, OUT/slurm/stop/ID, each stopping that trial alone as pruned.
// Looked for every 100 ms (a shared file system need not tell another node of a new
// file), until destroyed.
class node_session::verdict_watch {
 public:
  verdict_watch(const run_state& st, scheduler& sched) : thread_{[this, &st, &sched] { watch(st, sched); }} {}
  verdict_watch(const verdict_watch&) = delete;
  verdict_watch& operator=(const verdict_watch&) = delete;
  ~verdict_watch() {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }

 private:
  void watch(const run_state& st, scheduler& sched) {
    const remote_folder folder(st.out, "slurm");
    std::set<std::size_t> stopped;
    for (;;) {
      {
        std::unique_lock lock(mutex_);
        if (wake_.wait_for(lock, std::chrono::milliseconds(100), [&] { return done_; })) return;
      }
      for (std::size_t i : st.queue) {
        const std::string id = trial_at(st, i).id;
        if (!stopped.count(i) && folder.stop_requested(id)) {
          stopped.insert(i);
          sched.prune({i, id, 1});
        }
      }
    }
  }
  std::mutex mutex_;
  std::condition_variable wake_;
  bool done_ = false;
  std::thread thread_;
};

node_session::node_session(const run_state& st)
    : st_{st},
      shared_{st.out, "slurm"},
      judged_{static_cast<bool>(st.s.early_stopping) || st.s.pbt},
      forwards_{judged_ || !st.s.track.empty()} {}

node_session::~node_session() = default;

void node_session::queue_trials(run_state& st) {
  const sweep_spec& s = st.s;
  const slurm::assignment a = slurm::node_trials(st.opt.node);
  const remote_folder shared(st.out, "slurm");  // where a record waits to be journaled
  for (std::size_t i : a.trials) {
    if (const auto made = a.made.find(i); made != a.made.end())
      st.made[i] = {i, made->second.id, made->second.params, made->second.origin};
    else if (i >= s.trials.size())
      throw usage_error("--node " + st.opt.node + " lists trial " + std::to_string(i) + ", but the sweep has " +
                        std::to_string(s.trials.size()));
    if (!shared.has_record(trial_at(st, i).id)) st.queue.push_back(i);
  }
}

std::unique_ptr<record_store> node_session::records() const { return shared_.records_store(); }

// A line the submitter's judging needs cannot be lost: where it cannot be written, the node's
// trials stop. One only its trackers want is lost with a warning (a tracker costs the sweep
// nothing).
void node_session::forward(const trial& t, const std::function<void()>& write) const {
  if (judged_) return write();
  try {
    write();
  } catch (const std::exception& e) {
    const std::lock_guard lock(mutex_);
    if (unforwarded_.insert(t.id).second)
      std::fprintf(stderr, "isorun: warning: trial %s's reports cannot reach the trackers: %s\n",
                   printable(t.id).c_str(), printable(e.what()).c_str());
  }
}

std::function<bool(const trial&, std::int64_t, const nlohmann::json&)> node_session::report_forwarder() const {
  return [this](const trial& t, std::int64_t step, const nlohmann::json& metrics) {
    forward(t, [&] { shared_.report(t.id, step, metrics); });
    return false;  // the submitter decides, and says so through a verdict
  };
}

std::function<void(const trial&, std::int64_t)> node_session::checkpoint_forwarder() const {
  if (!forwards_) return {};
  return [this](const trial& t, std::int64_t step) { forward(t, [&] { shared_.checkpoint(t.id, step); }); };
}

void node_session::watch_verdicts(scheduler& sched) {
  if (judged_) verdicts_ = std::make_unique<verdict_watch>(st_, sched);
}

void node_session::stop_watching() { verdicts_.reset(); }

}  // namespace isorun::sweep
