// The live report's server (isorun report OUT --serve, isorun sweep --serve): a real server on a
// real socket over a folder a real sweep wrote. What it gives out, what it refuses, and its long
// poll, held while a sweep holds the folder and answered when the journal grows, the sweep ends or
// the server stops. (The page in a browser: test_sweep_report.cpp's [browser] cases.)
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "isorun/runner/unique_fd.hpp"
#include "isorun/sweep/report_server.hpp"
#include "sweep_test_support.hpp"

namespace fs = std::filesystem;
using isorun::unique_fd;
using isorun::sweep::report_server;

namespace {

// A folder three trials of a real sweep wrote; the last trial's record is taken out of the
// journal and kept in `last`, so that a test can make it arrive.
struct swept {
  std::string dir = temp_dir(), out = dir + "/out", last;
  swept() {
    const auto r = isorun::test::run_captured(
        ISORUN_CLI, {"sweep", "--grid", "x=1,2,3", "--cpu-slots", "1", "--out", out, "--no-progress", "--", "sh", "-c",
                     "echo \"{\\\"v\\\": $1}\"", "sh", "{x}"});
    INFO(r.err);
    REQUIRE(r.code == 0);
    const std::string journal = read_file(out + "/results.jsonl");
    const auto cut = journal.rfind('\n', journal.size() - 2) + 1;
    last = journal.substr(cut);
    std::ofstream(out + "/results.jsonl", std::ios::trunc) << journal.substr(0, cut);
  }
  ~swept() { fs::remove_all(dir); }
  void arrive() const { std::ofstream(out + "/results.jsonl", std::ios::app) << last; }
};

// The server on a thread of its own; the requests it logs are kept, and can be waited for.
struct serving {
  std::mutex m;
  std::condition_variable cv;
  std::vector<std::string> requests;
  report_server server;
  std::thread thread;
  explicit serving(const std::string& out)
      : server({.on_request =
                    [this](const std::string& line) {
                      const std::lock_guard lock(m);
                      requests.push_back(line);
                      cv.notify_all();
                    }}),
        thread([this, out] { server.serve(out); }) {}
  ~serving() {
    server.stop();
    thread.join();
  }
  int port() const { return std::stoi(server.url().substr(server.url().rfind(':') + 1)); }
  std::string token() const { return server.url().substr(server.url().find("?token=") + 7); }
  // Waits until the server has logged a request whose line ends in `status`.
  void wait_for(const std::string& status) {
    std::unique_lock lock(m);
    cv.wait(lock, [&] {
      for (const auto& r : requests)
        if (r.ends_with(" " + status)) return true;
      return false;
    });
  }
};

unique_fd connect_to(int port) {
  unique_fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  return fd;
}

std::string read_to_end(int fd) {
  std::string got;
  char buf[65536];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) got.append(buf, static_cast<std::size_t>(n));
  return got;
}

struct reply {
  int status = 0;
  std::string head, body;
  [[nodiscard]] std::string header(const std::string& name) const {
    const auto at = head.find("\r\n" + name + ": ");
    if (at == std::string::npos) return {};
    const auto from = at + name.size() + 4;
    return head.substr(from, head.find("\r\n", from) - from);
  }
};

reply parsed(const std::string& raw) {
  reply r;
  const auto end = raw.find("\r\n\r\n");
  REQUIRE(end != std::string::npos);
  r.head = raw.substr(0, end);
  r.body = raw.substr(end + 4);
  r.status = std::stoi(raw.substr(9, 3));
  return r;
}

// One request, as raw text (so that it can be as malformed as a test wants), and its reply.
reply ask(int port, const std::string& request) {
  const unique_fd fd = connect_to(port);
  REQUIRE(::write(fd.get(), request.data(), request.size()) == static_cast<ssize_t>(request.size()));
  return parsed(read_to_end(fd.get()));
}

// A request as the page's browser sends it: `line` (METHOD TARGET), addressed to `host`, with the
// cookie the page set (the token of the URL the server printed).
std::string request(const serving& srv, const std::string& line, const std::string& host = "127.0.0.1") {
  const std::string port = std::to_string(srv.port());
  return line + " HTTP/1.1\r\nHost: " + host + ":" + port + "\r\nCookie: isorun_token_" + port + "=" + srv.token() +
         "\r\n\r\n";
}

reply get(const serving& srv, const std::string& target, const std::string& method = "GET") {
  return ask(srv.port(), request(srv, method + " " + target));
}

// A long poll for news after generation `since`, sent and, once the server says so, held.
unique_fd held_poll(serving& srv, const std::string& since) {
  unique_fd poll = connect_to(srv.port());
  const std::string held = request(srv, "GET /live?since=" + since);
  REQUIRE(::write(poll.get(), held.data(), held.size()) == static_cast<ssize_t>(held.size()));
  srv.wait_for("held");
  return poll;
}

// The generation a page shows (its root's data-generation).
std::string generation_of(const std::string& page) {
  const auto at = page.find("data-generation=\"");
  REQUIRE(at != std::string::npos);
  return page.substr(at + 17, page.find('"', at + 17) - at - 17);
}

// Everything under a folder: each file's path and contents.
std::map<std::string, std::string> contents(const fs::path& dir) {
  std::map<std::string, std::string> all;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (!e.is_symlink() && e.is_regular_file()) all[e.path().string()] = read_file(e.path());
  return all;
}

}  // namespace

TEST_CASE("the report server gives out the live page and the files inside OUT, and nothing else") {
  const swept s;
  fs::create_symlink("/etc/passwd", s.out + "/passwd");  // a link inside OUT to a file outside it
  const auto before = contents(s.out);
  serving srv(s.out);
  const int port = srv.port();

  const reply page = get(srv, "/");
  CHECK(page.status == 200);
  CHECK(page.header("Content-Type") == "text/html; charset=utf-8");
  CHECK(page.header("Cache-Control") == "no-store");
  CHECK(page.body.find("2 trials journaled") != std::string::npos);
  CHECK(page.body.find("id=\"table-script\"") != std::string::npos);
  CHECK(page.body.find("live?since=") != std::string::npos);  // the live script
  CHECK(!generation_of(page.body).empty());
  const reply head = get(srv, "/", "HEAD");
  CHECK(head.status == 200);
  CHECK(head.body.empty());
  CHECK(head.header("Content-Length") == std::to_string(page.body.size()));

  const reply csv = get(srv, "/results.csv");
  CHECK(csv.status == 200);
  CHECK(csv.header("Content-Type") == "text/csv; charset=utf-8");
  CHECK(csv.body == read_file(s.out + "/results.csv"));
  CHECK(get(srv, "/logs").status == 404);  // a folder

  for (const char* method : {"POST", "PUT", "DELETE", "PATCH"}) {
    const reply r = ask(port, std::string(method) + " /results.csv HTTP/1.1\r\nHost: 127.0.0.1:" +
                                  std::to_string(port) + "\r\nContent-Length: 4\r\n\r\nxxxx");
    CHECK(r.status == 405);
    CHECK(r.header("Allow") == "GET, HEAD");
  }
  {  // a body the server never wanted, larger than the sockets hold: all of it is taken (the
     // connection is not reset under the client's send), and the refusal arrives
    const std::string body(16 << 20, 'x');
    const std::string post = "POST / HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(port) +
                             "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    const unique_fd fd = connect_to(port);
    REQUIRE(::send(fd.get(), post.data(), post.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(post.size()));
    CHECK(parsed(read_to_end(fd.get())).status == 405);
  }
  for (const std::string escape :
       {"/../../../../etc/passwd", "/%2e%2e/%2e%2e/%2e%2e/etc/passwd", "/logs/..%2f..%2f..%2fetc%2fpasswd",
        "//etc/passwd", "/./results.csv", "/passwd", "/%2fetc%2fpasswd"}) {
    const reply r = get(srv, escape);
    INFO(escape);
    CHECK(r.status == 404);
    CHECK(r.body.find("root:") == std::string::npos);
  }
  CHECK(get(srv, "/%zz").status == 400);
  CHECK(get(srv, "/results.csv%00.html").status == 400);
  CHECK(ask(port, "nonsense\r\n\r\n").status == 400);
  CHECK(ask(port, "GET / HTTP/1.1\r\nX: " + std::string(20000, 'a') + "\r\n\r\n").status == 431);
  // A page elsewhere whose name resolves to 127.0.0.1 (DNS rebinding) names that name.
  const reply rebound = ask(port,
                            "GET /results.csv HTTP/1.1\r\nHost: attacker.example:" + std::to_string(port) + "\r\n\r\n");
  CHECK(rebound.status == 403);
  CHECK(ask(port, request(srv, "GET /", "localhost")).status == 200);
  // Another user of the machine who finds the port has no token: refused, whatever the address.
  const std::string bare = "GET /results.csv HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(port) + "\r\n";
  const reply no_token = ask(port, bare + "\r\n");
  CHECK(no_token.status == 403);
  CHECK(no_token.body.find("?token=") != std::string::npos);
  CHECK(ask(port, bare + "Cookie: isorun_token_" + std::to_string(port) + "=" + std::string(32, '0') + "\r\n\r\n")
            .status == 403);
  // The printed URL's token, in the query: the page, and a cookie of this port's for what follows.
  const reply first = ask(
      port, "GET /?token=" + srv.token() + " HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(port) + "\r\n\r\n");
  CHECK(first.status == 200);
  CHECK(first.header("Set-Cookie").starts_with("isorun_token_" + std::to_string(port) + "=" + srv.token() + ";"));

  CHECK(contents(s.out) == before);  // nothing in OUT was written, made or removed
}

TEST_CASE("the report server holds a long poll while a sweep holds OUT, and answers it with the new page") {
  const swept s;
  serving srv(s.out);
  const std::string shown = generation_of(get(srv, "/").body);

  SECTION("no sweep holds OUT: nothing new is said at once, as not running") {
    const reply r = get(srv, "/live?since=" + shown);
    CHECK(r.status == 204);
    CHECK(r.header("X-Isorun-Running") == "0");
    CHECK(r.header("X-Isorun-Generation") == shown);
  }
  SECTION("a page that shows an older generation gets the current page at once") {
    const reply r = get(srv, "/live?since=0");
    CHECK(r.status == 200);
    CHECK(r.header("X-Isorun-Generation") == shown);
    CHECK(generation_of(r.body) == shown);
  }
  // A sweep runs: it holds the folder's lock, as sweep_run does.
  unique_fd lock(::open((s.out + "/sweep.lock").c_str(), O_RDWR | O_CLOEXEC));
  REQUIRE(::flock(lock.get(), LOCK_EX) == 0);
  SECTION("the journal grows: the held poll is answered with the page that has the new trial") {
    const unique_fd poll = held_poll(srv, shown);
    s.arrive();
    const reply r = parsed(read_to_end(poll.get()));
    CHECK(r.status == 200);
    CHECK(r.header("X-Isorun-Running") == "1");
    CHECK(r.header("X-Isorun-Generation") != shown);
    CHECK(generation_of(r.body) == r.header("X-Isorun-Generation"));
    CHECK(r.body.find("3 trials journaled") != std::string::npos);
  }
  SECTION("the sweep ends (its lock goes): the held poll is told, nothing new, not running") {
    const unique_fd poll = held_poll(srv, shown);
    lock.reset();
    const reply r = parsed(read_to_end(poll.get()));
    CHECK(r.status == 204);
    CHECK(r.header("X-Isorun-Running") == "0");
  }
  SECTION("the server stops: the held poll is told it was the last word") {
    const unique_fd poll = held_poll(srv, shown);
    srv.server.stop();
    const reply r = parsed(read_to_end(poll.get()));
    CHECK(r.status == 204);
    CHECK(r.header("X-Isorun-Closing") == "1");
  }
}

TEST_CASE("isorun report --serve and sweep --serve refuse bad input before serving anything") {
  const std::string dir = temp_dir();
  auto cli = [](std::vector<std::string> args) { return isorun::test::run_captured(ISORUN_CLI, args); };
  auto r = cli({"report", dir, "--serve"});
  CHECK(r.code == 2);
  CHECK(r.err.find("is not a sweep's output folder") != std::string::npos);
  r = cli({"report", dir, "--port", "80"});
  CHECK(r.code == 2);
  CHECK(r.err.find("--port and --bind go with --serve") != std::string::npos);
  r = cli({"report", dir, "--serve", "--port", "70000"});
  CHECK(r.code == 2);
  CHECK(r.err.find("expected a port number") != std::string::npos);
  const swept s;
  r = cli({"report", s.out, "--serve", "--bind", "localhost"});
  CHECK(r.code == 2);
  CHECK(r.err.find("--bind localhost: expected an IP address") != std::string::npos);
  // A port in use: the message says so and what to do; the sweep has not started.
  const report_server taken({});
  const std::string& url = taken.url();  // http://127.0.0.1:PORT/?token=...
  const std::string port = std::to_string(std::stoi(url.substr(url.rfind(':') + 1)));
  r = cli({"sweep", "--grid", "x=1", "--out", dir + "/busy", "--no-progress", "--serve", "--port", port, "--", "sh",
           "-c", "echo '{}' {x}"});
  CHECK(r.code == 2);
  CHECK(r.err.find("give another --port") != std::string::npos);
  CHECK_FALSE(fs::exists(dir + "/busy"));  // found before the sweep made its folder
  r = cli({"sweep", "--grid", "x=1", "--backend", "slurm", "--detach", "--serve", "--", "sh", "-c", "echo {x}"});
  CHECK(r.code == 2);
  CHECK(r.err.find("--serve with --detach") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("isorun sweep --serve serves the page while the sweep runs and stops with it") {
  const std::string dir = temp_dir();
  const auto r = isorun::test::run_captured(
      ISORUN_CLI, {"sweep", "--grid", "x=1,2", "--out", dir + "/out", "--no-progress", "--serve", "--", "sh", "-c",
                   "echo \"{\\\"v\\\": $1}\"", "sh", "{x}"});
  INFO(r.err);
  CHECK(r.code == 0);
  const std::string said = "isorun: the report, live: http://127.0.0.1:";
  const auto at = r.err.find(said);
  REQUIRE(at != std::string::npos);
  // Gone with the sweep: nothing listens there now.
  const int port = std::stoi(r.err.substr(at + said.size()));
  const unique_fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  CHECK(::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0);
  fs::remove_all(dir);
}

TEST_CASE("the live page shows a trial that ends while it is open, without a reload", "[browser]") {
  const std::string dir = temp_dir(), started = dir + "/started", gate = dir + "/gate";
  REQUIRE(::mkfifo(started.c_str(), 0600) == 0);
  REQUIRE(::mkfifo(gate.c_str(), 0600) == 0);
  // Two trials, one after the other; the second says it runs, then waits at the gate.
  auto sweep = isorun::test::start_captured(
      ISORUN_CLI,
      {"sweep", "--grid", "x=1,2", "--cpu-slots", "1", "--out", dir + "/out", "--no-progress", "--", "sh", "-c",
       "if [ $1 = 2 ]; then echo > " + started + "; read l < " + gate + "; fi; echo \"{\\\"v\\\": $1}\"", "sh", "{x}"});
  std::string line;
  std::getline(std::ifstream(started), line);  // the second trial runs: the sweep holds its folder
  serving srv(dir + "/out");
  rendered page;
  // The page's timers run on virtual time, fast-forwarded whenever no request is pending; its
  // held poll keeps it waiting for the server in real time.
  std::thread browser(
      [&] { page = in_browser(srv.server.url(), dir + "/profile", "", {"--virtual-time-budget=20000"}); });
  srv.wait_for("held");  // the page is open, and waits for news
  std::ofstream(gate) << "go\n";
  const auto swept = isorun::test::finish_captured(sweep);
  browser.join();
  INFO(swept.err);
  INFO(page.log);
  CHECK(swept.code == 0);
  REQUIRE(page.code == 0);
  CHECK(console_lines(page.log).empty());
  // The second trial's row, drawn by the table's script in the page swapped in, and the page it
  // replaced never reloaded (the count of swaps lives in the first page's script).
  CHECK(page.dom.find("2 trials; page 1 of 1") != std::string::npos);
  CHECK(page.dom.find("data-ready=\"yes\"") != std::string::npos);
  CHECK(page.dom.find("data-live-updates=\"") != std::string::npos);
  CHECK(page.dom.find("live: no sweep runs in this folder now") != std::string::npos);
  fs::remove_all(dir);
}
