// Running a sweep: slot threads take trials from one queue (work-conserving), each trial runs
// in a fresh capped worker, every final outcome is appended to the journal and fsync'ed before
// it counts. Re-running resumes from the journal.
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

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
#include "isorun/sweep.hpp"
#include "isorun/task.hpp"
#include "isorun/unique_fd.hpp"
#include "isorun/units.hpp"
#include "task_params.hpp"

namespace isorun::sweeps {
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
  std::ostringstream o;
  const std::string metric = s.metric.name.empty() ? "wall_s" : s.metric.name;
  char head[128];
  std::snprintf(head, sizeof head, "%-4s %-12s %-17s %s\n", "rank", metric.c_str(), "trial", "parameters");
  o << head;
  for (int i = 0; i < std::min<int>(k, static_cast<int>(ok.size())); ++i) {
    std::vector<std::string> words;
    const std::string desc = param_words(ok[i]->params, words);
    auto m = metric_of(s, *ok[i]);
    char line[64];
    std::snprintf(line, sizeof line, "%-4d %-12.6g %-17s ", i + 1, m ? *m : ok[i]->wall_s, ok[i]->id.c_str());
    o << line << desc << "\n";
  }
  if (ok.empty()) o << "(no successful trials)\n";
  return o.str();
}

sweep_summary run(const spec& s, const std::vector<slot>& slots, const run_options& opt) {
  const worker::task_info* task = worker::registry::instance().find(s.task);
  if (!task) throw spec_error("unknown task '" + s.task + "' (load its library with --tasks LIB.so; isorun tasks lists them)", 0);
  // Every trial's arguments are checked before anything starts.
  std::vector<std::string> args(s.trials.size());
  for (std::size_t i = 0; i < s.trials.size(); ++i) {
    std::vector<std::string> words;
    param_words(s.trials[i], words);
    try {
      args[i] = cli::build_task_args(*task, words).dump();
    } catch (const usage_error& e) {
      throw spec_error(std::string("params: ") + e.what(), 0);
    }
  }

  const fs::path out = s.out.empty() ? fs::path("isorun-sweep-" + s.task) : fs::path(s.out);
  fs::create_directories(out / "logs");
  const json identity = {{"task", s.task}, {"trials", s.trials.size()}, {"fingerprint", fingerprint(s)}};
  if (fs::exists(out / "sweep.json")) {
    std::ifstream in(out / "sweep.json");
    json old = json::parse(in, nullptr, false);
    if (old.is_discarded() || old.value("fingerprint", "") != identity["fingerprint"])
      throw usage_error("output folder " + out.string() + " holds a different sweep (task " +
                        (old.is_discarded() ? std::string("?") : old.value("task", "?")) + ", " +
                        (old.is_discarded() ? std::string("?") : std::to_string(old.value("trials", 0))) +
                        " trials); choose another --out, or remove it");
  } else {
    write_file_durably(out / "sweep.json", identity.dump(2) + "\n");
  }

  // The journal: complete lines only. A line cut short by a crash is dropped before appending.
  const fs::path journal_path = out / "results.jsonl";
  unique_fd journal(::open(journal_path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  if (!journal) throw internal_error("cannot open " + journal_path.string() + ": " + std::strerror(errno));
  std::map<std::string, trial_record> latest;
  {
    std::ifstream in(journal_path, std::ios::binary);
    std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto last_newline = content.rfind('\n');
    const std::size_t complete = last_newline == std::string::npos ? 0 : last_newline + 1;
    if (complete != content.size()) {
      if (::ftruncate(journal.get(), static_cast<off_t>(complete)) != 0)
        throw internal_error("cannot repair " + journal_path.string());
      ::fsync(journal.get());
    }
    std::istringstream lines(content.substr(0, complete));
    for (std::string line; std::getline(lines, line);) {
      json j = json::parse(line, nullptr, false);
      if (j.is_discarded()) continue;
      trial_record r = trial_record::from_json(j);
      latest[r.id] = r;
    }
  }

  sweep_summary summary;
  summary.total = s.trials.size();
  std::vector<std::size_t> queue;
  std::set<std::string> queued;
  for (std::size_t i = 0; i < s.trials.size(); ++i) {
    const std::string id = trial_id(s.task, s.trials[i]);
    auto it = latest.find(id);
    const bool done = it != latest.end() && (it->second.kind == outcome_kind::success || !opt.rerun_failed);
    if (done || !queued.insert(id).second) ++summary.skipped;
    else queue.push_back(i);
  }

  std::mutex mutex;  // queue, journal, progress, running
  std::size_t next = 0, finished = 0, running_count = 0, failed = 0;
  std::vector<std::shared_ptr<runner::job>> running(slots.size());
  std::optional<double> best;
  double busy_seconds = 0;
  const bool tty = opt.progress && ::isatty(STDERR_FILENO);
  std::atomic<bool> fail_fast_hit{false};
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

  // Ctrl-C (request_stop) wakes this watcher, which cancels what runs: SIGTERM first, SIGKILL on
  // a second request.
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC | O_NONBLOCK) != 0) throw internal_error("pipe2 failed");
  unique_fd stop_read(pipefd[0]), stop_write(pipefd[1]);
  stop_fd = stop_write.get();
  std::atomic<bool> all_done{false};
  std::thread watcher([&] {
    while (!all_done) {
      pollfd p{stop_read.get(), POLLIN, 0};
      if (::poll(&p, 1, -1) <= 0) continue;
      char buf[16];
      while (::read(stop_read.get(), buf, sizeof buf) > 0) {
      }
      if (all_done) break;
      std::lock_guard lock(mutex);
      for (auto& j : running)
        if (j) j->cancel();
    }
  });

  auto stopping = [&] { return stop_count.load() > 0 || fail_fast_hit.load(); };

  auto run_slot = [&](const slot& sl) {
    for (;;) {
      std::size_t index;
      {
        std::lock_guard lock(mutex);
        if (stopping() || next >= queue.size()) return;
        index = queue[next++];
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
        spec.args = blob(args[index].data(), args[index].size());
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
          continue;
        }
        if (rec.kind != outcome_kind::success && s.fail_fast) {
          fail_fast_hit = true;
          for (auto& j : running)
            if (j) j->cancel();
        }
      }
      // Hand the record to the journal writer and take the next trial at once.
      std::lock_guard lock(journal_mutex);
      unwritten.push_back(std::move(rec));
      journal_cv.notify_one();
    }
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
        write_all(journal.get(), text);
        if (::fsync(journal.get()) != 0) throw internal_error("fsync of the sweep journal failed");
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

  std::vector<std::thread> threads;
  for (const auto& sl : slots) threads.emplace_back(run_slot, std::cref(sl));
  for (auto& t : threads) t.join();
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
