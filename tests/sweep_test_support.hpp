#pragma once
// What the sweep tests share: temporary folders, the CLI run as a child, the test tasks' library,
// specs of step trials, and reading what a sweep left.
#include <catch2/catch.hpp>

#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "isorun/runner/errors.hpp"
#include "isorun/runner/process.hpp"
#include "isorun/sweep/html_report.hpp"
#include "isorun/sweep/slurm.hpp"
#include "isorun/sweep/sweep.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;
namespace sw = isorun::sweep;
using nlohmann::json;

inline std::string temp_dir() {
  char dir[] = "/tmp/isorun-sweep-test-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  return dir;
}

inline std::vector<std::string> lines(const fs::path& p) {
  std::ifstream in(p);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// Blocks until `path` holds at least `n` lines (inotify; a 30 s bound turns a hang into a failure).
inline bool wait_for_lines(const std::string& path, std::size_t n) {
  int fd = ::inotify_init1(IN_CLOEXEC);
  ::inotify_add_watch(fd, path.c_str(), IN_MODIFY);
  bool ok = true;
  while (lines(path).size() < n) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 30000) != 1) {
      ok = false;
      break;
    }
    char buf[4096];
    [[maybe_unused]] auto r = ::read(fd, buf, sizeof buf);
  }
  ::close(fd);
  return ok;
}

/// The environment under which every fsync of a file whose path ends in `suffix` fails with EIO
/// after the first `after` (tests/helpers' fail_fsync library). The library goes before a
/// sanitizer runtime, which must then be told not to mind.
inline std::vector<std::string> failing_fsync(const std::string& suffix, int after) {
  const char* asan = std::getenv("ASAN_OPTIONS");
  return {std::string("LD_PRELOAD=") + FAIL_FSYNC, "FAIL_FSYNC_SUFFIX=" + suffix,
          "FAIL_FSYNC_AFTER=" + std::to_string(after),
          std::string("ASAN_OPTIONS=") + (asan ? std::string(asan) + ":" : "") + "verify_asan_link_order=0"};
}

inline void load_test_tasks() {
  static bool loaded = ::dlopen(SWEEP_TEST_TASKS, RTLD_NOW | RTLD_GLOBAL) != nullptr;
  REQUIRE(loaded);
}

inline int spec_line(const std::string& yaml) {
  try {
    sw::parse_spec(yaml, "t.yaml");
  } catch (const sw::spec_error& e) {
    return e.line();
  }
  return -1;
}

struct cli_run {
  isorun::runner::child process;
  int code = -1;
};

inline isorun::runner::child start_cli(const std::vector<std::string>& args, const std::vector<std::string>& env) {
  isorun::runner::spawn_options o;
  o.executable = ISORUN_CLI;
  o.args = args;
  o.env = isorun::test::test_environment(env);
  int devnull = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  o.fds = {{1, devnull}, {2, devnull}};
  auto c = isorun::runner::spawn(o);
  ::close(devnull);
  return c;
}

// A sweep spec of `n` step trials writing their completions to `log`.
inline std::string step_spec(int n, const std::string& log, const std::string& out) {
  std::string s = "task: step\nmetric: {name: score, goal: maximize}\nparams:\n  i: [";
  for (int i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(i);
  return s + "]\n  log: \"" + log + "\"\nresources: {cpu_slots: 1}\nout: \"" + out + "\"\n";
}

inline isorun::test::captured sweep_cli(const std::vector<std::string>& args,
                                        const std::vector<std::string>& env = {}) {
  std::vector<std::string> a = {"--tasks", SWEEP_TEST_TASKS};
  a.insert(a.end(), args.begin(), args.end());
  return isorun::test::run_captured(ISORUN_CLI, a, env);
}

// Reads `fd` until `text` appears (true) or EOF (false); returns what was read in `seen`.
inline bool read_until(int fd, const std::string& text, std::string& seen) {
  char buf[512];
  while (seen.find(text) == std::string::npos) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) return false;
    seen.append(buf, static_cast<std::size_t>(n));
  }
  return true;
}

// A python3 that has NumPy (the PATH's, or Debian's), for the Python example; "" if none.
inline std::string python_with_numpy() {
  for (const std::string py : {"python3", "/usr/bin/python3"}) {
    auto r = isorun::test::run_captured("/bin/sh", {"-c", py + " -c 'import numpy' 2>/dev/null"});
    if (r.code == 0) return py;
  }
  return "";
}

inline json read_journal(const fs::path& file) {
  json by_id = json::object();
  for (const auto& l : lines(file)) {
    auto j = json::parse(l);
    by_id[j["params"].dump()] = j;
  }
  return by_id;
}

// How many times `what` occurs in `text`.
inline std::size_t occurrences(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

inline std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

// ---- Pages in a browser: the [browser] cases, which tests/browser_test.sh runs with headless
// Chromium ----

struct rendered {
  int code = -1;
  std::string dom, log;
};

/// @brief The page at `url` as headless Chromium leaves it once its scripts have run (or, with
///        `png`, a screenshot of it), and what it logged. `extra`: more of Chromium's flags.
inline rendered in_browser(const std::string& url, const std::string& profile, const std::string& png = "",
                           const std::vector<std::string>& extra = {}) {
  const char* browser = std::getenv("ISORUN_TEST_BROWSER");
  REQUIRE(browser);
  std::vector<std::string> args = {
      "--headless", "--no-sandbox",           "--disable-gpu", "--user-data-dir=" + profile, "--enable-logging=stderr",
      "--v=0",      "--window-size=1200,3000"};
  args.insert(args.end(), extra.begin(), extra.end());
  args.push_back(png.empty() ? "--dump-dom" : "--screenshot=" + png);
  args.push_back(url);
  auto r = isorun::test::run_captured(browser, args);
  return {r.code, r.out, r.err};
}

/// @brief Console messages Chromium logged for a page: errors thrown by its script, or anything
///        it printed (isorun's pages print nothing).
inline std::vector<std::string> console_lines(const std::string& log) {
  std::vector<std::string> out;
  std::istringstream in(log);
  for (std::string line; std::getline(in, line);)
    if (line.find("CONSOLE") != std::string::npos || line.find("Uncaught") != std::string::npos) out.push_back(line);
  return out;
}
