// The folder a sweep's submitter shares with the nodes that run its trials, as a second cluster
// backend would use it: "nodes" are threads that run each trial through the node's half of
// remote_folder (reports, the verdict, the record), and the backend follows them through the
// submitter's half, as the Slurm backend does. Everything between the two goes through files.
#include <catch2/catch.hpp>

#include <stdlib.h>

#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "isorun/sweep/journal.hpp"
#include "isorun/sweep/journal_writer.hpp"
#include "isorun/sweep/remote_folder.hpp"
#include "isorun/sweep/report_lines.hpp"
#include "isorun/sweep/scheduler.hpp"
#include "isorun/sweep/stop_source.hpp"
#include "isorun/sweep/trial_backend.hpp"

namespace fs = std::filesystem;
namespace sw = isorun::sweep;
using isorun::outcome_kind;
using nlohmann::json;

namespace {

constexpr std::int64_t steps = 3;

class folder_backend final : public sw::trial_backend {
 public:
  explicit folder_backend(const fs::path& out) : out_{out}, folder_{out, "cluster"} { folder_.create(); }
  ~folder_backend() override { finish(); }

  [[nodiscard]] std::size_t lanes() const override { return 4; }
  std::vector<sw::trial> begin(sw::trial_sink& sink) override {
    sink_ = &sink;
    poller_ = std::thread([this] { poll(); });
    return {};
  }
  void start(std::vector<sw::trial> batch) override {
    {
      std::lock_guard lock(mutex_);
      for (const auto& t : batch) {
        folder_.start_afresh(t.id);
        running_[t.id] = t;
        offset_[t.id] = 0;
      }
      nodes_.emplace_back([this, batch] {
        for (const auto& t : batch) run_on_node(t);
      });
    }
    changed_.notify_all();
  }
  void stop(const sw::trial& t) override {
    folder_.stop(t.id);
    changed_.notify_all();
  }
  void cancel_all() override {}
  void finish() override {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    changed_.notify_all();
    if (poller_.joinable()) poller_.join();
    for (auto& n : nodes_) n.join();
    nodes_.clear();
  }

 private:
  // A node: reports each step, waits until the submitter has judged it, and stops at a verdict.
  void run_on_node(const sw::trial& t) {
    const sw::remote_folder node(out_, "cluster");  // the node's own view of the folder
    std::int64_t step = 1;
    bool stopped = false;
    for (; step <= steps && !stopped; ++step) {
      node.report(t.id, step, {{"loss", 1.0 / static_cast<double>(step)}, {"x", t.index}});
      announce();
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] { return judged_[t.id] >= step; });
      stopped = node.stop_requested(t.id);
    }
    sw::trial_record rec;
    rec.id = t.id;
    rec.params = {{"x", t.index}};
    rec.kind = stopped ? outcome_kind::cancelled : outcome_kind::success;
    rec.result = {{"loss", 1.0 / static_cast<double>(step - 1)}};
    rec.attempts = t.attempt;
    node.records_store()->write({rec});
    announce();
  }

  // Wakes the poller after a file was written. Under the mutex: the poller checks the files under
  // it and then waits, so a notify without it could come between its check and its wait, and be
  // lost (the poller asleep, the node waiting for a verdict on what it never read).
  void announce() {
    std::lock_guard lock(mutex_);
    changed_.notify_all();
  }

  // The submitter's half: reports first, then records, each time something may have changed.
  void poll() {
    for (;;) {
      std::map<std::string, sw::trial> running;
      {
        std::unique_lock lock(mutex_);
        if (done_) return;
        running = running_;
      }
      for (const auto& [id, t] : running) {
        std::uint64_t at;
        {
          std::lock_guard lock(mutex_);
          at = offset_[id];
        }
        std::int64_t last = 0;
        for (auto& [step, metrics] : folder_.reports_since(id, at).reports) {
          sink_->on_report(t, step, metrics);
          last = step;
        }
        std::lock_guard lock(mutex_);
        offset_[id] = at;
        if (last) judged_[id] = last;
      }
      changed_.notify_all();
      for (auto& [file, rec] : folder_.records()) {
        sw::trial t;
        {
          std::lock_guard lock(mutex_);
          const auto it = running_.find(rec.id);
          if (it == running_.end()) continue;
          t = it->second;
          running_.erase(it);
        }
        folder_.remove_record(file);
        sink_->on_finished({{t, std::move(rec)}});
      }
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] { return done_ || pending_news(); });
    }
  }
  // Under mutex_: a running trial wrote a report not yet read, or its record.
  bool pending_news() {
    for (const auto& [id, t] : running_) {
      std::error_code ec;
      const auto size = fs::file_size(folder_.dir() / "reports" / (id + ".jsonl"), ec);
      if ((!ec && size > offset_[id]) || folder_.has_record(id)) return true;
    }
    return false;
  }

  fs::path out_;
  sw::remote_folder folder_;
  sw::trial_sink* sink_ = nullptr;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, sw::trial> running_;
  std::map<std::string, std::uint64_t> offset_;
  std::map<std::string, std::int64_t> judged_;
  bool done_ = false;
  std::thread poller_;
  std::vector<std::thread> nodes_;
};

}  // namespace

TEST_CASE(
    "a second cluster backend over remote_folder: reports in order, a verdict that stops one trial, every "
    "record journaled once",
    "[scheduler][remote-folder]") {
  char dir[] = "/tmp/isorun-remote-folder-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  const fs::path out = dir;
  sw::sweep_spec s;
  s.task = "fake";
  for (int i = 0; i < 6; ++i) s.trials.push_back({{"x", i}});
  std::map<std::string, std::vector<std::int64_t>> seen;  // the steps each trial's reports came at
  std::mutex seen_mutex;
  {
    folder_backend backend(out);
    sw::journal j{out};
    sw::journal_store store(j);
    sw::stop_source stop;
    sw::scheduler* sched_ptr = nullptr;
    sw::journal_writer writer(
        store, [](const sw::trial_record&) {}, [&](std::exception_ptr e) { sched_ptr->fail(std::move(e)); });
    std::vector<sw::new_trial> trials;
    for (std::size_t i = 0; i < 6; ++i) trials.push_back({i, sw::trial_id(s.task, s.trials[i]), s.trials[i]});
    sw::list_source source(std::move(trials));
    sw::scheduler sched(s, source, backend, writer, stop,
                        {.should_stop = [&](const sw::trial& t, std::int64_t step, const json& metrics) {
                          std::lock_guard lock(seen_mutex);
                          seen[t.id].push_back(step);
                          return metrics["x"] == 2 && step == 2;  // the verdict for trial 2, at step 2
                        }});
    sched_ptr = &sched;
    sched.run();
    writer.close();
    REQUIRE_FALSE(sched.error());
  }
  const auto journal = sw::journal{out}.latest();
  REQUIRE(journal.size() == 6);
  for (int i = 0; i < 6; ++i) {
    INFO("trial " << i);
    const std::string id = sw::trial_id(s.task, s.trials[static_cast<std::size_t>(i)]);
    const auto& rec = journal.at(id);
    if (i == 2) {
      CHECK(rec.pruned);
      CHECK(rec.step == 2);
      CHECK(seen[id] == std::vector<std::int64_t>{1, 2});
      CHECK(fs::exists(out / "cluster" / "stop" / id));
    } else {
      CHECK(rec.kind == outcome_kind::success);
      CHECK(rec.step == steps);
      CHECK(seen[id] == std::vector<std::int64_t>{1, 2, 3});
      CHECK_FALSE(fs::exists(out / "cluster" / "stop" / id));
    }
  }
  CHECK(fs::is_empty(out / "cluster" / "results"));  // each record taken once, then removed
  fs::remove_all(out);
}

TEST_CASE("remote_folder: what is not a record or a report is skipped, never followed through a link",
          "[scheduler][remote-folder][hostile]") {
  char dir[] = "/tmp/isorun-remote-folder-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  const fs::path out = dir;
  const sw::remote_folder folder(out, "cluster");
  folder.create();
  folder.report("t1", 1, {{"loss", 0.5}});
  {
    std::ofstream(folder.dir() / "reports" / "t1.jsonl", std::ios::app) << "not json\n{\"step\": 2, \"metrics\": {\"lo";
  }
  std::uint64_t at = 0;
  auto reports = folder.reports_since("t1", at).reports;
  REQUIRE(reports.size() == 1);  // the junk line skipped, the line still being written left
  CHECK(reports[0].first == 1);
  std::ofstream(folder.dir() / "reports" / "t1.jsonl", std::ios::app) << "ss\": 0.4}}\n";
  reports = folder.reports_since("t1", at).reports;
  REQUIRE(reports.size() == 1);
  CHECK(reports[0].first == 2);
  // A checkpoint's line is told apart from a report's; one with more in it is neither.
  folder.checkpoint("t1", 10);
  std::ofstream(folder.dir() / "reports" / "t1.jsonl", std::ios::app) << "{\"checkpoint\": 20, \"step\": 3}\n";
  folder.report("t1", 3, {{"loss", 0.3}});
  const auto read = folder.reports_since("t1", at);
  CHECK(read.checkpoints == std::vector<std::int64_t>{10});
  REQUIRE(read.reports.size() == 1);
  CHECK(read.reports[0].first == 3);
  // Records: a junk file goes, a link goes, a record stays.
  sw::trial_record rec;
  rec.id = "t1";
  rec.params = {{"x", 1}};
  rec.kind = outcome_kind::success;
  folder.records_store()->write({rec});
  std::ofstream(folder.dir() / "results" / "junk.json") << "{";
  std::ofstream(out / "elsewhere.json") << rec.to_line();
  fs::create_symlink(out / "elsewhere.json", folder.dir() / "results" / "t2.json");
  const auto found = folder.records();
  REQUIRE(found.size() == 1);
  CHECK(found[0].record.id == "t1");
  CHECK_FALSE(fs::exists(folder.dir() / "results" / "junk.json"));
  CHECK_FALSE(fs::is_symlink(folder.dir() / "results" / "t2.json"));
  CHECK(fs::exists(out / "elsewhere.json"));  // the link went, not its target
  // A verdict is never written through a link.
  fs::create_symlink(out / "elsewhere.json", folder.dir() / "stop" / "t3");
  CHECK_THROWS(folder.stop("t3"));
  CHECK(folder.stop_requested("t1") == false);
  folder.stop("t1");
  CHECK(folder.stop_requested("t1"));
  CHECK(folder.error_record("77", 0) == folder.errors() / "77_0.json");
  fs::remove_all(out);
}

TEST_CASE(
    "remote_folder: a reports line longer than a report is skipped to its newline, a look at a time, never read "
    "again",
    "[scheduler][remote-folder][hostile]") {
  char dir[] = "/tmp/isorun-remote-folder-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  const fs::path out = dir;
  const sw::remote_folder folder(out, "cluster");
  folder.create();
  const fs::path file = folder.dir() / "reports" / "t1.jsonl";
  constexpr std::uint64_t look = sw::remote_folder::max_report_look;
  auto append = [&](const std::string& text) { std::ofstream(file, std::ios::app) << text; };
  auto steps = [](const sw::remote_folder::reports_read& read) {
    std::vector<std::int64_t> out;
    for (const auto& [step, metrics] : read.reports) out.push_back(step);
    return out;
  };

  SECTION("a sparse file with no newline: each look reads at most its bound, and moves past it") {
    folder.report("t1", 1, {{"loss", 0.5}});
    const std::uint64_t first = fs::file_size(file);
    // 16 looks' worth of zeros, no newline: a hole, as `truncate` makes it.
    fs::resize_file(file, first + 16 * look);
    std::uint64_t at = 0;
    auto read = folder.reports_since("t1", at);
    CHECK(steps(read) == std::vector<std::int64_t>{1});
    CHECK_THAT(read.skipped, Catch::Contains("t1.jsonl holds a line longer than 1 MiB"));
    CHECK(at == look);  // not left before the line, to be read again at every look
    int looks = 1;
    for (std::uint64_t before = 0; at != before; ++looks) {
      before = at;
      read = folder.reports_since("t1", at);
      CHECK(read.reports.empty());
      CHECK(at - before <= look);
    }
    CHECK(at == first + 16 * look);
    CHECK(looks == 18);  // the first, 16 more to the end, one that finds nothing new
    // The rest of that line, report-like as it may be, is skipped with it; the next lines are read.
    append(R"({"step": 99, "metrics": {"loss": 0.1}})"
           "\n");
    folder.report("t1", 2, {{"loss", 0.4}});
    read = folder.reports_since("t1", at);
    CHECK(steps(read) == std::vector<std::int64_t>{2});
    CHECK(at == fs::file_size(file));
  }
  SECTION("a long line that ends within a look: skipped and said so, the reports around it read") {
    folder.report("t1", 1, {{"loss", 0.5}});
    append(std::string(sw::report_lines::max_line + 1, 'x') + "\n");
    folder.report("t1", 2, {{"loss", 0.4}});
    append(R"({"step": 3, "metrics": {"lo)");  // still being written
    const std::uint64_t complete = fs::file_size(file) - std::string(R"({"step": 3, "metrics": {"lo)").size();
    std::uint64_t at = 0;
    auto read = folder.reports_since("t1", at);
    CHECK(steps(read) == std::vector<std::int64_t>{1, 2});
    CHECK_THAT(read.skipped, Catch::Contains("longer than 1 MiB"));
    CHECK(at == complete);  // the line being written waits, whole, for the next look
    append(R"(ss": 0.3}})"
           "\n");
    read = folder.reports_since("t1", at);
    CHECK(steps(read) == std::vector<std::int64_t>{3});
    CHECK(read.skipped.empty());
    CHECK(at == fs::file_size(file));
  }
  SECTION("a report line of the largest size is read, though a look ends inside it") {
    // Lines that fill a look but for the start of the next, which is whole only at the next look.
    const std::string pad = R"({"step": 1, "metrics": {"pad": ")";
    std::string line = pad + std::string(sw::report_lines::max_line - pad.size() - 3, 'p') + "\"}}";
    REQUIRE(line.size() == sw::report_lines::max_line);
    for (std::uint64_t n = 0; n + line.size() + 1 <= look; n += line.size() + 1) append(line + "\n");
    const std::uint64_t whole = fs::file_size(file);
    line[9] = '2';
    append(line + "\n");
    std::uint64_t at = 0;
    auto read = folder.reports_since("t1", at);
    CHECK(read.reports.size() == look / (line.size() + 1));
    CHECK(read.skipped.empty());
    CHECK(at == whole);
    read = folder.reports_since("t1", at);
    CHECK(steps(read) == std::vector<std::int64_t>{2});
    CHECK(at == fs::file_size(file));
  }
  fs::remove_all(out);
}
