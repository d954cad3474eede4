// Sweeps whose searcher chooses each trial from the results so far: isorun's searcher protocol
// against a scripted searcher (tests/helpers/searcher.py): asks, waits, done, a searcher that
// crashes, hangs or prints what is not an answer, resume that replays the conversation, and the
// specs that are refused.
#include <catch2/catch.hpp>

#include "isorun/runner/containment.hpp"
#include "sweep_test_support.hpp"

namespace {

// A sweep of command trials that print {"y": x * x}, each sleeping `sleep` s first, chosen by the
// scripted searcher in `mode`, which logs what it hears to `heard`.
std::string searched(const std::string& dir, int trials, const std::string& mode, const std::string& sleep = "0",
                     const std::string& more = "") {
  return "command: [sh, -c, 'sleep " + sleep +
         "; echo \"{\\\"y\\\": $(({x} * {x}))}\"']\n"
         "metric: {name: y, goal: minimize}\n"
         "search: {type: command, command: [python3, " +
         std::string(SEARCHER) + ", \"" + dir + "/heard\"" + (mode.empty() ? "" : ", \"" + mode + "\"") +
         "], params: [x], trials: " + std::to_string(trials) + more +
         "}\n"
         "resources: {cpu_slots: 2}\nout: \"" +
         dir + "/out\"\n";
}

std::vector<json> messages(const std::string& file) {
  std::vector<json> out;
  for (const auto& l : lines(file)) out.push_back(json::parse(l));
  return out;
}

std::vector<json> records_of(const std::string& dir) {
  std::vector<json> out;
  for (const auto& l : lines(dir + "/out/results.jsonl")) out.push_back(json::parse(l));
  return out;
}

// A sweep whose command trials write a result of `pad` bytes and more to $ISORUN_RESULT, chosen
// by the scripted searcher, which logs what it hears to DIR/heard.
std::string padded(const std::string& dir, int trials, std::size_t pad) {
  return "command: [python3, -c, \"import json, os, sys; x = int(sys.argv[1]); json.dump(dict(y=x * x, pad='p' * " +
         std::to_string(pad) +
         "), open(os.environ['ISORUN_RESULT'], 'w'), separators=(',', ':'))\", \"{x}\"]\n"
         "metric: {name: y, goal: minimize}\n"
         "search: {type: command, command: [python3, " +
         std::string(SEARCHER) + ", \"" + dir + "/heard\"], params: [x], trials: " + std::to_string(trials) +
         "}\nresources: {cpu_slots: 2}\nout: \"" + dir + "/out\"\n";
}

std::vector<json> heard_in_run(const std::string& dir, int run) {  // run 1, 2, ...: from its hello on
  std::vector<json> out;
  int hellos = 0;
  for (const auto& m : messages(dir + "/heard")) {
    if (!m.contains("op")) continue;  // (its own answers)
    hellos += m["op"] == "hello";
    if (hellos == run) out.push_back(m);
  }
  return out;
}

}  // namespace

TEST_CASE("a searcher is asked for each trial and told each result", "[sweep][search]") {
  const std::string dir = temp_dir();
  std::ofstream(dir + "/spec.yaml") << searched(dir, 6, "");
  const auto r = sweep_cli({"sweep", dir + "/spec.yaml", "--no-progress"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.err, Catch::Contains("up to 6 trials chosen by the searcher python3"));
  const auto records = records_of(dir);
  REQUIRE(records.size() == 6);
  std::set<int> xs;
  for (const auto& rec : records) {
    CHECK(rec["outcome"] == "success");
    const int x = rec["params"]["x"];
    xs.insert(x);
    CHECK(rec["result"]["y"] == x * x);
  }
  CHECK(xs == std::set<int>{0, 2, 4, 6, 8, 10});
  std::vector<json> heard;
  for (const auto& m : messages(dir + "/heard"))
    if (m.contains("op")) heard.push_back(m);  // (not its own answers)
  REQUIRE(!heard.empty());
  CHECK(heard[0]["op"] == "hello");
  CHECK(heard[0]["protocol"] == 1);
  CHECK(heard[0]["trials"] == 6);
  CHECK(heard[0]["slots"] == 2);
  CHECK(heard[0]["objectives"] == json::parse(R"([{"name": "y", "goal": "minimize"}])"));
  std::size_t asks = 0, tells = 0;
  for (const auto& m : heard) {
    asks += m["op"] == "ask";
    if (m["op"] != "tell") continue;
    ++tells;
    CHECK(m["outcome"] == "success");
    CHECK(m["values"] == json::array({m["params"]["x"].get<int>() * m["params"]["x"].get<int>()}));
  }
  CHECK(asks == 6);  // the budget: never asked for more
  CHECK(tells == 6);
  fs::remove_all(dir);
}

TEST_CASE("a searcher may answer wait (nothing now) and done (nothing more)", "[sweep][search]") {
  const std::string dir = temp_dir();
  SECTION("wait: one trial at a time on two slots") {
    std::ofstream(dir + "/spec.yaml") << searched(dir, 5, "serial");
    const auto r = sweep_cli({"sweep", dir + "/spec.yaml", "--no-progress"});
    INFO(r.err);
    REQUIRE(r.code == 0);
    CHECK(records_of(dir).size() == 5);
    int running = 0, most = 0, waits = 0;
    for (const auto& m : messages(dir + "/heard")) {
      if (m.value("op", "") == "tell") --running;
      if (!m.contains("answered")) continue;
      if (m["answered"].contains("params")) most = std::max(most, ++running);
      waits += m["answered"].contains("wait");
    }
    CHECK(most == 1);  // a trial at a time, though two slots were free
    CHECK(waits > 0);  // asked while one ran, it said wait, and was asked again after the tell
  }
  SECTION("done: the sweep ends with the trials it had") {
    std::ofstream(dir + "/spec.yaml") << searched(dir, 50, "done:3");
    const auto r = sweep_cli({"sweep", dir + "/spec.yaml", "--no-progress"});
    INFO(r.err);
    REQUIRE(r.code == 0);
    const auto n = records_of(dir).size();
    CHECK(n >= 3);
    CHECK(n <= 4);  // (a second slot's trial may have been proposed before the third tell)
  }
  fs::remove_all(dir);
}

TEST_CASE("a searcher that crashes, hangs or prints what is not an answer stops the sweep, saying so",
          "[sweep][search][hostile]") {
  const std::string dir = temp_dir();
  const auto [mode, said] = GENERATE(table<std::string, std::string>({
      {"crash:3", "exited (status 3) instead of answering ask"},
      {"hang:3", "did not answer ask within 1000 ms"},
      {"garbage:3", "answered ask with a line that is not a JSON object: proposing x now"},
      {"waitstr:3", "answered ask with {\"wait\":\"yes\"}, where \"wait\" takes true or false"},
      {"doneint:3", "answered ask with {\"done\":1}, where \"done\" takes true or false"},
      {"noparams:3", "proposed no parameter 'x', which search: params: declares"},
      {"exit", "exited (status 5) instead of answering hello"},
  }));
  INFO(mode);
  std::ofstream(dir + "/spec.yaml") << searched(dir, 6, mode, "0", ", timeout: 1s");
  const auto r = sweep_cli({"sweep", dir + "/spec.yaml", "--no-progress"});
  CHECK(r.code == 1);  // as docs/sweeps.md says: the searcher's failure, not isorun's (125)
  CHECK_THAT(r.err, Catch::Contains("isorun: error: the searcher (python3 " + std::string(SEARCHER)) &&
                        Catch::Contains(said) && Catch::Contains(dir + "/out/search.err"));
  // What ended before it is journaled, and stays.
  for (const auto& rec : records_of(dir)) CHECK(rec["outcome"] == "success");
  CHECK(records_of(dir).size() <= 3);
  fs::remove_all(dir);
}

TEST_CASE("a searcher's exit is seen though a descendant holds its stdout, and nothing it started outlives the sweep",
          "[sweep][search][hostile]") {
  const std::string dir = temp_dir();
  // Its descendant keeps the socket open: without a watch on the searcher itself the sweep would
  // wait the whole timeout for an answer, and fail saying it did not answer.
  std::ofstream(dir + "/spec.yaml") << searched(dir, 6, "orphan:3", "0", ", timeout: 1m");
  const auto r = sweep_cli({"sweep", dir + "/spec.yaml", "--no-progress"});
  INFO(r.err);
  CHECK(r.code == 1);
  CHECK_THAT(r.err, Catch::Contains("exited (status 3) instead of answering ask"));
  const auto orphan = lines(dir + "/heard.orphan");
  REQUIRE(orphan.size() == 1);
  const pid_t pid = std::stoi(orphan.front());
  // Gone, or a zombie its new parent has not reaped yet.
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string state;
  if (stat) stat.ignore(1 << 12, ')') >> state;
  const bool gone = !stat || state == "Z";
  if (!gone) ::kill(pid, SIGKILL);                        // (the test leaves nothing behind either)
  if (isorun::runner::containment().cgroup) CHECK(gone);  // its cgroup was killed whole
  else WARN("contained by process groups alone here: a descendant that called setsid() outlives the searcher");
  fs::remove_all(dir);
}

TEST_CASE("OUT/search.err keeps the first 8 MiB a run of the searcher writes, then says it was cut",
          "[sweep][search][hostile]") {
  const std::string dir = temp_dir();
  std::ofstream(dir + "/spec.yaml") << searched(dir, 2, "flood:10");
  const auto r = sweep_cli({"sweep", dir + "/spec.yaml", "--no-progress"});
  INFO(r.err);
  CHECK(r.code == 0);  // its stderr is read while it runs: a searcher that writes much is not held up
  const std::string note = "isorun: truncated at 8.00 MiB: what it wrote after this was not kept\n";
  const auto size = fs::file_size(dir + "/out/search.err");
  CHECK(size == (std::uintmax_t{8} << 20) + note.size());
  std::ifstream err(dir + "/out/search.err", std::ios::binary);
  std::string first, last(note.size(), '\0');
  std::getline(err, first);
  CHECK(first == std::string(1023, 'e'));
  err.seekg(static_cast<std::streamoff>(size - note.size()));
  err.read(last.data(), static_cast<std::streamsize>(last.size()));
  CHECK(last == note);
  // A run that finds it full starts it afresh (this one floods it again).
  const auto again = sweep_cli({"sweep", dir + "/spec.yaml", "--no-progress"});
  CHECK(again.code == 0);
  CHECK(fs::file_size(dir + "/out/search.err") == size);
  fs::remove_all(dir);
}

TEST_CASE("while the searcher thinks, the sweep goes on: trials end and are journaled, Ctrl-C stops it",
          "[sweep][search]") {
  const std::string dir = temp_dir();
  SECTION("journaled while it thinks") {
    // Ask 2 is answered only once two trials are journaled: the sweep must not wait for it.
    std::ofstream(dir + "/spec.yaml") << searched(dir, 4, "journaled:2", "0.2", ", timeout: 10m");
    const auto r = sweep_cli({"sweep", dir + "/spec.yaml", "--no-progress"});
    INFO(r.err);
    CHECK(r.code == 0);
    CHECK(records_of(dir).size() == 4);
  }
  SECTION("Ctrl-C while it thinks") {
    std::ofstream(dir + "/spec.yaml") << searched(dir, 6, "hang:2", "0", ", timeout: 10m");
    std::ofstream{dir + "/heard"};
    auto sweep = start_cli({"sweep", dir + "/spec.yaml", "--no-progress"}, {});
    auto asked_2 = [&] {
      for (const auto& m : messages(dir + "/heard"))
        if (m.value("op", "") == "ask" && m.value("number", -1) == 2) return true;
      return false;
    };
    for (std::size_t seen = 1; !asked_2(); ++seen) REQUIRE(wait_for_lines(dir + "/heard", seen));
    ::kill(sweep.pid(), SIGINT);
    CHECK(sweep.reap().code == 130);       // stopped at once, not after the searcher's timeout
    const auto records = records_of(dir);  // the trial whose end made room for ask 2, at least
    CHECK(!records.empty());
    for (const auto& rec : records) CHECK(rec["outcome"] == "success");
  }
  fs::remove_all(dir);
}

TEST_CASE("a resumed search replays the conversation to a new searcher, then goes on", "[sweep][search][resume]") {
  const std::string dir = temp_dir();
  std::ofstream(dir + "/spec.yaml") << searched(dir, 8, "", "0.3");
  const std::vector<std::string> args = {"sweep", dir + "/spec.yaml", "--no-progress"};
  fs::create_directories(dir + "/out");
  std::ofstream{dir + "/out/results.jsonl"};
  {
    auto sweep = start_cli(args, {});
    REQUIRE(wait_for_lines(dir + "/out/results.jsonl", 3));
    ::kill(sweep.pid(), SIGKILL);
    CHECK(sweep.reap().signal == SIGKILL);
  }
  const auto heard = [&] {
    std::vector<json> out;
    for (const auto& m : messages(dir + "/heard"))
      if (m.contains("op")) out.push_back(m);
    return out;
  };
  const auto first = heard();
  const auto r = sweep_cli(args);
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.err, !Catch::Contains("did not propose again"));
  const auto all = heard();
  // The second searcher heard hello, then the first's conversation as the journal kept it: each
  // ask and tell it logged, in order, marked replay.
  std::vector<json> second(all.begin() + static_cast<std::ptrdiff_t>(first.size()), all.end());
  REQUIRE(!second.empty());
  CHECK(second[0]["op"] == "hello");
  const auto conversation = lines(dir + "/out/search.jsonl");
  std::size_t replayed = 0;
  for (std::size_t i = 1; i < second.size() && second[i].value("replay", false); ++i) ++replayed;
  CHECK(replayed > 0);
  CHECK(second[0]["replay"] == replayed);
  // Every trial ran to its end once: the ones under way at the kill again, with their numbers.
  const auto records = records_of(dir);
  std::set<int> xs;
  for (const auto& rec : records) {
    CHECK(rec["outcome"] == "success");
    xs.insert(rec["params"]["x"].get<int>());
  }
  CHECK(records.size() == 8);
  CHECK(xs == std::set<int>{0, 2, 4, 6, 8, 10, 12, 14});
  // A third run: everything is done; nothing is asked.
  const auto again = sweep_cli(args);
  CHECK(again.code == 0);
  CHECK(records_of(dir).size() == 8);
  fs::remove_all(dir);
}

TEST_CASE("a tell over 1 MiB is replayed on resume, not told and journaled again", "[sweep][search][resume]") {
  const std::string dir = temp_dir();
  std::ofstream(dir + "/spec.yaml") << padded(dir, 2, 1500000);
  const std::vector<std::string> args = {"sweep", dir + "/spec.yaml", "--no-progress"};
  const auto first = sweep_cli(args);
  INFO(first.err);
  REQUIRE(first.code == 0);
  const auto conversation = lines(dir + "/out/search.jsonl");
  REQUIRE(conversation.size() == 4);  // two asks, two tells of 1.5 MiB
  const auto again = sweep_cli(args);
  INFO(again.err);
  CHECK(again.code == 0);
  const auto after = lines(dir + "/out/search.jsonl");
  CHECK(after.size() == conversation.size());  // nothing told again
  CHECK((after == conversation));              // (not printed: lines of 1.5 MiB)
  std::size_t replayed_tells = 0;
  const auto second = heard_in_run(dir, 2);
  REQUIRE(!second.empty());
  CHECK(second[0]["replay"] == 4);  // hello: the whole conversation is replayed
  for (std::size_t i = 1; i < second.size(); ++i) {
    CHECK(second[i].value("replay", false));  // and nothing else is said
    replayed_tells += second[i]["op"] == "tell" && second[i]["result"]["pad"].get<std::string>().size() == 1500000;
  }
  CHECK(replayed_tells == 2);
  fs::remove_all(dir);
}

TEST_CASE("a tell longer than a line of search.jsonl may be is told and journaled without its result",
          "[sweep][search][resume][large]") {
  const std::string dir = temp_dir();
  // The result file within what a trial's result may be (journal::max_line); its tell past it.
  std::ofstream(dir + "/spec.yaml") << padded(dir, 1, sw::journal::max_line - 100);
  const std::vector<std::string> args = {"sweep", dir + "/spec.yaml", "--no-progress"};
  const auto first = sweep_cli(args);
  INFO(first.err);
  REQUIRE(first.code == 0);
  const auto conversation = lines(dir + "/out/search.jsonl");
  REQUIRE(conversation.size() == 2);
  const json told = json::parse(conversation[1]);
  CHECK(told["tell"] == 0);
  CHECK(told["result"].is_null());
  CHECK(told["values"] == json::array({0}));  // what a searcher goes by is there
  std::size_t tells = 0;
  for (const auto& m : heard_in_run(dir, 1))
    if (m["op"] == "tell") tells += m["result"].is_null() ? 1 : 100;  // as journaled, so that a replay tells the same
  CHECK(tells == 1);
  sweep_cli(args);  // a resume replays it (and runs the trial again: the journal skips its record, as long)
  const auto after = lines(dir + "/out/search.jsonl");
  CHECK(after.size() == conversation.size());
  CHECK((after == conversation));
  fs::remove_all(dir);
}

TEST_CASE("a resumed search refuses a search.jsonl line isorun does not write, naming it",
          "[sweep][search][resume][hostile]") {
  const std::string dir = temp_dir();
  std::ofstream(dir + "/spec.yaml") << searched(dir, 2, "");
  const std::vector<std::string> args = {"sweep", dir + "/spec.yaml", "--no-progress"};
  REQUIRE(sweep_cli(args).code == 0);
  const auto conversation = lines(dir + "/out/search.jsonl");
  REQUIRE(conversation.size() == 4);  // two asks, two tells
  // Each as a live answer would be refused, or not a line of the protocol's at all; the next line
  // is number 5.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"ask": "x", "params": {"x": 1}})", "line 5 asks \"x\", where the ask's number is a whole number"},
      {R"({"ask": -1, "params": {"x": 7}})", "line 5 asks -1, where the ask's number is a whole number"},
      {R"({"ask": 2, "params": {"x": [1, 2]}})", "line 5 holds parameter 'x' as [1,2]; a parameter is a number"},
      {R"({"ask": 2, "params": {}})", "line 5 holds no parameter 'x', which search: params: declares"},
      {R"({"ask": 2, "params": {"x": 1, "y": 2}})", "line 5 holds parameter 'y', which search: params: does not"},
      {R"({"ask": 2})", "line 5 is an ask without its params"},
      {R"({"tell": 0, "id": 5})", "line 5 is a tell without the trial's id"},
      {R"({"tell": "0", "id": "a"})", "line 5 tells \"0\", where the ask's number is a whole number"},
      {"[1, 2]", "line 5 is not a JSON object"},
  };
  for (const auto& [crafted, said] : cases) {
    INFO(crafted);
    {
      std::ofstream out(dir + "/out/search.jsonl");
      for (const auto& l : conversation) out << l << "\n";
      out << crafted << "\n";
    }
    const auto r = sweep_cli(args);
    CHECK(r.code == 1);
    CHECK_THAT(r.err, Catch::Contains("isorun: error: " + dir + "/out/search.jsonl " + said));
    CHECK(records_of(dir).size() == 2);  // nothing ran for it
  }
  fs::remove_all(dir);
}

TEST_CASE("search specs isorun refuses, naming the line", "[sweep][search][errors]") {
  const std::string head = "command: [echo, \"{x}\"]\nmetric: {name: y, goal: minimize}\n";
  auto refused = [&](const std::string& search) {
    try {
      sw::parse_spec(head + search, "t.yaml");
    } catch (const sw::spec_error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK_THAT(refused("search: {type: optuna, sampler: tpx, trials: 10, params: {x: {float: [0, 1]}}}\n"),
             Catch::Contains("line 3") && Catch::Contains("sampler 'tpx'") && Catch::Contains("did you mean 'tpe'"));
  CHECK_THAT(refused("search: {type: optuna, trials: 10, params: {x: {float: [1, 0]}}}\n"),
             Catch::Contains("line 3") && Catch::Contains("low must be below high"));
  CHECK_THAT(refused("search: {type: optuna, trials: 10, params: {x: {float: [0, 1], log: true}}}\n"),
             Catch::Contains("low bound must be above 0"));
  CHECK_THAT(refused("search: {type: optuna, trials: 10, params: {x: {int: [1, 8], step: 0.5}}}\n"),
             Catch::Contains("an int's step is a whole number"));
  CHECK_THAT(refused("search: {type: optuna, params: {x: {float: [0, 1]}}}\n"),
             Catch::Contains("line 3") && Catch::Contains("search needs trials:"));
  CHECK_THAT(refused("search: {type: command, command: [my-searcher]}\n"), Catch::Contains("search needs trials:"));
  CHECK_THAT(refused("search: {type: command, command: [my-searcher], trials: 5}\n"),
             Catch::Contains("search needs params:"));
  CHECK_THAT(refused("search: {type: optuna, trials: 10}\n"), Catch::Contains("needs params:"));
  CHECK_THAT(refused("search: {type: annealing, trials: 10}\n"), Catch::Contains("search type is optuna"));
  CHECK_THAT(refused("params: {x: [1, 2]}\nsearch: {type: optuna, trials: 10, params: {y: {float: [0, 1]}}}\n"),
             Catch::Contains("params: are constants"));
  CHECK_THAT(refused("search: {type: optuna, trials: 10, params: {x: {categorical: []}}}\n"),
             Catch::Contains("non-empty list"));
  CHECK(refused("search: {type: optuna, trials: 10, params: {x: {float: [0, 1]}}}\n") == "accepted");

  // Checked when the sweep starts (exit 2, nothing run): a searcher program that is not there,
  // Optuna missing from the Python that would run it.
  const std::string dir = temp_dir();
  std::ofstream(dir + "/spec.yaml")
      << head << "search: {type: command, command: [no-such-searcher], params: [x], trials: 3}\nout: \"" << dir
      << "/out\"\n";
  auto missing = sweep_cli({"sweep", dir + "/spec.yaml", "--no-progress"});
  CHECK(missing.code == 2);
  CHECK_THAT(missing.err, Catch::Contains("line 3") && Catch::Contains("'no-such-searcher' is not found"));
  std::ofstream(dir + "/optuna.yaml") << head
                                      << "search: {type: optuna, trials: 3, params: {x: {int: [0, 3]}}}\nout: \"" << dir
                                      << "/out2\"\n";
  auto no_optuna = sweep_cli({"sweep", dir + "/optuna.yaml", "--no-progress"}, {"ISORUN_PYTHON=" + dir + "/python3"});
  CHECK(no_optuna.code == 2);
  CHECK_THAT(no_optuna.err, Catch::Contains("search type optuna"));
  std::ofstream(dir + "/python3") << "#!/bin/sh\necho \"ModuleNotFoundError: No module named 'optuna'\" >&2\nexit 1\n";
  fs::permissions(dir + "/python3", fs::perms::owner_all);
  auto without = sweep_cli({"sweep", dir + "/optuna.yaml", "--no-progress"}, {"ISORUN_PYTHON=" + dir + "/python3"});
  CHECK(without.code == 2);
  CHECK_THAT(without.err, Catch::Contains("needs Optuna") && Catch::Contains("pip install optuna") &&
                              Catch::Contains("No module named 'optuna'"));
  CHECK_FALSE(fs::exists(dir + "/out2/results.jsonl"));
  // On Slurm, the trials that run at once must be said (refused before sbatch is looked for).
  std::ofstream(dir + "/slurm.yaml") << head << "search: {type: command, command: [sh], params: [x], trials: 3}\n"
                                     << "resources: {backend: slurm}\nout: \"" << dir << "/out3\"\n";
  auto unbounded = sweep_cli({"sweep", dir + "/slurm.yaml", "--no-progress"});
  CHECK(unbounded.code == 2);
  CHECK_THAT(unbounded.err, Catch::Contains("line 3") && Catch::Contains("max_running"));
  fs::remove_all(dir);
}
