// The sweep scheduler against a fake backend: fail-fast, retries, the metric check, a stop
// request mid-sweep, early stopping's hook and trials a backend already runs. No process is
// started: the fake ends attempts when its script says, on the scheduler's own calls.
#include <catch2/catch.hpp>

#include <stdlib.h>

#include <algorithm>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <tuple>
#include <utility>

#include "isorun/sweep/journal.hpp"
#include "isorun/sweep/journal_writer.hpp"
#include "isorun/sweep/run.hpp"
#include "isorun/sweep/scheduler.hpp"
#include "isorun/sweep/stop_source.hpp"
#include "isorun/sweep/trial_backend.hpp"

namespace fs = std::filesystem;
namespace sw = isorun::sweep;
using isorun::outcome_kind;
using nlohmann::json;

namespace {

// A backend whose attempts end only when its script (or a stop) ends them.
class fake_backend final : public sw::trial_backend {
 public:
  using script = std::function<void(fake_backend&, const sw::trial&)>;
  fake_backend(std::size_t lanes, script on_start) : lanes_{lanes}, on_start_{std::move(on_start)} {}

  std::vector<sw::trial> adopted;                   // what begin() says already runs
  std::vector<std::pair<std::size_t, int>> starts;  // (trial, attempt), in order
  std::vector<std::size_t> stopped;                 // stop(trial) calls
  std::size_t peak = 0;                             // most attempts running at once
  int cancel_calls = 0;
  bool finished = false;
  outcome_kind stop_ends_as = outcome_kind::cancelled;    // a task asking should_stop() returns: success
  outcome_kind cancel_ends_as = outcome_kind::cancelled;  // an attempt can end otherwise as it is stopped
  json stop_result = nullptr;

  [[nodiscard]] std::size_t lanes() const override { return lanes_; }
  std::vector<sw::trial> begin(sw::trial_sink& sink) override {
    sink_ = &sink;
    for (const auto& t : adopted) running_[t.index] = t;
    return adopted;
  }
  void start(std::vector<sw::trial> batch) override {
    for (const auto& t : batch) {
      bool cancelled;
      {
        std::lock_guard lock(mutex_);
        starts.emplace_back(t.index, t.attempt);
        running_[t.index] = t;
        peak = std::max(peak, running_.size());
        cancelled = cancelled_;
      }
      if (cancelled) end(t.index, outcome_kind::cancelled);
      else on_start_(*this, t);
    }
  }
  void stop(const sw::trial& t) override {
    {
      std::lock_guard lock(mutex_);
      stopped.push_back(t.index);
    }
    end(t.index, stop_ends_as, stop_result);
  }
  void cancel_all() override {
    std::vector<std::size_t> all;
    {
      std::lock_guard lock(mutex_);
      ++cancel_calls;
      cancelled_ = true;
      for (const auto& [i, t] : running_) all.push_back(i);
    }
    for (std::size_t i : all) end(i, cancel_ends_as);
  }
  void finish() override { finished = true; }

  // Ends trial `index`'s running attempt (if it runs) as `kind` with `result`.
  void end(std::size_t index, outcome_kind kind, json result = nullptr, std::int64_t step = -1) {
    sw::trial t;
    {
      std::lock_guard lock(mutex_);
      auto it = running_.find(index);
      if (it == running_.end()) return;
      t = it->second;
      running_.erase(it);
    }
    sw::trial_record rec;
    rec.id = t.id;
    rec.params = {{"x", index}};
    rec.kind = kind;
    rec.result = std::move(result);
    rec.attempts = t.attempt;
    rec.mem_limit = t.mem_limit;
    rec.error = kind == outcome_kind::success ? "" : "scripted";
    rec.step = step;  // (a remote node's record says the step it saw last; a local backend's none)
    sink_->on_finished({{t, std::move(rec)}});
  }
  // Sends a report of running trial `t`.
  void report(const sw::trial& t, std::int64_t step, const json& metrics) { sink_->on_report(t, step, metrics); }

  [[nodiscard]] int starts_of(std::size_t index) const {
    return static_cast<int>(
        std::count_if(starts.begin(), starts.end(), [&](const auto& s) { return s.first == index; }));
  }

 private:
  std::size_t lanes_;
  script on_start_;
  sw::trial_sink* sink_ = nullptr;
  std::mutex mutex_;
  std::map<std::size_t, sw::trial> running_;
  bool cancelled_ = false;
};

sw::sweep_spec spec_of(std::size_t trials) {
  sw::sweep_spec s;
  s.task = "fake";
  for (std::size_t i = 0; i < trials; ++i) s.trials.push_back({{"x", i}});
  return s;
}

constexpr std::uint64_t GiB = 1ULL << 30;

// `trials` trials under a 1 GiB cap, retried out of memory at `factor` times the cap up to `max`.
sw::sweep_spec oom_retry_spec_of(std::size_t trials, double factor, std::uint64_t max) {
  auto s = spec_of(trials);
  s.mem_limit = 1 * GiB;
  s.oom_retry = {.factor = factor, .max = max};
  return s;
}

// What a scheduled sweep left: the journal as a resume would read it, and the scheduler's verdict.
struct ran {
  std::map<std::string, sw::trial_record> journal;
  std::vector<std::string> journal_warnings;
  std::size_t journal_lines = 0;
  std::size_t cancelled = 0;
  std::string metric_error;
  std::exception_ptr error;
  int stop_requests = 0;

  // The journaled record of trial `index` of `s`, or nullopt.
  [[nodiscard]] std::optional<sw::trial_record> of(const sw::sweep_spec& s, std::size_t index) const {
    auto it = journal.find(sw::trial_id(s.task, s.trials[index]));
    if (it == journal.end()) return std::nullopt;
    return it->second;
  }
};

// A store that cannot write (a full disk).
class failing_store final : public sw::record_store {
 public:
  void write(const std::vector<sw::trial_record>&) override { throw std::runtime_error("disk full"); }
};

// Runs every trial of `s` through a scheduler on `backend`, journaling into a fresh folder (or
// into `store`), with a stop source whose requests interrupt it as Ctrl-C does.
ran run_sweep(const sw::sweep_spec& s, fake_backend& backend, sw::scheduler_options options = {},
              sw::record_store* store = nullptr, sw::trial_source* from = nullptr) {
  char dir[] = "/tmp/isorun-scheduler-test-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  ran r;
  {
    sw::journal j{fs::path(dir)};
    sw::journal_store journal_store(j);
    sw::stop_source stop;
    sw::scheduler* sched_ptr = nullptr;
    sw::journal_writer writer(
        store ? *store : journal_store, [](const sw::trial_record&) {},
        [&](std::exception_ptr e) { sched_ptr->fail(std::move(e)); });
    std::vector<sw::new_trial> trials;
    for (std::size_t i = 0; i < s.trials.size(); ++i)
      trials.push_back({i, sw::trial_id(s.task, s.trials[i]), s.trials[i]});
    sw::list_source source(std::move(trials));
    sw::scheduler sched(s, from ? *from : source, backend, writer, stop, std::move(options));
    sched_ptr = &sched;
    stop.watch([&](int) { sched.interrupt(); });
    sched.run();
    stop.close();
    writer.close();
    r.cancelled = sched.cancelled();
    r.metric_error = sched.metric_error();
    r.error = sched.error();
    r.stop_requests = stop.requests();
  }
  {
    sw::journal reread{fs::path(dir)};
    r.journal = reread.latest();
    r.journal_warnings = reread.warnings();
  }
  std::ifstream in(fs::path(dir) / "results.jsonl");
  for (std::string line; std::getline(in, line);) ++r.journal_lines;
  fs::remove_all(dir);
  return r;
}

// A source that makes each trial on a thread of its own, as a searcher does: next() gives
// nothing while one is being made (busy()), and the wake says when it is ready.
class thinking_source final : public sw::trial_source {
 public:
  explicit thinking_source(std::vector<sw::new_trial> trials) : todo_(trials.begin(), trials.end()) {}
  ~thinking_source() override {
    for (auto& t : threads_) t.join();
  }
  std::optional<sw::new_trial> next() override {
    std::lock_guard lock(mutex_);
    if (ready_) return std::exchange(ready_, std::nullopt);
    if (!making_ && !todo_.empty()) {
      making_ = true;
      threads_.emplace_back([this, t = todo_.front()] {
        {
          std::lock_guard made(mutex_);
          ready_ = t;
          making_ = false;
        }
        std::lock_guard calling(wake_mutex_);
        if (wake_) wake_();
      });
      todo_.pop_front();
    }
    return std::nullopt;
  }
  [[nodiscard]] bool exhausted() const override {
    std::lock_guard lock(mutex_);
    return todo_.empty() && !making_ && !ready_;
  }
  void tell(const sw::trial_record&) override {}
  [[nodiscard]] bool busy() const override {
    std::lock_guard lock(mutex_);
    return making_ || ready_;
  }
  void on_ready(const std::function<void()>& wake) override {
    std::lock_guard lock(wake_mutex_);
    wake_ = wake;
  }

 private:
  mutable std::mutex mutex_;
  std::deque<sw::new_trial> todo_;
  std::optional<sw::new_trial> ready_;
  bool making_ = false;
  std::mutex wake_mutex_;
  std::function<void()> wake_;
  std::vector<std::thread> threads_;
};

// A script that keeps two attempts running: each start ends the attempt started before it
// (as `kind_of` says), and the last trial ends at once.
fake_backend::script overlapping(std::size_t trials, std::function<outcome_kind(std::size_t)> kind_of) {
  auto held = std::make_shared<std::optional<std::size_t>>();
  return [=](fake_backend& b, const sw::trial& t) {
    if (*held) b.end(**held, kind_of(**held), json{{"acc", 0.5}});
    *held = t.index;
    if (t.index + 1 == trials) {
      *held = std::nullopt;
      b.end(t.index, kind_of(t.index), json{{"acc", 0.5}});
    }
  };
}

}  // namespace

TEST_CASE("scheduler: keeps every lane busy, never more, and journals every trial once", "[scheduler]") {
  const auto s = spec_of(6);
  fake_backend backend(
      2, overlapping(6, [](std::size_t i) { return i == 2 ? outcome_kind::crashed : outcome_kind::success; }));
  const ran r = run_sweep(s, backend);
  CHECK(backend.peak == 2);
  CHECK(backend.starts.size() == 6);
  CHECK(backend.finished);
  REQUIRE(r.journal.size() == 6);
  CHECK(r.journal_lines == 6);
  CHECK(r.of(s, 2)->kind == outcome_kind::crashed);  // not fail-fast: the others still run
  CHECK(r.of(s, 5)->kind == outcome_kind::success);
  CHECK(r.cancelled == 0);
  CHECK_FALSE(r.error);
}

TEST_CASE("scheduler: a source still making a trial is waited for, though nothing runs", "[scheduler][source]") {
  const auto s = spec_of(5);
  std::vector<sw::new_trial> trials;
  for (std::size_t i = 0; i < s.trials.size(); ++i)
    trials.push_back({i, sw::trial_id(s.task, s.trials[i]), s.trials[i]});
  thinking_source source(std::move(trials));
  fake_backend backend(1, [](fake_backend& b, const sw::trial& t) {
    b.end(t.index, outcome_kind::success, json{{"acc", 1}});
  });
  const ran r = run_sweep(s, backend, {}, nullptr, &source);
  CHECK(r.journal_lines == 5);  // each came after next() had given nothing
  CHECK(source.exhausted());
}

TEST_CASE("scheduler: fail-fast cancels what runs and starts nothing more", "[scheduler]") {
  auto s = spec_of(6);
  s.fail_fast = true;
  // Trial 2 crashes as trial 3 starts: 3 is running then, 4 and 5 are queued.
  fake_backend backend(
      2, overlapping(6, [](std::size_t i) { return i == 2 ? outcome_kind::crashed : outcome_kind::success; }));
  const ran r = run_sweep(s, backend);
  CHECK(backend.starts == std::vector<std::pair<std::size_t, int>>{{0, 1}, {1, 1}, {2, 1}, {3, 1}});
  CHECK(backend.cancel_calls >= 1);
  CHECK(r.cancelled == 1);  // trial 3
  REQUIRE(r.journal.size() == 3);
  CHECK(r.of(s, 2)->kind == outcome_kind::crashed);
  CHECK_FALSE(r.of(s, 3));  // cancelled: not journaled, so a resume runs it
  CHECK_FALSE(r.of(s, 4));
}

TEST_CASE("scheduler: retries follow the outcome class and count attempts", "[scheduler][retries]") {
  auto s = spec_of(4);
  s.retries = {{"crashed", 2}, {"timeout", 1}};
  // 0: crashes twice, then succeeds; 1: always crashes; 2: an invalid result (not retried);
  // 3: always times out.
  fake_backend backend(1, [](fake_backend& b, const sw::trial& t) {
    switch (t.index) {
      case 0: b.end(0, t.attempt < 3 ? outcome_kind::crashed : outcome_kind::success, json{{"acc", 1}}); break;
      case 1: b.end(1, outcome_kind::crashed); break;
      case 2: b.end(2, outcome_kind::invalid_result); break;
      default: b.end(3, outcome_kind::timeout); break;
    }
  });
  const ran r = run_sweep(s, backend);
  CHECK(backend.starts_of(0) == 3);
  CHECK(backend.starts_of(1) == 3);
  CHECK(backend.starts_of(2) == 1);
  CHECK(backend.starts_of(3) == 2);
  // A retry runs before the next trial: on the lane that just came free.
  CHECK(backend.starts[1] == std::pair<std::size_t, int>{0, 2});
  REQUIRE(r.journal.size() == 4);
  CHECK(r.journal_lines == 4);  // only final outcomes are journaled
  CHECK(r.of(s, 0)->kind == outcome_kind::success);
  CHECK(r.of(s, 0)->attempts == 3);
  CHECK(r.of(s, 1)->kind == outcome_kind::crashed);
  CHECK(r.of(s, 1)->attempts == 3);
  CHECK(r.of(s, 2)->attempts == 1);
  CHECK(r.of(s, 3)->attempts == 2);
}

TEST_CASE(
    "scheduler: out of memory is retried at factor x the cap up to max, every attempt journaled, other retries "
    "kept",
    "[scheduler][retries][oom-retry]") {
  auto s = oom_retry_spec_of(3, 2, 3 * GiB);
  s.retries = {{"crashed", 1}};
  s.fail_fast = true;  // an attempt retried at a larger cap is no failure
  // 0 needs 1.5 GiB; 1 needs 1.5 GiB and crashes once at 2 GiB; 2 needs 10 GiB.
  std::vector<std::tuple<std::size_t, int, std::uint64_t>> starts;  // (trial, attempt, cap)
  bool crashed = false;
  fake_backend backend(1, [&](fake_backend& b, const sw::trial& t) {
    starts.emplace_back(t.index, t.attempt, t.mem_limit);
    const std::uint64_t cap = t.mem_limit ? t.mem_limit : s.mem_limit;
    const std::uint64_t needs = t.index == 2 ? 10 * GiB : 3 * GiB / 2;
    if (cap < needs) b.end(t.index, outcome_kind::out_of_memory);
    else if (t.index == 1 && !std::exchange(crashed, true)) b.end(t.index, outcome_kind::crashed);
    else b.end(t.index, outcome_kind::success, json{{"acc", 1}});
  });
  const ran r = run_sweep(s, backend);
  using start = std::tuple<std::size_t, int, std::uint64_t>;
  CHECK(starts == std::vector<start>{{0, 1, 0},
                                     {0, 2, 2 * GiB},  // 1 GiB, then 2
                                     {1, 1, 0},
                                     {1, 2, 2 * GiB},
                                     {1, 3, 2 * GiB},  // the crash: same cap
                                     {2, 1, 0},
                                     {2, 2, 2 * GiB},
                                     {2, 3, 3 * GiB}});  // the last at max
  CHECK_FALSE(r.error);
  // Journaled: each out-of-memory attempt that was retried (with its cap and the next), and each end.
  CHECK(r.journal_lines == 7);
  CHECK(r.of(s, 0)->kind == outcome_kind::success);
  CHECK(r.of(s, 0)->attempts == 2);
  CHECK(r.of(s, 0)->mem_limit == 2 * GiB);
  CHECK(r.of(s, 1)->kind == outcome_kind::success);
  CHECK(r.of(s, 1)->attempts == 3);
  CHECK(r.of(s, 2)->kind == outcome_kind::out_of_memory);  // failed at max: out of memory, as without retries
  CHECK(r.of(s, 2)->attempts == 3);
  CHECK(r.of(s, 2)->mem_limit == 3 * GiB);
  CHECK(sw::final_record(*r.of(s, 2)));
}

TEST_CASE("scheduler: out-of-memory retries journal the attempt, and a trial resumed there starts at its larger cap",
          "[scheduler][retries][oom-retry]") {
  auto s = oom_retry_spec_of(2, 4, 16 * GiB);
  fake_backend backend(1, [&](fake_backend& b, const sw::trial& t) { b.end(t.index, outcome_kind::out_of_memory); });
  const ran r = run_sweep(s, backend);
  // 1 -> 4 -> 16 GiB, each attempt journaled.
  CHECK(r.journal_lines == 6);
  CHECK(r.of(s, 0)->mem_limit == 16 * GiB);
  // A resumed trial starts at the attempt and cap its last journaled attempt named.
  std::vector<std::pair<int, std::uint64_t>> starts;
  fake_backend resumed(1, [&](fake_backend& b, const sw::trial& t) {
    if (t.index == 0) starts.emplace_back(t.attempt, t.mem_limit);
    b.end(t.index, outcome_kind::success, json{{"acc", 1}});
  });
  sw::scheduler_options options;
  const std::string id = sw::trial_id(s.task, s.trials[0]);
  options.resumed[id] = {.index = 0, .id = id, .attempt = 2, .mem_limit = 4 * GiB, .oom_retries = 1};
  const ran again = run_sweep(s, resumed, std::move(options));
  CHECK(starts == std::vector<std::pair<int, std::uint64_t>>{{2, 4 * GiB}});
  CHECK(again.of(s, 0)->attempts == 2);
  CHECK(again.of(s, 0)->mem_limit == 4 * GiB);
}

TEST_CASE("scheduler: an attempt out of memory as the sweep stops is journaled for its retry and counted cancelled",
          "[scheduler][retries][oom-retry]") {
  auto s = oom_retry_spec_of(2, 2, 4 * GiB);
  s.fail_fast = true;
  // 0 runs; 1 fails, which stops the sweep; 0 runs out of memory as it is being stopped.
  fake_backend backend(2, [](fake_backend& b, const sw::trial& t) {
    if (t.index == 1) b.end(1, outcome_kind::task_error);
  });
  backend.cancel_ends_as = outcome_kind::out_of_memory;
  const ran r = run_sweep(s, backend);
  CHECK(backend.starts == std::vector<std::pair<std::size_t, int>>{{0, 1}, {1, 1}});  // no retry started
  CHECK(r.cancelled == 1);  // trial 0: neither done nor failed in this run
  REQUIRE(r.of(s, 0));
  CHECK(r.of(s, 0)->retry_mem_limit == 2 * GiB);  // a resume goes on at the larger cap
  CHECK_FALSE(sw::final_record(*r.of(s, 0)));
}

TEST_CASE("scheduler: with fail-fast, an attempt that will be retried does not stop the sweep",
          "[scheduler][retries]") {
  auto s = spec_of(3);
  s.fail_fast = true;
  s.retries = {{"crashed", 1}};
  fake_backend backend(1, [](fake_backend& b, const sw::trial& t) {
    b.end(t.index, t.index == 0 && t.attempt == 1 ? outcome_kind::crashed : outcome_kind::success, json{{"acc", 1}});
  });
  const ran r = run_sweep(s, backend);
  CHECK(backend.cancel_calls == 0);
  CHECK(r.journal.size() == 3);
  CHECK(r.of(s, 0)->attempts == 2);
}

TEST_CASE("scheduler: a first result without the metric stops the sweep, saying why", "[scheduler][metric]") {
  auto s = spec_of(5);
  s.metric.name = "acc";
  SECTION("the result type was not known up front: the first success decides") {
    fake_backend backend(2, [](fake_backend& b, const sw::trial& t) {
      if (t.index == 1) b.end(0, outcome_kind::success, json{{"loss", 0.25}});  // 0 ends while 1 runs
    });
    const ran r = run_sweep(s, backend);
    CHECK_THAT(r.metric_error, Catch::Contains("acc"));
    CHECK(backend.starts.size() == 2);  // nothing after the check failed
    CHECK(r.cancelled == 1);            // trial 1
    CHECK(r.journal.size() == 1);       // the result that decided is kept
  }
  SECTION("a result that has it: the sweep goes on") {
    fake_backend backend(2, [](fake_backend& b, const sw::trial& t) {
      b.end(t.index, outcome_kind::success, json{{"acc", 0.9}});
    });
    const ran r = run_sweep(s, backend);
    CHECK(r.metric_error.empty());
    CHECK(r.journal.size() == 5);
  }
}

TEST_CASE("scheduler: a stop request mid-sweep cancels running trials, starts no queued one, keeps the journal whole",
          "[scheduler][signals]") {
  const auto s = spec_of(6);
  // 0 and 1 end at once; 2 and 3 keep running, and trial 2's start is when Ctrl-C comes.
  fake_backend backend(2, [](fake_backend& b, const sw::trial& t) {
    if (t.index < 2) b.end(t.index, outcome_kind::success, json{{"acc", 1}});
    if (t.index == 2) sw::request_stop();
  });
  const ran r = run_sweep(s, backend);
  CHECK(r.stop_requests == 1);
  CHECK(backend.starts == std::vector<std::pair<std::size_t, int>>{{0, 1}, {1, 1}, {2, 1}, {3, 1}});
  CHECK(backend.cancel_calls >= 1);
  CHECK(r.cancelled == 2);
  CHECK(r.journal_warnings.empty());
  CHECK(r.journal_lines == 2);
  REQUIRE(r.journal.size() == 2);
  CHECK(r.of(s, 0));
  CHECK(r.of(s, 1));
}

TEST_CASE("scheduler: a stop requested while the sweep is set up, before its stop source exists, stands",
          "[scheduler][signals]") {
  // A Ctrl-C between the CLI's handler and the sweep's start: nothing starts, and the sweep
  // ends as stopped; the next sweep in the process starts with no request.
  const auto s = spec_of(3);
  fake_backend backend(2, [](fake_backend& b, const sw::trial& t) {
    b.end(t.index, outcome_kind::success, json{{"acc", 1}});
  });
  sw::request_stop();
  const ran r = run_sweep(s, backend);
  CHECK(r.stop_requests == 1);
  CHECK(backend.starts.empty());
  CHECK(r.journal_lines == 0);
  fake_backend next(2, [](fake_backend& b, const sw::trial& t) {
    b.end(t.index, outcome_kind::success, json{{"acc", 1}});
  });
  const ran again = run_sweep(s, next);
  CHECK(again.stop_requests == 0);
  CHECK(again.journal_lines == 3);
}

TEST_CASE("scheduler: reports reach an early-stopping rule, which prunes that trial only",
          "[scheduler][early-stopping]") {
  auto s = spec_of(3);
  s.retries["task_error"] = 3;  // (the fake ends a stopped attempt as cancelled; a pruned trial is never retried)
  std::vector<std::int64_t> steps;
  sw::scheduler_options o;
  o.should_stop = [&](const sw::trial&, std::int64_t step, const json& m) {
    steps.push_back(step);
    return m.value("loss", 0.0) > 1.0;
  };
  fake_backend backend(1, [](fake_backend& b, const sw::trial& t) {
    b.report(t, 4, {{"loss", 0.9}});
    b.report(t, 10, {{"loss", t.index == 1 ? 5.0 : 0.5}});
    b.report(t, 11, {{"loss", 0.1}});                            // (not judged for a stopped trial)
    b.end(t.index, outcome_kind::success, json{{"loss", 0.1}});  // (a no-op for a stopped trial)
  });
  const ran r = run_sweep(s, backend, o);
  CHECK(steps == std::vector<std::int64_t>{4, 10, 11, 4, 10, 4, 10, 11});
  CHECK(backend.stopped == std::vector<std::size_t>{1});
  CHECK(backend.starts_of(1) == 1);
  CHECK(r.cancelled == 0);  // pruned is an outcome of its own, journaled
  REQUIRE(r.journal.size() == 3);
  const auto pruned = r.of(s, 1);
  REQUIRE(pruned);
  CHECK(pruned->pruned);
  CHECK(pruned->step == 10);
  CHECK(pruned->result == json{{"loss", 5.0}});  // its last report
  CHECK(sw::outcome_name(*pruned) == "pruned");
  CHECK(sw::done_well(*pruned));
  CHECK(r.of(s, 0)->kind == outcome_kind::success);
  CHECK_FALSE(r.of(s, 0)->pruned);
  CHECK(r.of(s, 0)->step == 11);  // the step each trial reached
}

TEST_CASE("scheduler: a pruned trial that ends cleanly (it asked should_stop()) is pruned, keeping what it returned",
          "[scheduler][early-stopping]") {
  const auto s = spec_of(1);
  sw::scheduler_options o;
  o.should_stop = [&](const sw::trial&, std::int64_t, const json&) { return true; };
  fake_backend backend(1, [](fake_backend& b, const sw::trial& t) { b.report(t, 3, {{"loss", 2}}); });
  backend.stop_ends_as = outcome_kind::success;  // it returned when told to stop
  backend.stop_result = {{"loss", 1.5}};
  const ran r = run_sweep(s, backend, o);
  REQUIRE(r.of(s, 0));
  CHECK(r.of(s, 0)->pruned);
  CHECK(r.of(s, 0)->step == 3);
  CHECK(r.of(s, 0)->result == json{{"loss", 1.5}});
}

TEST_CASE("scheduler: a record that says a later step than the reports that reached the scheduler keeps it",
          "[scheduler][early-stopping]") {
  // A Slurm node's record can arrive before its trial's last reports: the node saw step 27, the
  // submitter's scheduler step 26. The record's own step and result stand.
  const auto s = spec_of(2);
  sw::scheduler_options o;
  o.should_stop = [&](const sw::trial&, std::int64_t, const json&) { return false; };
  fake_backend backend(1, [](fake_backend& b, const sw::trial& t) {
    b.report(t, 26, {{"loss", 0.2}});
    if (t.index == 0) b.end(t.index, outcome_kind::success, json{{"loss", 0.1}}, 27);
    else b.end(t.index, outcome_kind::success, json{{"loss", 0.1}});  // says no step: the last report's
  });
  const ran r = run_sweep(s, backend, o);
  REQUIRE(r.of(s, 0));
  CHECK(r.of(s, 0)->step == 27);
  CHECK(r.of(s, 0)->result == json{{"loss", 0.1}});
  REQUIRE(r.of(s, 1));
  CHECK(r.of(s, 1)->step == 26);
}

TEST_CASE("scheduler: a trial that succeeds before the stop decision lands stays a success",
          "[scheduler][early-stopping]") {
  const auto s = spec_of(1);
  sw::scheduler_options o;
  fake_backend* b_ptr = nullptr;
  o.should_stop = [&](const sw::trial& t, std::int64_t, const json&) {
    b_ptr->end(t.index, outcome_kind::success, json{{"loss", 2}});  // it ended as the decision was made
    return true;
  };
  fake_backend backend(1, [](fake_backend& b, const sw::trial& t) { b.report(t, 1, {{"loss", 2}}); });
  b_ptr = &backend;
  const ran r = run_sweep(s, backend, o);
  REQUIRE(r.of(s, 0));
  CHECK(r.of(s, 0)->kind == outcome_kind::success);
  CHECK_FALSE(r.of(s, 0)->pruned);
  CHECK(backend.stopped.empty());  // nothing left to stop
}

TEST_CASE("scheduler: a report the rule cannot use stops the sweep, naming the trial", "[scheduler][early-stopping]") {
  const auto s = spec_of(4);
  sw::scheduler_options o;
  o.should_stop = [&](const sw::trial& t, std::int64_t, const json& m) -> bool {
    if (!m.contains("loss")) throw sw::spec_error("trial " + t.id + " reported no loss", 0);
    return false;
  };
  fake_backend backend(1, [](fake_backend& b, const sw::trial& t) {
    b.report(t, 1, t.index == 1 ? json{{"acc", 1}} : json{{"loss", 1}});
    b.end(t.index, outcome_kind::success, json{{"loss", 1}});
  });
  const ran r = run_sweep(s, backend, o);
  CHECK(r.metric_error.find("trial " + sw::trial_id(s.task, s.trials[1]) + " reported no loss") != std::string::npos);
  CHECK(backend.starts.size() == 2);  // nothing started after it
  CHECK(r.journal.size() == 1);       // the trial before it; the one that reported is cancelled
}

TEST_CASE("scheduler: trials the backend already runs are not started again", "[scheduler]") {
  const auto s = spec_of(3);
  fake_backend backend(4, [](fake_backend& b, const sw::trial& t) {
    b.end(t.index, outcome_kind::success, json{{"acc", 1}});
    if (t.index == 2) b.end(1, outcome_kind::success, json{{"acc", 2}});  // the followed one ends
  });
  backend.adopted = {{1, sw::trial_id(s.task, s.trials[1]), 1}};
  const ran r = run_sweep(s, backend);
  CHECK(backend.starts == std::vector<std::pair<std::size_t, int>>{{0, 1}, {2, 1}});
  CHECK(r.journal.size() == 3);
}

TEST_CASE("scheduler: a journal that cannot be written stops the sweep with its error", "[scheduler]") {
  const auto s = spec_of(4);
  failing_store store;
  fake_backend backend(1, [](fake_backend& b, const sw::trial& t) {
    b.end(t.index, outcome_kind::success, json{{"acc", 1}});
  });
  const ran r = run_sweep(s, backend, {}, &store);
  REQUIRE(r.error);
  CHECK_THROWS_WITH(std::rethrow_exception(r.error), "disk full");
  CHECK(r.journal.empty());
}
