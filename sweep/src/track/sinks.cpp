#include "track/sinks.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <linux/sockios.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>

#include "engine/folder.hpp"
#include "isorun/runner/bounded_json.hpp"
#include "isorun/runner/containment.hpp"
#include "isorun/runner/errors.hpp"
#include "isorun/runner/outcome.hpp"
#include "isorun/runner/printable.hpp"
#include "isorun/runner/process.hpp"
#include "isorun/runner/unique_fd.hpp"
#include "isorun/runner/worker_env.hpp"
#include "isorun/sweep/journal.hpp"

namespace isorun::sweep {
namespace fs = std::filesystem;
using nlohmann::json;
using clock = std::chrono::steady_clock;

namespace {

// A tracker that takes no bytes for this long while events wait is taken as hung: killed, and
// started again from the beginning.
constexpr auto stall = std::chrono::seconds(30);
// At the sweep's end, how long a tracker that has taken every event has to exit.
constexpr auto exit_grace = std::chrono::seconds(60);
// Starts before a tracker is given up on; after the k-th failure the next waits 2^(k-1) s.
constexpr int max_starts = 4;
// Events read ahead of what the tracker has taken: the rest wait in the files.
constexpr std::size_t read_ahead = std::size_t{1} << 20;

// A file the sweep appends lines to, followed from its start: each complete line once.
class followed {
 public:
  explicit followed(fs::path path) : path_{std::move(path)} {}

  // Calls `each` with each complete line appended since the last call, reading at most `budget`
  // bytes (more where one line is longer); true if it read to the end.
  bool read_new(const std::function<void(std::string_view)>& each, std::size_t budget) {
    if (!fd_) fd_.reset(::open(path_.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd_) return true;  // not there yet: nothing to read
    for (;;) {
      const detail::lines_read r = detail::read_lines(fd_.get(), journal::max_line, budget, in_long_line_, path_,
                                                      [&](std::string_view line, int, bool too_long) {
                                                        if (!too_long)
                                                          each(line);  // (the journal's readers skip such a line too)
                                                      });
      // A line still being written is read again next time, unless it is already too long to pass on.
      if (!r.long_tail && r.read > r.complete) ::lseek(fd_.get(), -static_cast<off_t>(r.read - r.complete), SEEK_CUR);
      in_long_line_ = r.long_tail;
      // A line longer than the budget, read whole, and none before it: read again, in one go
      // up to the longest line there may be, or it would be read again for ever.
      if (r.complete > 0 || r.read < budget || r.long_tail || budget >= journal::max_line) return r.read < budget;
      budget = journal::max_line;
    }
  }

 private:
  fs::path path_;
  unique_fd fd_;
  bool in_long_line_ = false;
};

// The bytes sent on `fd` that its reader has not read yet (0 on an error).
int queued(int fd) {
  int n = 0;
  return ::ioctl(fd, SIOCOUTQ, &n) == 0 ? n : 0;
}

// Kills the tracker and what it started, and reaps it.
void kill_tracker(runner::child& c) {
  c.signal(SIGKILL);
  c.reap();
}

// A line of OUT/reports.jsonl as an event.
std::optional<json> report_event(std::string_view line) {
  json j = parse_bounded_json(line);
  if (!j.is_object() || !j.contains("trial")) return std::nullopt;
  j["event"] = "report";
  return j;
}

// A line of OUT/events.jsonl (an attempt's start or a committed checkpoint, which says which) as
// an event.
std::optional<json> attempt_event(std::string_view line) {
  json j = parse_bounded_json(line);
  if (!j.is_object() || !j.contains("trial")) return std::nullopt;
  const std::string event = j.value("event", "");
  if (event != "start" && event != "checkpoint") return std::nullopt;
  return j;
}

// A line of OUT/results.jsonl (a trial's record) as an event.
std::optional<json> end_event(std::string_view line) {
  const json j = parse_bounded_json(line);
  if (!j.is_object() || !j.contains("id") || !j["id"].is_string()) return std::nullopt;
  bool final = true;
  try {
    final = final_record(trial_record::from_json(j));
  } catch (const std::exception&) {
  }
  return json{{"event", "end"}, {"trial", j["id"]}, {"final", final}, {"record", j}};
}

// The events in the sweep's folder, in the order they happened: an attempt's start is written
// (OUT/events.jsonl) before its reports (OUT/reports.jsonl) and checkpoints (OUT/events.jsonl),
// and they before its record (OUT/results.jsonl). So the records are read first, then the
// reports, then the starts and checkpoints, and sent in the other order, the reports and records
// held until the starts are read to their end: no trial's report or checkpoint comes before its
// start, nor its end before one of them. (A checkpoint may come before a report made before it.)
class journal_events {
 public:
  explicit journal_events(const fs::path& out)
      : attempts_{out / "events.jsonl"}, reports_{out / "reports.jsonl"}, results_{out / "results.jsonl"} {}

  // Appends to `to` the events written since the last call, as JSON lines; true if every file
  // was read to its end (nothing new is left to send).
  bool read_new(std::string& to) {
    // (A file not read this time, its events still held, was not read to its end.)
    const bool records_all = records_.empty() &&
                             results_.read_new([&](std::string_view l) { add(records_, end_event(l)); }, read_ahead);
    const bool reports_all = held_.size() < read_ahead &&
                             reports_.read_new([&](std::string_view l) { add(held_, report_event(l)); }, read_ahead);
    if (reports_all) {  // every report written before these records is held: they go after them
      held_ += records_;
      records_.clear();
    }
    if (!attempts_.read_new([&](std::string_view l) { add(to, attempt_event(l)); }, read_ahead)) return false;
    to += held_;
    held_.clear();
    return records_all && reports_all;
  }

 private:
  static void add(std::string& to, const std::optional<json>& e) {
    if (e) to += e->dump() + "\n";
  }

  followed attempts_, reports_, results_;
  std::string records_;  // records' events read, held until the reports before them are
  std::string held_;     // reports' and records' events, held until the starts before them are
};

}  // namespace

struct track_sinks::sink {
  track_spec spec;
  fs::path out, folder, err_path;
  json hello;
  unique_fd wake{::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};
  std::mutex mutex;
  std::optional<json> end;  // set by finish(): the sweep has ended
  bool warned = false;
  std::thread thread;

  void run() noexcept;
  // One start of the tracker, fed until the sweep's end: "" if it took everything, else why not.
  std::string serve(int err);
  std::string wind_up(runner::child& c, unique_fd& to, int err);
  runner::child start(int err, unique_fd& to);
  void note(int err, const std::string& what);
  std::optional<json> ended() {
    std::lock_guard lock(mutex);
    return end;
  }
};

void track_sinks::sink::run() noexcept {
  try {
    const unique_fd track = detail::open_subfolders(out, {"track"}, true);
    unique_fd err = detail::open_file(track.get(), spec.name + ".err", O_WRONLY | O_CREAT | O_APPEND, err_path);
    struct stat st = {};
    if (::fstat(err.get(), &st) == 0 && static_cast<std::uint64_t>(st.st_size) >= detail::max_log) [[maybe_unused]]
      int rc = ::ftruncate(err.get(), 0);  // each run appends; a full file starts afresh
    detail::open_subfolder(track.get(), spec.name, true, folder);
    for (int start = 1;; ++start) {
      const std::string why = serve(err.get());
      if (why.empty()) return;
      note(err.get(), why);
      if (ended()) return;  // (not started again for what is left)
      if (start == max_starts) {
        note(err.get(), "failed " + std::to_string(start) + " times: no more events go to it");
        return;
      }
      pollfd p{wake.get(), POLLIN, 0};  // a while before the next start, or until the sweep ends
      ::poll(&p, 1, 1000 << (start - 1));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "isorun: warning: tracker %s: %s; the sweep goes on without it\n", spec.name.c_str(),
                 printable(e.what()).c_str());
  }
}

// Says `what` happened to the tracker in its .err file, and once on the terminal.
void track_sinks::sink::note(int err, const std::string& what) {
  const std::string line = "isorun: tracker " + spec.name + " " + what + "\n";
  [[maybe_unused]] auto n = ::write(err, line.data(), line.size());
  if (std::exchange(warned, true)) return;
  std::fprintf(stderr, "isorun: warning: tracker %s %s; the sweep goes on (its output: %s)\n", spec.name.c_str(),
               printable(what).c_str(), printable(err_path.string()).c_str());
}

// Starts the tracker: its stdin a socket whose other end is `to` (a send to a tracker that has
// gone is an error, not a SIGPIPE), its stdout and stderr `err`.
runner::child track_sinks::sink::start(int err, unique_fd& to) {
  int ends[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends) != 0)
    throw internal_error(std::string("cannot make a tracker's socket: ") + std::strerror(errno));
  unique_fd mine(ends[0]), theirs(ends[1]);
  ::shutdown(theirs.get(), SHUT_WR);  // it only reads
  // A built-in tracker runs in the trials' Python (ISORUN_PYTHON, as the Python API sets it).
  const char* python = std::getenv("ISORUN_PYTHON");
  const std::vector<std::string> argv = spec.command.empty()
                                            ? std::vector<std::string>{python && *python ? python : "python3", "-m",
                                                                       "isorun.track." + spec.name}
                                            : spec.command;
  const auto exe = runner::find_executable(argv.front());
  if (!exe) throw internal_error(argv.front() + " is not found (not an executable file, nor in PATH)");
  runner::spawn_options o;
  o.executable = *exe;
  o.args.assign(argv.begin() + 1, argv.end());
  o.env = runner::inherited_environment();
  o.fds = {{0, theirs.get()}, {1, err}, {2, err}};
  o.cgroup = runner::new_child_cgroup();  // what it starts goes with it
  runner::child c = runner::spawn(o);
  // Below everything the sweep runs (SCHED_IDLE): a tracker takes only CPU time the sweep leaves,
  // and falls behind instead (the journal keeps what it has not read).
  const sched_param idle{};
  ::sched_setscheduler(c.pid(), SCHED_IDLE, &idle);
  ::fcntl(mine.get(), F_SETFL, O_NONBLOCK);
  to = std::move(mine);
  return c;
}

// Everything is sent, the sweep's end last: the tracker reads the rest (while it reads, however
// slowly), sees its input end, and has exit_grace to finish what it does with it.
std::string track_sinks::sink::wind_up(runner::child& c, unique_fd& to, int err) {
  ::shutdown(to.get(), SHUT_WR);
  auto progress = clock::now();
  for (int unread = queued(to.get()); unread > 0;) {
    if (c.wait_for(std::chrono::milliseconds(100))) break;  // (it exited with input unread)
    if (const int now = queued(to.get()); now < unread) {
      unread = now;
      progress = clock::now();
    } else if (clock::now() - progress >= stall) {
      kill_tracker(c);
      return "took no event for " + std::to_string(stall.count()) + " s after the sweep's end: killed";
    }
  }
  if (!c.wait_for(exit_grace)) {
    kill_tracker(c);
    return "did not exit within " + std::to_string(exit_grace.count()) + " s of taking the sweep's end: killed";
  }
  const auto status = c.reap();
  if (!status.success()) note(err, runner::describe(status) + " once given every event");
  return "";
}

std::string track_sinks::sink::serve(int err) {
  unique_fd to;
  runner::child c;
  try {
    c = start(err, to);
  } catch (const std::exception& e) {
    return std::string("cannot be started: ") + e.what();
  }
  const unique_fd changes(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
  if (!changes || ::inotify_add_watch(changes.get(), out.c_str(), IN_MODIFY | IN_CREATE | IN_MOVED_TO) < 0)
    return std::string("cannot be fed: inotify: ") + std::strerror(errno);
  journal_events journal(out);
  std::string pending = hello.dump() + "\n";
  std::size_t sent = 0;
  bool end_sent = false;
  auto progress = clock::now();
  for (;;) {
    const std::optional<json> end = ended();
    if (!end_sent && pending.size() - sent < read_ahead) {
      if (journal.read_new(pending) && end) {
        json last = *end;
        last["event"] = "sweep_end";
        pending += last.dump() + "\n";
        end_sent = true;
      }
    }
    if (sent == pending.size()) {
      pending.clear();
      sent = 0;
      if (end_sent) return wind_up(c, to, err);
    }
    const bool waiting = sent < pending.size();
    pollfd p[4] = {{to.get(), static_cast<short>(waiting ? POLLOUT : 0), 0},
                   {changes.get(), POLLIN, 0},
                   {wake.get(), POLLIN, 0},
                   {c.pidfd(), POLLIN, 0}};
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(progress + stall - clock::now()).count();
    const int n = ::poll(p, 4, waiting ? static_cast<int>(std::max<long long>(left, 0)) : -1);
    if (n < 0 && errno != EINTR) return std::string("cannot be fed: poll: ") + std::strerror(errno);
    if (p[0].revents & (POLLOUT | POLLERR | POLLHUP)) {
      const ssize_t w = ::send(to.get(), pending.data() + sent, pending.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w > 0) {
        sent += static_cast<std::size_t>(w);
        progress = clock::now();
      } else if (w < 0 && errno != EAGAIN && errno != EINTR) {
        const std::string why = std::strerror(errno);
        if (c.wait_for(std::chrono::seconds(1))) return runner::describe(c.reap()) + " before the sweep's end";
        kill_tracker(c);
        return "stopped reading its input (" + why + ") before the sweep's end";
      }
    }
    if (p[1].revents & POLLIN) {
      char drain[4096];
      while (::read(changes.get(), drain, sizeof drain) > 0) {
      }
    }
    if (p[2].revents & POLLIN) {
      std::uint64_t v;
      [[maybe_unused]] auto r = ::read(wake.get(), &v, sizeof v);
    }
    if (p[3].revents & POLLIN) {
      const auto status = c.reap();
      return runner::describe(status) + " before the sweep's end";
    }
    if (waiting && clock::now() - progress >= stall) {
      kill_tracker(c);
      return "took no event for " + std::to_string(stall.count()) + " s: killed";
    }
  }
}

track_sinks::track_sinks(const std::vector<track_spec>& trackers, const fs::path& out, json sweep) {
  for (const auto& t : trackers) {
    auto s = std::make_unique<sink>();
    s->spec = t;
    s->out = out;
    s->folder = out / "track" / t.name;
    s->err_path = out / "track" / (t.name + ".err");
    s->hello = {{"event", "sweep"},    {"protocol", 1},          {"tracker", t.name}, {"folder", s->folder.string()},
                {"out", out.string()}, {"settings", t.settings}, {"sweep", sweep}};
    if (!s->wake) throw internal_error(std::string("cannot make a tracker's eventfd: ") + std::strerror(errno));
    sink* raw = s.get();
    s->thread = std::thread([raw] { raw->run(); });
    sinks_.push_back(std::move(s));
  }
}

track_sinks::~track_sinks() { finish(json::object()); }

void track_sinks::finish(const json& summary) {
  for (auto& s : sinks_) {
    {
      std::lock_guard lock(s->mutex);
      if (!s->end) s->end = summary;
    }
    const std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(s->wake.get(), &one, sizeof one);
  }
  for (auto& s : sinks_)
    if (s->thread.joinable()) s->thread.join();
}

}  // namespace isorun::sweep
