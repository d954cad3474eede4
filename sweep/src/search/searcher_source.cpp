// A trial source that asks a searcher program (searcher_source.hpp).
#include "search/searcher_source.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

#include "engine/folder.hpp"
#include "isorun/runner/bounded_json.hpp"
#include "isorun/runner/containment.hpp"
#include "isorun/runner/errors.hpp"
#include "isorun/runner/printable.hpp"
#include "isorun/runner/process.hpp"
#include "isorun/runner/stream_tail.hpp"
#include "isorun/runner/worker_env.hpp"
#include "isorun/sweep/errors.hpp"
#include "isorun/sweep/journal.hpp"
#include "trials/python_trials.hpp"

namespace isorun::sweep {

namespace {
using nlohmann::json;
using clock = std::chrono::steady_clock;

constexpr const char* conversation_file = "search.jsonl";
constexpr const char* stderr_file = "search.err";
constexpr std::size_t max_answer = 1 << 20;
// A line of search.jsonl: as long as a line of the journal may be, since a tell carries the trial's
// result. What log() writes is within it, so that a resume replays every line it wrote (a line
// it skipped would be a tell told and journaled again on each resume).
constexpr std::size_t max_line = journal::max_line;
constexpr int protocol = 1;
// Ask numbers go up to the budget (search: trials:, an int).
constexpr std::uint64_t max_asks = std::numeric_limits<int>::max();

std::string words(const std::vector<std::string>& argv) {
  std::string all;
  for (const auto& w : argv) all += (all.empty() ? "" : " ") + w;
  return all;
}

// What is wrong with `params` as the parameters of a trial the searcher chose, or "": an object
// with every name `declared` (search: params:) and no other, each a number, a string or a
// boolean. Live answers and replayed ones are checked alike.
std::string params_problem(const json& params, const json& declared) {
  if (!params.is_object()) return "parameters that are not an object: " + printable(params.dump().substr(0, 80));
  for (const auto& [k, v] : params.items()) {
    if (!declared.empty() && !declared.contains(k))
      return "parameter '" + printable(k) + "', which search: params: does not declare";
    if (v.is_object() || v.is_array() || v.is_null())
      return "parameter '" + printable(k) + "' as " + printable(v.dump().substr(0, 80)) +
             "; a parameter is a number, a string or a boolean";
  }
  // (Else the trial would run with a placeholder of its command or an argument of its function missing.)
  for (const auto& [k, d] : declared.items())
    if (!params.contains(k))
      return "no parameter '" + printable(k) + "', which search: params: declares (every trial gets each one)";
  return "";
}
}  // namespace

std::vector<std::string> searcher_command(const sweep_spec& s) {
  if (s.search.type == "optuna") return {python_trials::interpreter(), "-m", "isorun.search.optuna"};
  return s.search.command;
}

void check_searcher(const sweep_spec& s) {
  if (!s.search) return;
  const auto at = [&](const std::string& what) {
    return spec_error((s.source.empty() ? "" : s.source + ": ") + "line " + std::to_string(s.search.line) + ": " + what,
                      s.search.line);
  };
  if (s.search.type == "command") {
    if (!runner::find_executable(s.search.command.front()))
      throw at("search command '" + s.search.command.front() + "' is not found (not an executable file, nor in PATH)");
    return;
  }
  std::string python;
  try {
    python = python_trials::interpreter();
  } catch (const usage_error& e) {
    throw at(std::string("search type optuna runs Optuna in Python: ") + e.what());
  }
  auto r = runner::run_to_end(python, {"-c", "import optuna, isorun.search.optuna"}, runner::inherited_environment());
  if (r.code != 0)
    throw at("search type optuna needs Optuna and the isorun package in " + python + " (" +
             python_trials::last_line(r.err) +
             "); install it there: pip install optuna (or pip install 'isorun[optuna]'), or set ISORUN_PYTHON");
  // What the sampler needs beyond Optuna (CMA-ES's cmaes, the GP sampler's torch).
  r = runner::run_to_end(python,
                         {"-c", "import sys, isorun.search.optuna as o; o.check(sys.argv[1])", s.search.sampler},
                         runner::inherited_environment());
  if (r.code != 0)
    throw at("search sampler " + s.search.sampler + ": " + python_trials::last_line(r.err) + " (in " + python + ")");
}

searcher_source::searcher_source(searcher_setup setup) : setup_{std::move(setup)} {
  const unique_fd dir = detail::open_folder(setup_.out);
  if (!dir) throw internal_error("cannot open " + setup_.out.string());
  const std::vector<json> earlier = read_conversation(dir.get());
  start(copy_stderr(dir.get()));
  greet(earlier.size());
  replay(earlier);
  // Every trial proposed is given out again first; the sweep leaves out those its journal holds
  // as done. (One the searcher was told of may not be: a stop between the tell and the journal's
  // write. It runs again, and the searcher keeps what it heard.)
  quit_ = unique_fd(::eventfd(0, EFD_CLOEXEC));
  if (!quit_) throw internal_error(std::string("cannot make an eventfd for the searcher: ") + std::strerror(errno));
  thread_ = std::thread([this] { converse(); });
}

// What an earlier run said to the searcher, and it answered, in order. Each line is checked first,
// as a live answer is: nothing starts for a file that is not what isorun wrote.
std::vector<json> searcher_source::read_conversation(int dir) {
  log_ = detail::open_file(dir, conversation_file, O_RDWR | O_CREAT | O_APPEND, setup_.out / conversation_file);
  std::vector<json> earlier;
  const auto take = [&](std::string_view line, int number, bool too_long) {
    if (too_long) replay_failed(number, "is longer than " + std::to_string(max_line >> 20) + " MiB");
    json j = parse_bounded_json(line);
    if (!j.is_object()) replay_failed(number, "is not a JSON object");
    if (!j.contains("ask") && !j.contains("tell")) return;  // (a later version's: this one says nothing of it)
    check_replayed(j, number);
    earlier.push_back(std::move(j));
  };
  const std::size_t complete = detail::for_each_line(log_.get(), max_line, setup_.out / conversation_file, take);
  detail::drop_cut_line(log_.get(), complete, setup_.out / conversation_file);
  return earlier;
}

// The searcher's stderr goes through a pipe this process copies into OUT/search.err, so that the
// file stays within detail::max_log a run (the searcher's own descendants write there too). Each
// run appends; a file that has reached the bound starts afresh. Returns the pipe's write end.
unique_fd searcher_source::copy_stderr(int dir) {
  unique_fd err = detail::open_file(dir, stderr_file, O_WRONLY | O_CREAT | O_APPEND, setup_.out / stderr_file);
  struct stat st = {};
  const bool full = ::fstat(err.get(), &st) == 0 && static_cast<std::uint64_t>(st.st_size) >= detail::max_log;
  if (full && ::ftruncate(err.get(), 0) != 0)
    throw internal_error("cannot empty " + (setup_.out / stderr_file).string() + ": " + std::strerror(errno));
  int pipe_ends[2];
  if (::pipe2(pipe_ends, O_CLOEXEC) != 0)
    throw internal_error(std::string("cannot make the searcher's stderr pipe: ") + std::strerror(errno));
  unique_fd err_read(pipe_ends[0]), err_write(pipe_ends[1]);
  ::fcntl(err_read.get(), F_SETFL, O_NONBLOCK);
  stderr_ = std::make_unique<stderr_copy>(std::move(err_read), std::move(err));
  return err_write;
}

// Starts the searcher, its stderr into `err_write`. Its stdin and stdout are one socket: a message
// to a searcher that has exited is then an error to report (send with MSG_NOSIGNAL), not a
// SIGPIPE that would end isorun.
void searcher_source::start(unique_fd err_write) {
  int ends[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends) != 0)
    throw internal_error(std::string("cannot make the searcher's socket: ") + std::strerror(errno));
  unique_fd mine(ends[0]), theirs(ends[1]);
  const auto exe = runner::find_executable(setup_.argv.front());
  if (!exe) fail("is not found (not an executable file, nor in PATH)");
  runner::spawn_options o;
  o.executable = *exe;
  o.args.assign(setup_.argv.begin() + 1, setup_.argv.end());
  o.env = runner::inherited_environment();
  o.fds = {{0, theirs.get()}, {1, theirs.get()}, {2, err_write.get()}};
  // A process group of its own (spawn's default) and, where children are contained so, a cgroup:
  // what it starts goes with it when it is reaped (at its exit or the sweep's end), also a
  // descendant that left the group with setsid().
  o.cgroup = runner::new_child_cgroup();
  try {
    process_ = std::make_unique<runner::child>(runner::spawn(o));
  } catch (const std::exception& e) {
    fail(std::string("cannot be started: ") + e.what());
  }
  theirs.reset();  // the searcher's (and its descendants') alone now: its exit is watched too (exchange)
  err_write.reset();
  to_ = std::move(mine);
}

// The protocol's first message: what is searched, and how many lines of an earlier conversation follow.
void searcher_source::greet(std::size_t replayed) {
  const search_spec& search = setup_.spec->search;
  json objectives = json::array();
  for (const auto& m : search.objectives)
    objectives.push_back({{"name", m.name}, {"goal", m.maximize ? "maximize" : "minimize"}});
  json settings = {{"type", search.type}, {"sampler", search.sampler}, {"params", search.params}};
  if (search.seed) settings["seed"] = *search.seed;
  exchange({{"op", "hello"},
            {"protocol", protocol},
            {"objectives", objectives},
            {"trials", search.trials},
            {"slots", setup_.slots},
            {"search", settings},
            {"replay", replayed}});
}

// The conversation again, as it went: each ask answered as before (a seeded searcher does), each
// tell told again.
void searcher_source::replay(const std::vector<json>& earlier) {
  bool differed = false;
  for (const auto& line : earlier) {
    if (line.contains("ask")) {  // (both checked: check_replayed)
      const auto number = line["ask"].get<std::size_t>();
      const json& params = line["params"];
      // (With what it answered then: a searcher that would not propose it again keeps it.)
      const json answer = exchange({{"op", "ask"}, {"number", number}, {"replay", true}, {"params", params}});
      if (!answer.contains("params") || answer["params"] != params) differed = true;
      const new_trial t = made(number, params);
      number_of_[t.id] = number;
      searched_[t.id] = params;
      asked_ = std::max(asked_, number + 1);
      pending_.push_back(t);
    } else {
      json message = line;
      message.erase("tell");
      message["op"] = "tell";
      message["replay"] = true;
      exchange(message);
      told_.insert(line["id"].get<std::string>());
    }
  }
  if (differed)
    std::fprintf(stderr,
                 "isorun: warning: the searcher (%s) did not propose again what it proposed before; the trials it "
                 "proposed then are kept\n",
                 printable(words(setup_.argv)).c_str());
}

searcher_source::~searcher_source() {
  if (thread_.joinable()) {
    {
      std::lock_guard lock(mutex_);
      quit_asked_ = true;
    }
    queued_.notify_all();
    const std::uint64_t one = 1;
    [[maybe_unused]] const auto n = ::write(quit_.get(), &one, sizeof one);  // ends a wait for an answer
    thread_.join();
  }
  to_.reset();  // its stdin ends: a searcher reading it exits
  if (process_) process_->stop(runner::stop_plan::graceful(std::chrono::seconds(2)));
}

searcher_source::stderr_copy::stderr_copy(unique_fd from, unique_fd to)
    : from_{std::move(from)}, to_{std::move(to)}, stop_{::eventfd(0, EFD_CLOEXEC)} {
  if (!stop_)
    throw internal_error(std::string("cannot make an eventfd for the searcher's stderr: ") + std::strerror(errno));
  thread_ = std::thread([this] { run(); });
}

searcher_source::stderr_copy::~stderr_copy() {
  const std::uint64_t one = 1;
  [[maybe_unused]] const auto n = ::write(stop_.get(), &one, sizeof one);
  thread_.join();
}

void searcher_source::stderr_copy::run() {
  runner::detail::capped_echo file(to_.get(), detail::max_log);
  for (;;) {
    pollfd p[2] = {{from_.get(), POLLIN, 0}, {stop_.get(), POLLIN, 0}};
    if (::poll(p, 2, -1) < 0 && errno != EINTR) return;
    // (Stopped once what it started is gone too, where a cgroup holds them: nothing more comes.)
    if (!runner::detail::drain(from_.get(), nullptr, file) || p[1].revents) return;
  }
}

void searcher_source::on_ready(const std::function<void()>& wake) {
  std::lock_guard lock(wake_mutex_);
  wake_ = wake;
}

void searcher_source::wake() {
  std::lock_guard lock(wake_mutex_);
  if (wake_) wake_();
}

// The thread: sends what the sweep queued, in order, each tell journaled first, and takes each
// ask's answer as a trial ready for next(); wakes the sweep after each message, and stops the
// conversation at the first failure, which next() and tell() then throw.
void searcher_source::converse() {
  for (;;) {
    outgoing out;
    {
      std::unique_lock lock(mutex_);
      queued_.wait(lock, [&] { return quit_asked_ || !queue_.empty(); });
      if (quit_asked_) return;
      out = std::move(queue_.front());
      queue_.pop_front();
      sending_ = true;
    }
    try {
      if (!out.line.is_null()) {  // first: a tell the searcher heard is one a resumed sweep replays
        if (log(out.line) == logged::too_long) {
          // Its result left out, in the line and in what the searcher hears alike (a replay tells
          // what was told): all of it is in the journal's record.
          out.line["result"] = out.message["result"] = nullptr;
          log(out.line);  // (which fits: its parameters are an answer's, at most 1 MiB)
        }
      }
      const json answer = exchange(out.message);
      if (answer.is_null()) return;  // the source is being destroyed
      const bool ask = out.line.is_null();
      const std::size_t number = out.message.value("number", std::size_t{0});
      answer_to_ask got = ask ? answered(number, answer) : answer_to_ask{};  // (checked and journaled unlocked)
      std::lock_guard lock(mutex_);
      sending_ = false;
      if (ask) {
        asking_ = false;
        done_ = done_ || got.done;
        // Wait until the next tell: one queued since the ask was, which it had not heard, counts.
        waiting_ = got.wait && tells_ == out.tells;
        if (got.trial) {
          asked_ = number + 1;
          number_of_[got.trial->id] = number;
          searched_[got.trial->id] = got.params;
          ready_.push_back(std::move(*got.trial));
        }
      }
    } catch (...) {
      {
        std::lock_guard lock(mutex_);
        sending_ = asking_ = false;
        queue_.clear();
        error_ = std::current_exception();
      }
      wake();
      return;
    }
    wake();
  }
}

[[noreturn]] void searcher_source::fail(const std::string& what) const {
  throw search_error("the searcher (" + words(setup_.argv) + ") " + what + "; its stderr is in " +
                     (setup_.out / stderr_file).string());
}

[[noreturn]] void searcher_source::replay_failed(int line, const std::string& what) const {
  throw search_error((setup_.out / conversation_file).string() + " line " + std::to_string(line) + " " + what +
                     "; a resumed search replays that file as isorun wrote it: restore it, or " +
                     std::string(detail::another_out));
}

// A line of search.jsonl as isorun writes it: {"ask": N, "params": {...}, ...}, the parameters
// as a live answer's are checked, or {"tell": N, "id": "...", ...}.
void searcher_source::check_replayed(const json& line, int number) const {
  const bool ask = line.contains("ask");
  const json& n = line[ask ? "ask" : "tell"];
  if (!n.is_number_unsigned() || n.get<std::uint64_t>() >= max_asks)
    replay_failed(number, std::string(ask ? "asks" : "tells") + " " + printable(n.dump().substr(0, 80)) +
                              ", where the ask's number is a whole number from 0");
  if (ask) {
    const auto params = line.find("params");
    if (params == line.end()) replay_failed(number, "is an ask without its params");
    if (const std::string problem = params_problem(*params, setup_.spec->search.params); !problem.empty())
      replay_failed(number, "holds " + problem);
  } else if (const auto id = line.find("id"); id == line.end() || !id->is_string()) {
    replay_failed(number, "is a tell without the trial's id (a string)");
  }
}

[[noreturn]] void searcher_source::exited(const std::string& instead_of) {
  const auto status = process_->stop(runner::stop_plan::graceful(std::chrono::seconds(1)));
  fail("exited (" +
       (status.signal ? "signal " + std::to_string(status.signal) : "status " + std::to_string(status.code)) +
       ") instead of " + instead_of);
}

json searcher_source::exchange(const json& message) {
  const std::string line = message.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  const auto deadline = clock::now() + setup_.spec->search.timeout;
  enum class waited { ready, exited, quit };
  // Waits for `events` on the socket until the deadline. The searcher's own exit (its pidfd) ends
  // the wait too: a descendant holding its stdout keeps the socket open, and must neither stand in
  // for it nor hide its exit until the timeout. `quit`: the source is being destroyed (its
  // eventfd written).
  const auto ready = [&](short events, const char* doing) {
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
      if (left <= 0)
        fail("did not " + std::string(doing) + " " + printable(message.value("op", "")) + " within " +
             std::to_string(setup_.spec->search.timeout.count()) + " ms (search: timeout)");
      pollfd p[3] = {{to_.get(), events, 0}, {quit_ ? quit_.get() : -1, POLLIN, 0}, {process_->pidfd(), POLLIN, 0}};
      const int rc = ::poll(p, 3, static_cast<int>(std::min<long long>(left, 1 << 30)));
      if (rc < 0 && errno != EINTR) fail(std::string("cannot be reached: ") + std::strerror(errno));
      if (rc <= 0) continue;
      if (p[1].revents) return waited::quit;
      return p[0].revents ? waited::ready : waited::exited;
    }
  };
  // Sent without blocking: a searcher that stops reading holds the sweep no longer than its timeout.
  for (std::size_t sent = 0; sent < line.size();) {
    const ssize_t n = ::send(to_.get(), line.data() + sent, line.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const waited w = ready(POLLOUT, "read");
      if (w == waited::quit) return nullptr;
      if (w == waited::exited) exited("reading " + printable(message.value("op", "")));
      continue;
    }
    if (n <= 0) exited("reading " + printable(message.value("op", "")));
    sent += static_cast<std::size_t>(n);
  }
  for (;;) {
    if (const auto nl = buffer_.find('\n'); nl != std::string::npos) {
      std::string answer = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      json j = parse_bounded_json(answer);
      if (!j.is_object())
        fail("answered " + printable(message.value("op", "")) +
             " with a line that is not a JSON object: " + printable(answer.substr(0, 200)));
      return j;
    }
    if (buffer_.size() > max_answer) fail("answered with a line longer than 1 MiB");
    const waited w = ready(POLLIN, "answer");
    if (w == waited::quit) return nullptr;  // the source is being destroyed: no answer is waited for
    char buf[1 << 14];
    // (Once it has exited, what it wrote is in the socket: an answer it gave before is still read.)
    const ssize_t n = ::recv(to_.get(), buf, sizeof buf, MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && w == waited::ready) continue;
    if (n <= 0) exited("answering " + printable(message.value("op", "")));
    buffer_.append(buf, static_cast<std::size_t>(n));
  }
}

searcher_source::logged searcher_source::log(const json& line) {
  const std::string text = line.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  if (text.size() > max_line) return logged::too_long;  // (with its newline: within what is read back)
  if (detail::write_all(log_.get(), text) != 0 || ::fdatasync(log_.get()) != 0)
    throw internal_error("cannot write " + (setup_.out / conversation_file).string() + ": " + std::strerror(errno));
  return logged::written;
}

new_trial searcher_source::made(std::size_t number, const json& params) const {
  json all = setup_.spec->search_constants;
  for (const auto& [k, v] : params.items()) all[k] = v;
  // The number makes the id: a searcher may propose the same parameters twice.
  return {setup_.first_index + number, trial_id(setup_.subject, json{{"search", number}, {"params", all}}), all};
}

std::optional<new_trial> searcher_source::next() {
  std::lock_guard lock(mutex_);
  if (error_) std::rethrow_exception(error_);
  for (auto* from : {&pending_, &ready_})
    if (!from->empty()) {
      new_trial t = std::move(from->front());
      from->pop_front();
      return t;
    }
  if (asking_ || waiting_ || done_ || asked_ >= static_cast<std::size_t>(setup_.spec->search.trials))
    return std::nullopt;
  asking_ = true;  // answered on the thread, which wakes the sweep then
  queue_.push_back({{{"op", "ask"}, {"number", asked_}}, nullptr, tells_});
  queued_.notify_one();
  return std::nullopt;
}

// The answer to ask `number`, checked; a trial's ask journaled.
searcher_source::answer_to_ask searcher_source::answered(std::size_t number, const json& answer) {
  answer_to_ask got;
  // {"done": true} and {"wait": true}: a flag that is there is a boolean.
  const auto flag = [&](const char* name) {
    const auto it = answer.find(name);
    if (it == answer.end()) return false;
    if (!it->is_boolean())
      fail("answered ask with " + printable(answer.dump().substr(0, 200)) + ", where \"" + name +
           "\" takes true or false");
    return it->get<bool>();
  };
  got.done = flag("done");
  got.wait = !got.done && flag("wait");
  if (got.done || got.wait) return got;
  const auto params = answer.find("params");
  if (params == answer.end() || !params->is_object())
    fail("answered ask with " + printable(answer.dump().substr(0, 200)) +
         ", which is none of {\"params\": {...}}, {\"wait\": true}, {\"done\": true}");
  if (const std::string problem = params_problem(*params, setup_.spec->search.params); !problem.empty())
    fail("proposed " + problem);
  got.trial = made(number, *params);
  got.params = *params;
  log({{"ask", number}, {"id", got.trial->id}, {"params", *params}});
  return got;
}

bool searcher_source::exhausted() const {
  std::lock_guard lock(mutex_);
  return pending_.empty() && ready_.empty() && !asking_ &&
         (done_ || asked_ >= static_cast<std::size_t>(setup_.spec->search.trials));
}

bool searcher_source::busy() const {
  std::lock_guard lock(mutex_);
  return !error_ && (asking_ || sending_ || !queue_.empty());
}

json searcher_source::tell_message(std::size_t number, const json& params, const trial_record& r) const {
  json values = json::array();
  for (const auto& m : setup_.spec->search.objectives) {
    const auto v = r.result.is_object() ? r.result.find(m.name) : r.result.end();
    values.push_back(r.result.is_object() && v != r.result.end() && v->is_number() ? *v : json());
  }
  json message = {{"op", "tell"},
                  {"number", number},
                  {"id", r.id},
                  {"params", params},
                  {"outcome", std::string(outcome_name(r))},
                  {"values", values},
                  {"result", r.result}};
  if (r.step >= 0) message["step"] = r.step;
  return message;
}

void searcher_source::tell(const trial_record& record) {
  std::lock_guard lock(mutex_);
  if (error_) std::rethrow_exception(error_);
  const auto it = number_of_.find(record.id);
  if (it == number_of_.end() || !told_.insert(record.id).second) return;  // not its trial, or told already
  json message = tell_message(it->second, searched_[record.id], record);
  json line = message;
  line.erase("op");
  line["tell"] = it->second;
  waiting_ = false;  // (a searcher that answered wait is asked again after a tell)
  ++tells_;
  queue_.push_back({std::move(message), std::move(line)});
  queued_.notify_one();
}

}  // namespace isorun::sweep
