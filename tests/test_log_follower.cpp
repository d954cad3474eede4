// The sweep's log follower: reports read from logs as they grow, in order, pieces joined into
// lines; what is left read at the end; nothing after the end; one inotify instance for all logs.
#include <catch2/catch.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "isorun/sweep/log_follower.hpp"
#include "isorun/sweep/report_lines.hpp"

namespace sw = isorun::sweep;

namespace {

struct temp_dir {
  std::string dir;
  temp_dir() {
    char name[] = "/tmp/isorun-follower-XXXXXX";
    REQUIRE(::mkdtemp(name) != nullptr);
    dir = name;
  }
  ~temp_dir() { std::filesystem::remove_all(dir); }
  const std::string& path() const { return dir; }
};

// Reports that arrived, and a way to wait for the n-th.
struct received {
  std::mutex m;
  std::condition_variable cv;
  std::vector<std::pair<std::int64_t, double>> reports;
  sw::log_follower::on_report_fn sink() {
    return [this](std::int64_t step, nlohmann::json metrics) {
      std::lock_guard lock(m);
      reports.emplace_back(step, metrics.value("loss", -1.0));
      cv.notify_all();
    };
  }
  void wait_for(std::size_t n) {
    std::unique_lock lock(m);
    cv.wait(lock, [&] { return reports.size() >= n; });
  }
  std::size_t count() {
    std::lock_guard lock(m);
    return reports.size();
  }
};

struct log_file {
  std::string path;
  int writer = -1;
  explicit log_file(const std::string& dir, const std::string& name) : path{dir + "/" + name} {
    writer = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    REQUIRE(writer >= 0);
  }
  ~log_file() { ::close(writer); }
  void write(const std::string& s) const {
    REQUIRE(::write(writer, s.data(), s.size()) == static_cast<ssize_t>(s.size()));
  }
  isorun::unique_fd reader() const { return isorun::unique_fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC)); }
};

// This process's descriptors that are inotify instances.
int inotify_instances() {
  int n = 0;
  DIR* d = ::opendir("/proc/self/fd");
  REQUIRE(d);
  while (const dirent* e = ::readdir(d)) {
    char target[256];
    const std::string link = std::string("/proc/self/fd/") + e->d_name;
    const ssize_t len = ::readlink(link.c_str(), target, sizeof target - 1);
    if (len > 0 && std::string(target, static_cast<std::size_t>(len)) == "anon_inode:inotify") ++n;
  }
  ::closedir(d);
  return n;
}

}  // namespace

TEST_CASE("report lines: a step and its metrics; anything else is not a report", "[log_follower]") {
  auto r = sw::report_line(R"(  {"step": 3, "loss": 0.5}  )");
  REQUIRE(r);
  CHECK(r->first == 3);
  CHECK(r->second == nlohmann::json{{"loss", 0.5}});
  CHECK_FALSE(sw::report_line(R"({"step": -1, "loss": 0.5})"));
  CHECK_FALSE(sw::report_line(R"({"step": 1.5})"));
  CHECK_FALSE(sw::report_line(R"({"loss": 0.5})"));
  CHECK_FALSE(sw::report_line("step 3 loss 0.5"));
  CHECK_FALSE(sw::report_line(R"({"step": 1, "loss": )"));
}

TEST_CASE("a followed log's reports arrive as they are written, in order, pieces joined", "[log_follower]") {
  temp_dir dir;
  sw::log_follower follower;
  log_file a(dir.path(), "a.out"), b(dir.path(), "b.out");
  received ra, rb;
  auto fa = follower.follow(a.reader(), ra.sink());
  auto fb = follower.follow(b.reader(), rb.sink());
  a.write("epoch 1\n{\"step\": 1, \"loss\": 0.9}\n");
  ra.wait_for(1);  // while the log is open and growing: no end() yet
  a.write("{\"step\": 2, \"lo");
  b.write("{\"step\": 7, \"loss\": 0.1}\n");
  rb.wait_for(1);
  a.write("ss\": 0.8}\n");
  ra.wait_for(2);
  CHECK(ra.reports == std::vector<std::pair<std::int64_t, double>>{{1, 0.9}, {2, 0.8}});
  CHECK(rb.reports == std::vector<std::pair<std::int64_t, double>>{{7, 0.1}});
}

TEST_CASE("end() reads what is left and nothing is handed on after it", "[log_follower]") {
  temp_dir dir;
  sw::log_follower follower;
  log_file a(dir.path(), "a.out");
  received ra;
  auto fa = follower.follow(a.reader(), ra.sink());
  std::string many;
  for (int i = 0; i < 500; ++i) many += "{\"step\": " + std::to_string(i) + ", \"loss\": 1}\n";
  a.write(many);
  fa.end();  // whatever the thread has or has not read yet
  REQUIRE(ra.count() == 500);
  for (std::size_t i = 0; i < ra.reports.size(); ++i) CHECK(ra.reports[i].first == static_cast<std::int64_t>(i));
  a.write("{\"step\": 500, \"loss\": 1}\n");
  // A second log followed and read to its end afterwards: had the first still been followed,
  // its line would have been handed on by then (one thread reads them all, in turn).
  log_file b(dir.path(), "b.out");
  received rb;
  auto fb = follower.follow(b.reader(), rb.sink());
  b.write("{\"step\": 0, \"loss\": 1}\n");
  rb.wait_for(1);
  fb.end();
  CHECK(ra.count() == 500);
}

TEST_CASE("one inotify instance follows every log, however many come and go", "[log_follower]") {
  temp_dir dir;
  const int before = inotify_instances();
  {
    sw::log_follower follower;
    for (int i = 0; i < 50; ++i) {
      log_file f(dir.path(), "t" + std::to_string(i) + ".out");
      received r;
      auto following = follower.follow(f.reader(), r.sink());
      f.write("{\"step\": 1, \"loss\": 0.5}\n");
      following.end();
      CHECK(r.count() == 1);
      CHECK(inotify_instances() == before + 1);
    }
  }
  CHECK(inotify_instances() == before);
}
