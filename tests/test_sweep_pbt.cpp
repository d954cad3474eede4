// Population-based training's hand-down of a parent's checkpoint to its child: a copy that keeps
// holes and links and refuses what a checkpoint cannot hold or could not fit, made with no lock
// of the population's held, in sweeps that really run.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <sys/statvfs.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "isorun/sweep/checkpoint_copy.hpp"
#include "isorun/sweep/pbt.hpp"
#include "isorun/worker/checkpoint.hpp"
#include "sweep_test_support.hpp"

namespace {

struct stat stat_of(const fs::path& p) {
  struct stat st {};
  REQUIRE(::lstat(p.c_str(), &st) == 0);
  return st;
}

std::uint64_t allocated(const fs::path& p) { return static_cast<std::uint64_t>(stat_of(p).st_blocks) * 512; }

// The space free on the file system of `p`, as an unprivileged writer may use it.
std::uint64_t free_space(const fs::path& p) {
  struct statvfs v {};
  REQUIRE(::statvfs(p.c_str(), &v) == 0);
  return static_cast<std::uint64_t>(v.f_bavail) * v.f_frsize;
}

// A file of `size` bytes that holds `text` at `at` and holes elsewhere.
void sparse_file(const fs::path& p, std::uint64_t size, const std::string& text = "", std::uint64_t at = 0) {
  { std::ofstream out(p); }
  fs::resize_file(p, size);
  if (text.empty()) return;
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(at));
  f << text;
}

std::string read_at(const fs::path& p, std::uint64_t at, std::size_t n) {
  std::ifstream in(p, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(at));
  std::string s(n, '\0');
  in.read(s.data(), static_cast<std::streamsize>(n));
  return s;
}

// A sweep of PBT members of trial.sh, x in `xs` (loss x), on one slot: x=1 runs to its end first,
// then each other one, which reaches step 2 after its decision and is ranked there as it arrives:
// below x=1, it is replaced by a child of x=1. Each member's first attempt commits checkpoint 1
// holding a sparse file of `size` bytes.
std::string members_on_one_slot(const std::string& dir, std::uint64_t size, const std::string& xs = "1, 2",
                                const std::string& quantile = "0.5") {
  std::ofstream(dir + "/trial.sh")
      << "x=$1\n"
         "if [ -z \"$ISORUN_RESUME_FROM\" ]; then\n"
         "  d=$ISORUN_CHECKPOINT_DIR/tmp-1\n"
         "  mkdir \"$d\" && truncate -s \"$2\" \"$d/state\" && echo \"x $x\" > \"$d/note\"\n"
         "  echo '{\"checkpoint\": 1}'\n"
         "fi\n"
         "for s in 1 2 3 4; do echo \"{\\\"step\\\": $s, \\\"loss\\\": $x}\"; done\n"
         "echo \"{\\\"loss\\\": $x}\"\n";
  std::ofstream(dir + "/spec.yaml") << "command: [sh, \"" << dir << "/trial.sh\", '{x}', '" << size
                                    << "']\nparams: {x: [" << xs << "]}\nmetric: {name: loss, goal: minimize}\n"
                                    << "checkpoints: {keep: 1}\nresources: {cpu_slots: 1}\n"
                                    << "scheduler: {type: pbt, interval: 2, quantile: " << quantile
                                    << ", seed: 0, mutations: {x: perturb}}\nout: \"" << dir << "/out\"\n";
  return dir + "/spec.yaml";
}

std::vector<json> records_of(const std::string& out) {
  std::vector<json> r;
  for (const auto& l : lines(out + "/results.jsonl")) r.push_back(json::parse(l));
  return r;
}

}  // namespace

TEST_CASE(
    "a checkpoint copy keeps holes, copies links as links and folders with what they hold; it refuses a FIFO, "
    "and a checkpoint larger than the space free where it goes, before writing anything",
    "[sweep][pbt][checkpoints]") {
  const fs::path dir = temp_dir();
  const std::atomic<bool> go_on{false};
  const fs::path from = dir / "from", to = dir / "to";
  fs::create_directories(from / "sub");
  sparse_file(from / "state", 1ULL << 30, "the middle", 512ULL << 20);  // 1 GiB, 4 KiB of it data
  std::ofstream(from / "sub" / "small") << "small";
  fs::create_symlink("/nonexistent/target", from / "dangling");
  fs::create_directory_symlink("sub", from / "sub_link");
  fs::permissions(from / "sub" / "small", fs::perms::owner_read | fs::perms::group_read);
  fs::create_directory(to);
  sw::copy_checkpoint(from, to, go_on);
  CHECK(fs::file_size(to / "state") == 1ULL << 30);
  CHECK(allocated(to / "state") <= 1ULL << 20);  // (written out in full: 1 GiB)
  CHECK(read_at(to / "state", 512ULL << 20, 10) == "the middle");
  CHECK(read_at(to / "state", 0, 4) == std::string(4, '\0'));
  CHECK(read_file(to / "sub" / "small") == "small");
  CHECK((stat_of(to / "sub" / "small").st_mode & 07777) == 0440);
  CHECK(fs::is_symlink(to / "dangling"));
  CHECK(fs::read_symlink(to / "dangling") == "/nonexistent/target");
  CHECK(fs::is_symlink(to / "sub_link"));
  CHECK(fs::read_symlink(to / "sub_link") == "sub");

  // A FIFO: refused at once, naming it (it is never opened: nothing waits for a writer).
  const fs::path fifo_from = dir / "fifo_from", fifo_to = dir / "fifo_to";
  fs::create_directories(fifo_from);
  fs::create_directory(fifo_to);
  std::ofstream(fifo_from / "a") << "a";
  REQUIRE(::mkfifo((fifo_from / "pipe").c_str(), 0600) == 0);
  CHECK_THROWS_WITH(sw::copy_checkpoint(fifo_from, fifo_to, go_on),
                    Catch::Contains((fifo_from / "pipe").string()) && Catch::Contains("a FIFO"));
  CHECK(fs::is_empty(fifo_to));

  // Larger, holes counted, than the space free where it would go: refused, nothing written.
  const fs::path huge_from = dir / "huge_from", huge_to = dir / "huge_to";
  fs::create_directories(huge_from);
  fs::create_directory(huge_to);
  std::ofstream(huge_from / "a") << "a";
  sparse_file(huge_from / "state", free_space(dir) + (1ULL << 40));
  CHECK_THROWS_WITH(sw::copy_checkpoint(huge_from, huge_to, go_on),
                    Catch::Contains("checkpoint " + huge_from.string() + " holds") &&
                        Catch::Contains("apparent size") &&
                        Catch::Contains("free on the file system of " + dir.string()));
  CHECK(fs::is_empty(huge_to));

  // Stopped (the sweep is ending): it stops.
  const std::atomic<bool> stop{true};
  fs::create_directory(dir / "stopped");
  CHECK_THROWS_WITH(sw::copy_checkpoint(from, dir / "stopped", stop), Catch::Contains("stopped"));
  fs::remove_all(dir);
}

TEST_CASE(
    "pbt copies a parent's checkpoint with no lock held; meanwhile reports are judged and the source answers; "
    "the child is given out once its copy is done",
    "[sweep][pbt][checkpoints]") {
  const std::string dir = temp_dir(), out = dir + "/out";
  fs::create_directories(out);
  const sw::sweep_spec s = sw::parse_spec(
      "command: [echo, '{x}']\nparams: {x: [1, 2]}\nmetric: {name: loss, goal: minimize}\ncheckpoints: {keep: 1}\n"
      "scheduler: {type: pbt, interval: 1, quantile: 0.5, seed: 0, mutations: {x: perturb}}\n",
      dir + "/spec.yaml");
  // The copy waits until the test lets it go on; one made on the thread that reported (under
  // the population's lock) does not wait, and says so.
  struct {
    std::mutex m;
    std::condition_variable changed;
    bool started = false, go_on = false, woken = false, on_reporting_thread = false;
  } gate;
  const auto reporting_thread = std::this_thread::get_id();
  sw::pbt_population population(s, out, "t",
                                [&](const fs::path& from, const fs::path& to, const std::atomic<bool>& stop) {
                                  {
                                    std::unique_lock lock(gate.m);
                                    gate.started = true;
                                    gate.changed.notify_all();
                                    if (std::this_thread::get_id() == reporting_thread) gate.on_reporting_thread = true;
                                    else gate.changed.wait(lock, [&] { return gate.go_on || stop; });
                                  }
                                  sw::copy_checkpoint(from, to, stop);
                                });
  std::vector<sw::new_trial> listed;
  for (std::size_t i = 0; i < s.trials.size(); ++i) listed.push_back({i, sw::trial_id("t", s.trials[i]), s.trials[i]});
  const std::string a = listed[0].id, b = listed[1].id;
  const auto rule = population.rule();
  const auto source = population.source(std::make_unique<sw::list_source>(listed));
  source->on_ready([&] {
    std::lock_guard lock(gate.m);
    gate.woken = true;
    gate.changed.notify_all();
  });
  REQUIRE(source->next()->id == a);
  REQUIRE(source->next()->id == b);
  isorun::checkpoint_folder folder(out + "/checkpoints/" + a, 1);
  const fs::path staged = folder.stage(1);
  std::ofstream(staged / "state") << "a at step 1";
  folder.commit(staged, 1);

  CHECK_FALSE(rule->report(a, 1, 0.1));
  CHECK_FALSE(rule->report(b, 1, 0.9));  // the decision: b is replaced by a child of a
  {
    std::unique_lock lock(gate.m);
    gate.changed.wait(lock, [&] { return gate.started; });
  }
  REQUIRE_FALSE(gate.on_reporting_thread);
  // While the copy is under way:
  CHECK(rule->report(b, 2, 0.9));  // b is stopped at its next report
  CHECK_FALSE(rule->report(a, 2, 0.1));
  CHECK_FALSE(source->next());  // the child waits for its copy
  CHECK(source->busy());
  CHECK_FALSE(source->exhausted());
  {
    std::unique_lock lock(gate.m);
    gate.go_on = true;
    gate.changed.notify_all();
    gate.changed.wait(lock, [&] { return gate.woken; });
  }
  const auto child = source->next();
  REQUIRE(child);
  CHECK(child->origin["parent"] == a);
  CHECK(child->origin["replaces"] == b);
  CHECK(child->origin["step"] == 1);
  CHECK(read_file(out + "/checkpoints/" + child->id + "/step-000000000001/state") == "a at step 1");
  CHECK_FALSE(source->busy());
  CHECK(source->exhausted());
  fs::remove_all(dir);
}

TEST_CASE("a pbt child gets its parent's sparse checkpoint as the parent has it, 1 GiB to read, a few KiB on disk",
          "[sweep][pbt][checkpoints]") {
  const std::string dir = temp_dir(), out = dir + "/out";
  const auto r = sweep_cli({"sweep", members_on_one_slot(dir, 1ULL << 30), "--no-progress"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  std::size_t children = 0;
  for (const auto& rec : records_of(out)) {
    if (!rec.contains("origin")) continue;
    ++children;
    INFO(rec.dump());
    CHECK(rec["origin"]["step"] == 1);
    CHECK(rec["resumes"][0]["from"] == 1);
    const fs::path copy = out + "/checkpoints/" + rec["id"].get<std::string>() + "/step-000000000001";
    CHECK(fs::file_size(copy / "state") == 1ULL << 30);
    CHECK(allocated(copy / "state") <= 1ULL << 20);  // (std::filesystem::copy wrote it out: 1 GiB)
    CHECK(read_file(copy / "note") == "x 1\n");      // the parent's
  }
  CHECK(children >= 1);
  fs::remove_all(dir);
}

TEST_CASE(
    "a pbt parent's checkpoint larger than the space free where its child's goes is not copied; the child "
    "starts afresh, and the sweep says why",
    "[sweep][pbt][checkpoints]") {
  const std::string dir = temp_dir(), out = dir + "/out";
  const auto r = sweep_cli({"sweep", members_on_one_slot(dir, free_space(dir) + (1ULL << 40)), "--no-progress"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  std::size_t children = 0;
  for (const auto& rec : records_of(out)) {
    if (!rec.contains("origin")) continue;
    ++children;
    const std::string id = rec["id"];
    CHECK(rec["origin"]["step"] == -1);
    CHECK_FALSE(rec.contains("resumes"));
    CHECK_THAT(r.err, Catch::Contains("pbt: trial " + id + " starts afresh, without its parent " +
                                      rec["origin"]["parent"].get<std::string>() + "'s checkpoint: checkpoint " + out +
                                      "/checkpoints/") &&
                          Catch::Contains("free on the file system of " + out + "/checkpoints/" + id));
    for (const auto& e : fs::directory_iterator(out + "/checkpoints/" + id))  // nothing half copied is left
      CHECK(e.path().filename().string().rfind(".writing-", 0) == std::string::npos);
  }
  CHECK(children >= 1);
  fs::remove_all(dir);
}

TEST_CASE(
    "a pbt population larger than the slots runs in turns: each member that starts late is ranked as it "
    "reaches a decision step, and replaced where it falls in the bottom quantile",
    "[sweep][pbt]") {
  // Four members on one slot, in order x = 1, 2, 3, 4 (loss x: each later one is worse). x=1 runs
  // to its end first; each of the others, at step 2, is ranked against the values there and
  // replaced by a child (never left to run as in a plain sweep).
  const std::string dir = temp_dir(), out = dir + "/out";
  const auto r = sweep_cli({"sweep", members_on_one_slot(dir, 0, "1, 2, 3, 4", "0.25"), "--no-progress"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  std::map<int, json> members;
  std::vector<json> children;
  for (const auto& rec : records_of(out)) {
    if (rec.contains("origin")) children.push_back(rec);
    else members[rec["params"]["x"].get<int>()] = rec;
  }
  REQUIRE(members.size() == 4);
  CHECK(members[1]["outcome"] == "success");
  for (int x : {2, 3, 4}) {
    INFO("x=" << x << ": " << members[x].dump());
    CHECK(members[x]["outcome"] == "pruned");  // (stopped at its next report, or ended before it came)
  }
  // Each replaced by a child of x=1, the only member better than it at step 2.
  REQUIRE(children.size() >= 3);
  std::set<std::string> replaced;
  for (const auto& c : children) replaced.insert(c["origin"]["replaces"].get<std::string>());
  for (int x : {2, 3, 4}) CHECK(replaced.count(members[x]["id"].get<std::string>()) == 1);
  CHECK(children[0]["origin"]["parent"] == members[1]["id"]);
  fs::remove_all(dir);
}
