// Running a sweep: slot threads take trials from one queue (work-conserving), each trial runs
// in a fresh capped worker, every final outcome is appended to the journal and fsync'ed before
// it counts. Re-running resumes from the journal.
#include <fcntl.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "isorun/errors.hpp"
#include "isorun/job.hpp"
#include "worker_env.hpp"
#include "isorun/sweep.hpp"
#include "isorun/task.hpp"
#include "isorun/unique_fd.hpp"
#include "isorun/units.hpp"
#include "suggest.hpp"
#include "task_params.hpp"

namespace isorun::sweeps {

std::string trial_id(const std::string& task, const nlohmann::json& params) {
  const std::string canonical = task + "\n" + params.dump();  // object keys are sorted
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(XXH3_64bits(canonical.data(), canonical.size())));
  return buf;
}

metric_spec parse_metric_flag(const std::string& text) {
  metric_spec m;
  const auto colon = text.rfind(':');
  m.name = text.substr(0, colon);
  if (colon != std::string::npos) {
    const std::string goal = text.substr(colon + 1);
    if (goal == "min" || goal == "minimize") m.maximize = false;
    else if (goal != "max" && goal != "maximize")
      throw spec_error("--metric " + text + ": the goal after ':' is min or max", 0);
  }
  if (m.name.empty()) throw spec_error("--metric " + text + ": expected NAME[:min|max], e.g. accuracy:max", 0);
  return m;
}

namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using clock = std::chrono::steady_clock;

std::atomic<int> stop_count{0};
std::atomic<int> stop_fd{-1};

void write_all(int fd, const std::string& s) {
  const char* p = s.data();
  std::size_t n = s.size();
  while (n) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw internal_error(std::string("cannot write the sweep journal: ") + std::strerror(errno));
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

void write_file_durably(const fs::path& path, const std::string& content) {
  const fs::path tmp = path.string() + ".tmp";
  unique_fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd) throw internal_error("cannot write " + tmp.string() + ": " + std::strerror(errno));
  write_all(fd.get(), content);
  ::fsync(fd.get());
  fd.reset();
  fs::rename(tmp, path);
}

std::string fingerprint(const spec& s) {
  std::string all = s.task;
  for (const auto& t : s.trials) all += "\n" + trial_id(s.task, t);
  return trial_id(s.task, json(all));
}

std::string csv_field(const json& v) {
  std::string s = v.is_string() ? v.get<std::string>() : v.is_null() ? "" : v.dump();
  if (s.find_first_of(",\"\n") != std::string::npos) {
    std::string q = "\"";
    for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
    return q + "\"";
  }
  return s;
}

std::string param_words(const json& params, std::vector<std::string>& words) {
  std::string desc;
  for (auto it = params.begin(); it != params.end(); ++it) {
    const std::string text = it.value().is_string() ? it.value().get<std::string>() : it.value().dump();
    words.push_back(it.key() + "=" + text);
    desc += (desc.empty() ? "" : " ") + it.key() + "=" + text;
  }
  return desc;
}

std::optional<double> metric_of(const spec& s, const trial_record& r) {
  if (r.kind != outcome_kind::success || s.metric.name.empty()) return std::nullopt;
  if (r.result.is_object() && r.result.contains(s.metric.name) && r.result[s.metric.name].is_number())
    return r.result[s.metric.name].get<double>();
  return std::nullopt;
}

// A spec error located in the spec: "FILE: line N: what" (as much of it as is known).
spec_error located(const spec& s, int line, const std::string& what) {
  std::string where = s.source.empty() ? "" : s.source + ": ";
  if (line > 0) where += "line " + std::to_string(line) + ": ";
  return spec_error(where + what, line);
}

// Why `result` cannot be ranked by the metric, or "" if it can.
std::string metric_problem(const spec& s, const json& result, const std::string& whose) {
  const std::string& name = s.metric.name;
  if (!result.is_object())
    return "metric '" + name + "': the result of " + whose + " is " + std::string(result.type_name()) +
           ", not an object with fields; drop metric: to rank by wall time";
  std::vector<std::string> numeric, all;
  for (auto it = result.begin(); it != result.end(); ++it) {
    all.push_back(it.key());
    if (it.value().is_number()) numeric.push_back(it.key());
  }
  auto listing = [](const std::vector<std::string>& names) {
    std::string out;
    for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
    return out.empty() ? std::string("none") : out;
  };
  if (!result.contains(name))
    return "metric '" + name + "' is not a field of the result of " + whose + did_you_mean(name, numeric) +
           "; its numeric fields: " + listing(numeric);
  if (!result[name].is_number())
    return "metric '" + name + "' is a " + std::string(result[name].type_name()) + " in the result of " + whose +
           ", not a number; numeric fields: " + listing(numeric);
  return "";
}

// The output folder's lock: flock, so the kernel releases it when its holder dies.
unique_fd lock_output(const fs::path& out, bool wait) {
  const fs::path path = out / "sweep.lock";
  unique_fd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!fd) throw internal_error("cannot open " + path.string() + ": " + std::strerror(errno));
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK) throw internal_error("cannot lock " + path.string() + ": " + std::strerror(errno));
    char holder[64] = {};
    [[maybe_unused]] auto n = ::pread(fd.get(), holder, sizeof holder - 1, 0);
    std::string who = holder;
    while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
    if (!wait)
      throw usage_error("output folder " + out.string() + " is in use by another sweep (" +
                        (who.empty() ? std::string("its pid is unknown") : "pid " + who) +
                        "); wait for it to finish, pass --wait to wait for it, or choose another --out");
    std::fprintf(stderr, "isorun: waiting for the sweep using %s (pid %s) to finish\n", out.c_str(), who.c_str());
    while (::flock(fd.get(), LOCK_EX) != 0)
      if (errno != EINTR) throw internal_error("cannot lock " + path.string() + ": " + std::strerror(errno));
  }
  const std::string me = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd.get(), 0) == 0) {
    [[maybe_unused]] auto n = ::pwrite(fd.get(), me.data(), me.size(), 0);
  }
  return fd;
}

// Numbers of one column printed with the same decimals, right-aligned.
std::vector<std::string> aligned(const std::vector<double>& values) {
  double most = 0;
  for (double v : values) most = std::max(most, std::abs(v));
  const bool scientific = most != 0 && (most < 1e-3 || most >= 1e9);
  const int decimals = most >= 1 ? std::max(0, 5 - static_cast<int>(std::floor(std::log10(most)))) : 6;
  std::vector<std::string> out;
  std::size_t width = 0;
  for (double v : values) {
    char buf[64];
    if (scientific) std::snprintf(buf, sizeof buf, "%.4e", v);
    else std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
    out.emplace_back(buf);
    width = std::max(width, out.back().size());
  }
  for (auto& t : out) t.insert(0, width - t.size(), ' ');
  return out;
}

std::string duration(double seconds) {
  char buf[32];
  if (seconds < 60) std::snprintf(buf, sizeof buf, "%.0fs", seconds);
  else std::snprintf(buf, sizeof buf, "%dm%02ds", static_cast<int>(seconds) / 60, static_cast<int>(seconds) % 60);
  return buf;
}

}  // namespace

json trial_record::to_json() const {
  json j = {{"id", id},         {"params", params}, {"outcome", std::string(to_string(kind))},
            {"attempts", attempts}, {"wall_s", wall_s}, {"device", device},
            {"slot", slot},     {"peak_reserved", peak_reserved}};
  j["result"] = result;
  if (!error.empty()) j["error"] = error;
  return j;
}

trial_record trial_record::from_json(const json& j) {
  trial_record r;
  r.id = j.at("id").get<std::string>();
  r.params = j.at("params");
  const std::string k = j.at("outcome").get<std::string>();
  r.kind = outcome_kind::internal_error;
  for (auto kind : {outcome_kind::success, outcome_kind::task_error, outcome_kind::out_of_memory, outcome_kind::crashed,
                    outcome_kind::timeout, outcome_kind::cancelled, outcome_kind::invalid_result, outcome_kind::internal_error})
    if (to_string(kind) == k) r.kind = kind;
  r.result = j.value("result", json());
  r.error = j.value("error", "");
  r.wall_s = j.value("wall_s", 0.0);
  r.device = j.value("device", "");
  r.slot = j.value("slot", 0);
  r.attempts = j.value("attempts", 1);
  r.peak_reserved = j.value("peak_reserved", std::uint64_t{0});
  return r;
}

void request_stop() noexcept {
  stop_count.fetch_add(1);
  if (int fd = stop_fd.load(); fd >= 0) {
    [[maybe_unused]] auto n = ::write(fd, "x", 1);
  }
}

std::string top_table(const spec& s, const std::vector<trial_record>& records, int k) {
  std::vector<const trial_record*> ok;
  for (const auto& r : records)
    if (r.kind == outcome_kind::success) ok.push_back(&r);
  std::stable_sort(ok.begin(), ok.end(), [&](auto* a, auto* b) {
    auto ma = metric_of(s, *a), mb = metric_of(s, *b);
    if (ma.has_value() != mb.has_value()) return ma.has_value();
    if (!ma) return a->wall_s < b->wall_s;
    return s.metric.maximize ? *ma > *mb : *ma < *mb;
  });
  if (ok.empty()) return "(no successful trials)\n";
  ok.resize(std::min<std::size_t>(static_cast<std::size_t>(std::max(k, 0)), ok.size()));
  std::vector<double> values;
  for (auto* r : ok) values.push_back(metric_of(s, *r).value_or(r->wall_s));
  auto shown = aligned(values);
  const std::string metric = s.metric.name.empty() ? "wall_s" : s.metric.name;
  const std::size_t width = std::max(metric.size(), shown.empty() ? 0 : shown[0].size());
  std::ostringstream o;
  char line[256];
  std::snprintf(line, sizeof line, "%-4s  %*s  %-16s  %s\n", "rank", static_cast<int>(width), metric.c_str(), "trial",
                "parameters");
  o << line;
  for (std::size_t i = 0; i < ok.size(); ++i) {
    std::vector<std::string> words;
    const std::string desc = param_words(ok[i]->params, words);
    std::snprintf(line, sizeof line, "%-4zu  %*s  %-16s  ", i + 1, static_cast<int>(width), shown[i].c_str(),
                  ok[i]->id.c_str());
    o << line << desc << "\n";
  }
  return o.str();
}

struct sweep_run::state {
  spec s;
  std::vector<slot> slots;
  run_options opt;
  std::vector<std::string> args;  // each trial's JSON arguments, checked
  fs::path out;
  std::string out_text;
  unique_fd lock;
  unique_fd journal;
  std::map<std::string, trial_record> latest;  // by trial id: the journal's last word on each
  std::vector<std::size_t> queue;              // indices into s.trials
  std::size_t skipped = 0;
  std::vector<std::string> warnings;
  bool metric_known = false;  // checked against the result type up front
  bool ran = false;
};

sweep_run::sweep_run(sweep_run&&) noexcept = default;
sweep_run& sweep_run::operator=(sweep_run&&) noexcept = default;
sweep_run::~sweep_run() = default;

std::size_t sweep_run::pending() const noexcept { return state_->queue.size(); }
const std::string& sweep_run::out() const noexcept { return state_->out_text; }
const std::vector<std::string>& sweep_run::warnings() const noexcept { return state_->warnings; }

sweep_run::sweep_run(const spec& sp, std::vector<slot> slots, run_options options) : state_{std::make_unique<state>()} {
  state& st = *state_;
  st.s = sp;
  st.slots = std::move(slots);
  st.opt = std::move(options);
  const spec& s = st.s;
  if (st.slots.empty()) throw usage_error("a sweep needs at least one slot");

  // Everything is checked before anything is created or started.
  const worker::task_info* task = worker::registry::instance().find(s.task);
  if (!task) {
    std::vector<std::string> names;
    for (auto* t : worker::registry::instance().all()) names.push_back(t->name);
    throw located(s, 0, "unknown task '" + s.task + "'" + did_you_mean(s.task, names) +
                            " (load its library with --tasks LIB.so; isorun tasks lists them)");
  }
  st.args.resize(s.trials.size());
  for (std::size_t i = 0; i < s.trials.size(); ++i) {
    std::vector<std::string> words;
    param_words(s.trials[i], words);
    try {
      st.args[i] = cli::build_task_args(*task, words).dump();
    } catch (const cli::param_error& e) {
      const auto line = s.param_lines.find(e.key());
      throw located(s, line == s.param_lines.end() ? 0 : line->second, e.what());
    } catch (const usage_error& e) {
      throw located(s, 0, e.what());
    }
  }
  if (!s.metric.name.empty() && task->default_result_json) {
    const json shape = json::parse(task->default_result_json())["result"];
    if (auto problem = metric_problem(s, shape, "task '" + s.task + "'"); !problem.empty())
      throw located(s, s.metric.line, problem);
    st.metric_known = true;
  }
  for (const auto& sl : st.slots) {
    runner::job_spec probe;
    probe.gpu = sl.gpu;
    probe.mem_limit = s.mem_limit;
    probe.alloc_conf = s.alloc_conf;
    runner::check_job_spec(probe);
  }

  st.out = s.out.empty() ? fs::path("isorun-sweep-" + s.task) : fs::path(s.out);
  st.out_text = st.out.string();
  std::error_code ec;
  fs::create_directories(st.out / "logs", ec);
  if (ec) throw internal_error("cannot create " + (st.out / "logs").string() + ": " + ec.message());
  st.lock = lock_output(st.out, st.opt.wait_for_lock);

  const json identity = {{"task", s.task}, {"trials", s.trials.size()}, {"fingerprint", fingerprint(s)}};
  if (fs::exists(st.out / "sweep.json")) {
    std::ifstream in(st.out / "sweep.json");
    json old = json::parse(in, nullptr, false);
    if (old.is_discarded() || old.value("fingerprint", "") != identity["fingerprint"])
      throw usage_error("output folder " + st.out_text + " holds a different sweep (task " +
                        (old.is_discarded() ? std::string("?") : old.value("task", "?")) + ", " +
                        (old.is_discarded() ? std::string("?") : std::to_string(old.value("trials", 0))) +
                        " trials); choose another --out, or remove it");
  } else {
    write_file_durably(st.out / "sweep.json", identity.dump(2) + "\n");
  }

  // The journal: complete lines only. A line cut short by a crash is dropped before appending;
  // a line that is not a record is reported and ignored; the last record of a trial counts.
  const fs::path journal_path = st.out / "results.jsonl";
  st.journal.reset(::open(journal_path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  if (!st.journal) throw internal_error("cannot open " + journal_path.string() + ": " + std::strerror(errno));
  {
    std::ifstream in(journal_path, std::ios::binary);
    std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto last_newline = content.rfind('\n');
    const std::size_t complete = last_newline == std::string::npos ? 0 : last_newline + 1;
    if (complete != content.size()) {
      if (::ftruncate(st.journal.get(), static_cast<off_t>(complete)) != 0)
        throw internal_error("cannot repair " + journal_path.string());
      ::fsync(st.journal.get());
    }
    std::istringstream lines(content.substr(0, complete));
    int number = 0;
    for (std::string line; std::getline(lines, line);) {
      ++number;
      try {
        trial_record r = trial_record::from_json(json::parse(line));
        st.latest[r.id] = std::move(r);
      } catch (const std::exception&) {
        st.warnings.push_back(journal_path.string() + " line " + std::to_string(number) +
                              " is not a trial record; ignored (" + line.substr(0, 60) +
                              (line.size() > 60 ? "..." : "") + ")");
      }
    }
  }
  std::set<std::string> queued;
  for (std::size_t i = 0; i < s.trials.size(); ++i) {
    const std::string id = trial_id(s.task, s.trials[i]);
    auto it = st.latest.find(id);
    const bool done = it != st.latest.end() && (it->second.kind == outcome_kind::success || !st.opt.rerun_failed);
    if (done || !queued.insert(id).second) ++st.skipped;
    else st.queue.push_back(i);
  }
}

sweep_summary run(const spec& s, const std::vector<slot>& slots, const run_options& options) {
  return sweep_run(s, slots, options).run();
}

sweep_summary sweep_run::run() {
  state& st = *state_;
  if (st.ran) throw std::logic_error("sweep_run::run() called twice");
  st.ran = true;
  const spec& s = st.s;
  const run_options& opt = st.opt;
  const auto& slots = st.slots;
  const auto& queue = st.queue;
  const fs::path& out = st.out;
  auto& latest = st.latest;

  sweep_summary summary;
  summary.total = s.trials.size();
  summary.skipped = st.skipped;

  std::mutex mutex;  // queue, journal, progress, running
  std::size_t finished = 0, running_count = 0, failed = 0;
  std::vector<std::shared_ptr<runner::job>> running(slots.size());
  std::optional<double> best;
  double busy_seconds = 0;
  const bool tty = opt.progress && ::isatty(STDERR_FILENO);
  std::atomic<bool> halted{false};  // fail-fast, or a metric the results do not have
  std::string metric_error;
  bool metric_checked = st.metric_known;
  std::mutex journal_mutex;
  std::condition_variable journal_cv;
  std::vector<trial_record> unwritten;
  bool writer_done = false;
  std::exception_ptr writer_error;
  stop_count = 0;

  auto progress = [&](const trial_record* r) {
    if (!opt.progress) return;
    const std::size_t todo = queue.size();
    const double avg = finished ? busy_seconds / double(finished) : 0;
    const double eta = avg * double(todo - std::min(todo, finished)) / double(std::max<std::size_t>(1, slots.size()));
    char best_text[64] = "";
    if (best) std::snprintf(best_text, sizeof best_text, " | best %s %.4g", s.metric.name.c_str(), *best);
    if (tty) {
      std::fprintf(stderr, "\r\033[K[%zu/%zu done | %zu running | %zu failed | ETA %s%s]", finished, todo, running_count,
                   failed, finished ? duration(eta).c_str() : "?", best_text);
    } else if (r) {
      auto m = metric_of(s, *r);
      std::fprintf(stderr, "[%zu/%zu] %s %s%s (%.2f s on %s, attempt %d)\n", finished, todo, r->id.c_str(),
                   std::string(to_string(r->kind)).c_str(),
                   m ? (" " + s.metric.name + "=" + std::to_string(*m)).c_str() : "", r->wall_s, r->device.c_str(),
                   r->attempts);
    }
    std::fflush(stderr);
  };

  auto cancel_running = [&] {  // caller holds mutex
    for (auto& j : running)
      if (j) j->cancel();
  };

  // Ctrl-C (request_stop) wakes this watcher, which says what happens and cancels what runs:
  // SIGTERM first, SIGKILL on a second request.
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC | O_NONBLOCK) != 0) throw internal_error("pipe2 failed");
  unique_fd stop_read(pipefd[0]), stop_write(pipefd[1]);
  stop_fd = stop_write.get();
  std::atomic<bool> all_done{false};
  std::thread watcher([&] {
    int announced = 0;
    while (!all_done) {
      pollfd p{stop_read.get(), POLLIN, 0};
      if (::poll(&p, 1, -1) <= 0) continue;
      char buf[16];
      while (::read(stop_read.get(), buf, sizeof buf) > 0) {
      }
      if (all_done) break;
      std::lock_guard lock(mutex);
      const int requests = stop_count.load();
      if (requests > announced) {
        if (tty) std::fprintf(stderr, "\n");
        if (announced == 0 && requests == 1)
          std::fprintf(stderr,
                       "isorun: stopping: no new trials; %zu running trial%s SIGTERM, then SIGKILL after %s; "
                       "Ctrl-C again to kill %s now\n",
                       running_count, running_count == 1 ? " gets" : "s get", format_duration(opt.grace).c_str(),
                       running_count == 1 ? "it" : "them");
        else
          std::fprintf(stderr, "isorun: killing %zu running trial%s now\n", running_count, running_count == 1 ? "" : "s");
        announced = requests;
      }
      cancel_running();
    }
  });

  auto stopping = [&] { return stop_count.load() > 0 || halted.load(); };
  // One trial on slot `sl`, its retries included; runner::run_on_slots hands them out.
  auto run_trial = [&](const slot& sl, std::size_t queued) {
    std::size_t index;
    {
      std::lock_guard lock(mutex);
      if (stopping()) return;
      index = queue[queued];
      ++running_count;
      progress(nullptr);
    }
    const json& params = s.trials[index];
    trial_record rec;
    rec.id = trial_id(s.task, params);
    rec.params = params;
    rec.slot = sl.index;
    rec.device = sl.gpu ? runner::visible_devices_for(sl.gpu) : "cpu";
    const auto t0 = clock::now();
    for (int attempt = 1;; ++attempt) {
      runner::job_spec spec;
      spec.task = s.task;
      spec.encoding = serialization::encoding::json;
      spec.args = blob(st.args[index].data(), st.args[index].size());
      spec.gpu = sl.gpu;
      spec.mem_limit = s.mem_limit;
      spec.timeout = s.timeout;
      spec.grace = opt.grace;
      spec.task_libraries = opt.task_libraries;
      spec.executable = opt.executable;
      spec.alloc_conf = s.alloc_conf;
      spec.stdout_to = runner::stdout_mode::file;
      spec.stdout_path = (out / "logs" / (rec.id + ".out")).string();
      unique_fd err(::open((out / "logs" / (rec.id + ".err")).c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
      spec.stderr_echo_fd = err.get();
      std::shared_ptr<runner::job> job;
      try {
        job = runner::job::start(std::move(spec));
      } catch (const std::exception& e) {
        rec.kind = outcome_kind::internal_error;
        rec.error = e.what();
        break;
      }
      {
        std::lock_guard lock(mutex);
        running[static_cast<std::size_t>(sl.index)] = job;
      }
      if (stopping()) job->cancel();
      const runner::job_result& r = job->wait();
      {
        std::lock_guard lock(mutex);
        running[static_cast<std::size_t>(sl.index)].reset();
      }
      rec.attempts = attempt;
      rec.kind = r.status.kind;
      rec.peak_reserved = r.status.peak_reserved;
      rec.error = r.status.ok() ? "" : r.status.describe();
      rec.result = nullptr;
      if (r.status.ok()) {
        json parsed = json::parse(std::string_view(reinterpret_cast<const char*>(r.payload.data()), r.payload.size()),
                                  nullptr, false);
        if (parsed.is_object() && parsed.contains("result")) {
          rec.result = parsed["result"];
        } else {
          rec.kind = outcome_kind::invalid_result;
          rec.error = "worker result is not valid JSON";
        }
      }
      const auto allowed = s.retries.find(std::string(to_string(rec.kind)));
      const bool retry = rec.kind != outcome_kind::success && rec.kind != outcome_kind::cancelled &&
                         allowed != s.retries.end() && attempt <= allowed->second && !stopping();
      if (!retry) break;
    }
    rec.wall_s = std::chrono::duration<double>(clock::now() - t0).count();

    {
      std::lock_guard lock(mutex);
      --running_count;
      if (rec.kind == outcome_kind::cancelled) {
        ++summary.cancelled;  // not journaled: a resume runs it again
        return;
      }
      if (rec.kind != outcome_kind::success && s.fail_fast) {
        halted = true;
        cancel_running();
      }
    }
    // Hand the record to the journal writer and take the next trial at once.
    std::lock_guard lock(journal_mutex);
    unwritten.push_back(std::move(rec));
    journal_cv.notify_one();
  };

  // The journal writer: appends what the slots hand over, one fsync per batch (group commit).
  // A trial counts as done only once its record is durable.
  std::thread writer([&] {
    std::unique_lock lk(journal_mutex);
    for (;;) {
      journal_cv.wait(lk, [&] { return !unwritten.empty() || writer_done; });
      if (unwritten.empty()) return;
      std::vector<trial_record> batch = std::move(unwritten);
      unwritten.clear();
      lk.unlock();
      try {
        std::string text;
        for (const auto& r : batch) text += r.to_json().dump() + "\n";
        write_all(st.journal.get(), text);
        if (::fsync(st.journal.get()) != 0) throw internal_error("fsync of the sweep journal failed");
      } catch (...) {
        writer_error = std::current_exception();
        request_stop();
      }
      {
        std::lock_guard lock(mutex);
        for (auto& rec : batch) {
          ++finished;
          busy_seconds += rec.wall_s;
          if (rec.kind == outcome_kind::success) {
            ++summary.succeeded;
            if (!metric_checked && !s.metric.name.empty()) {
              // The result type was not known up front: the first result decides.
              metric_checked = true;
              metric_error = metric_problem(s, rec.result, "trial " + rec.id);
              if (!metric_error.empty()) {
                halted = true;
                cancel_running();
              }
            }
            if (auto m = metric_of(s, rec); m && (!best || (s.metric.maximize ? *m > *best : *m < *best))) best = m;
          } else {
            ++failed;
            ++summary.failed;
          }
          progress(&rec);
          latest[rec.id] = std::move(rec);
        }
      }
      lk.lock();
    }
  });

  runner::run_on_slots(slots, queue.size(), run_trial, stopping);
  {
    std::lock_guard lk(journal_mutex);
    writer_done = true;
    journal_cv.notify_one();
  }
  writer.join();
  all_done = true;
  [[maybe_unused]] auto woken = ::write(stop_write.get(), "", 1);  // wake the watcher now, not at its next poll
  watcher.join();
  stop_fd = -1;
  if (writer_error) std::rethrow_exception(writer_error);
  if (tty) std::fprintf(stderr, "\n");
  if (!metric_error.empty()) throw located(s, s.metric.line, metric_error + "; the sweep was stopped");
  summary.interrupted = stop_count.load() > 0;

  // Results in spec order, then results.csv.
  std::set<std::string> param_names, result_names;
  for (const auto& t : s.trials) {
    auto it = latest.find(trial_id(s.task, t));
    if (it == latest.end()) continue;
    if (std::none_of(summary.records.begin(), summary.records.end(), [&](auto& r) { return r.id == it->second.id; }))
      summary.records.push_back(it->second);
  }
  for (const auto& r : summary.records) {
    for (auto it = r.params.begin(); it != r.params.end(); ++it) param_names.insert(it.key());
    if (r.result.is_object())
      for (auto it = r.result.begin(); it != r.result.end(); ++it) result_names.insert(it.key());
  }
  std::ostringstream csv;
  csv << "id,outcome,attempts,wall_s,device,peak_reserved";
  for (const auto& p : param_names) csv << "," << p;
  static const std::set<std::string> fixed = {"id", "outcome", "attempts", "wall_s", "device", "peak_reserved", "error"};
  for (const auto& m : result_names) csv << "," << (param_names.count(m) || fixed.count(m) ? "result_" + m : m);
  if (result_names.empty()) csv << ",result";
  csv << ",error\n";
  for (const auto& r : summary.records) {
    csv << r.id << "," << to_string(r.kind) << "," << r.attempts << "," << r.wall_s << "," << r.device << ","
        << r.peak_reserved;
    for (const auto& p : param_names) csv << "," << csv_field(r.params.value(p, json()));
    for (const auto& m : result_names) csv << "," << csv_field(r.result.is_object() ? r.result.value(m, json()) : json());
    if (result_names.empty()) csv << "," << csv_field(r.result);
    csv << "," << csv_field(json(r.error)) << "\n";
  }
  write_file_durably(out / "results.csv", csv.str());
  return summary;
}

}  // namespace isorun::sweeps
