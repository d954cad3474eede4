// A sweep whose trials come from a source that adds trials while the sweep runs (what
// model-based search, population-based training and Hyperband's brackets are built on): every
// trial is journaled once with its parameters, a resumed sweep replays the journal to the
// source and runs only what is left, and results.csv and the report show the added trials.
#include <catch2/catch.hpp>

#include "isorun/sweep/trial_source.hpp"
#include "sweep_test_support.hpp"

namespace {

// The spec's trials, and for each of them that succeeds a child trial (i + 10) of its own: the
// source learns from results, and its trials' numbers follow from them alone, so that a resumed
// sweep's source, told the journal, makes the same ones.
class children_source final : public sw::trial_source {
 public:
  children_source(std::unique_ptr<sw::list_source> listed, std::string subject, int stop_after)
      : listed_{std::move(listed)}, subject_{std::move(subject)}, stop_after_{stop_after} {}

  std::optional<sw::new_trial> next() override {
    if (!children_.empty()) {
      sw::new_trial t = std::move(children_.front());
      children_.pop_front();
      return t;
    }
    return listed_->next();
  }
  bool exhausted() const override { return children_.empty() && listed_->exhausted(); }
  void tell(const sw::trial_record& r) override {
    ++told_;
    const int i = r.params.at("i").get<int>();
    if (r.kind == isorun::outcome_kind::success && i < 10) {
      json params = r.params;
      params["i"] = i + 10;
      children_.push_back({static_cast<std::size_t>(1000 + i), sw::trial_id(subject_, params), params});
    }
    if (stop_after_ > 0 && told_ == stop_after_) sw::request_stop();  // as Ctrl-C, from within the sweep
  }

 private:
  std::unique_ptr<sw::list_source> listed_;
  std::deque<sw::new_trial> children_;
  std::string subject_;
  int stop_after_;
  int told_ = 0;
};

sw::sweep_summary run_with_children(const sw::sweep_spec& s, int stop_after = 0) {
  sw::sweep_options ro;
  ro.task_libraries = {SWEEP_TEST_TASKS};
  ro.progress = false;
  ro.source_name = "children";
  ro.source = [&](std::unique_ptr<sw::list_source> listed) {
    return std::make_unique<children_source>(std::move(listed), s.task, stop_after);
  };
  return sw::sweep_run(s, sw::plan_slots(s, {}).slots, ro).run();
}

std::map<std::string, int> completions(const std::string& log) {
  std::map<std::string, int> n;
  for (const auto& l : lines(log)) ++n[l];
  return n;
}

}  // namespace

TEST_CASE("a source that adds trials as results come: each journaled once, in results.csv and the report",
          "[sweep][source]") {
  load_test_tasks();
  const std::string dir = temp_dir(), log = dir + "/completed";
  const auto s = sw::parse_spec(step_spec(3, log, dir + "/out"), "t.yaml");
  const auto summary = run_with_children(s);
  CHECK(summary.succeeded == 6);  // 0, 1, 2 and their children 10, 11, 12
  const auto journal = lines(dir + "/out/results.jsonl");
  REQUIRE(journal.size() == 6);
  std::set<int> is;
  for (const auto& l : journal) is.insert(json::parse(l)["params"]["i"].get<int>());
  CHECK(is == std::set<int>{0, 1, 2, 10, 11, 12});
  CHECK(completions(log) == std::map<std::string, int>{{"0", 1}, {"1", 1}, {"2", 1}, {"10", 1}, {"11", 1}, {"12", 1}});
  REQUIRE(summary.records.size() == 6);  // the spec's trials first, then the added ones
  CHECK(summary.records[3].params["i"] == 10);
  CHECK(lines(dir + "/out/results.csv").size() == 7);
  std::ifstream report(dir + "/out/report.html");
  const std::string html((std::istreambuf_iterator<char>(report)), std::istreambuf_iterator<char>());
  for (const auto& l : journal) CHECK(html.find(json::parse(l)["id"].get<std::string>()) != std::string::npos);

  // Run again: the source is told the journal, makes the same trials, and none runs again.
  const auto again = run_with_children(s);
  CHECK(again.succeeded == 0);
  CHECK(lines(dir + "/out/results.jsonl").size() == 6);
  CHECK(completions(log).size() == 6);
  CHECK(again.records.size() == 6);
  // Another source is another sweep: refused, the folder untouched.
  sw::sweep_options other;
  other.task_libraries = {SWEEP_TEST_TASKS};
  other.progress = false;
  CHECK_THROWS_WITH(sw::sweep_run(s, sw::plan_slots(s, {}).slots, other), Catch::Contains("holds a different sweep"));
  fs::remove_all(dir);
}

TEST_CASE("a sweep with a source stopped half way resumes where it stopped: nothing lost, nothing run twice",
          "[sweep][source][resume]") {
  load_test_tasks();
  const std::string dir = temp_dir(), log = dir + "/completed";
  const auto s = sw::parse_spec(step_spec(3, log, dir + "/out"), "t.yaml");
  // Ctrl-C once the first trial has ended: its child was made, and never ran. Only the source,
  // told that trial's record again, can make it: the resumed sweep must run it.
  const auto stopped = run_with_children(s, 1);
  CHECK(stopped.interrupted);
  CHECK(lines(dir + "/out/results.jsonl").size() == 1);
  const auto resumed = run_with_children(s);
  CHECK(resumed.succeeded == 5);
  CHECK(lines(dir + "/out/results.jsonl").size() == 6);
  for (const auto& [i, n] : completions(log)) CHECK(n == 1);
  CHECK(completions(log).size() == 6);
  fs::remove_all(dir);
}

TEST_CASE("a source that throws stops the sweep with its error, what ended journaled", "[sweep][source]") {
  load_test_tasks();
  const std::string dir = temp_dir();
  const auto s = sw::parse_spec(step_spec(3, "", dir + "/out"), "t.yaml");
  struct broken final : sw::trial_source {
    std::unique_ptr<sw::list_source> listed;
    int given = 0;
    std::optional<sw::new_trial> next() override {
      if (given++ == 1) throw std::runtime_error("the source broke");
      return listed->next();
    }
    bool exhausted() const override { return false; }
    void tell(const sw::trial_record&) override {}
  };
  sw::sweep_options ro;
  ro.task_libraries = {SWEEP_TEST_TASKS};
  ro.progress = false;
  ro.source_name = "broken";
  ro.source = [](std::unique_ptr<sw::list_source> listed) {
    auto b = std::make_unique<broken>();
    b->listed = std::move(listed);
    return b;
  };
  CHECK_THROWS_WITH(sw::sweep_run(s, sw::plan_slots(s, {}).slots, ro).run(), Catch::Contains("the source broke"));
  CHECK(lines(dir + "/out/results.jsonl").size() == 1);  // the first trial ended and was journaled
  fs::remove_all(dir);
}
