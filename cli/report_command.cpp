#include "report_command.hpp"

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "interrupt.hpp"
#include "isorun/runner/bounded_json.hpp"
#include "isorun/runner/printable.hpp"
#include "isorun/sweep/html_report.hpp"
#include "isorun/sweep/report_model.hpp"
#include "isorun/sweep/slurm.hpp"

namespace isorun::cli {

namespace {

// Requests logged on stderr with the time, as a development server does (only in the foreground:
// beside a sweep, the terminal is the sweep's).
void log_request(const std::string& line) {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::localtime_r(&t, &tm);
  char when[16];
  std::strftime(when, sizeof when, "%H:%M:%S", &tm);
  std::fprintf(stderr, "isorun: %s %s\n", when, line.c_str());
}

sweep::report_server::settings serve_settings(const serve_flags& f, bool foreground) {
  return {.bind = f.bind,
          .port = std::max(f.port, 0),
          .beside_sweep = !foreground,
          .on_request = foreground ? log_request : nullptr};
}

sweep::report_server* serving = nullptr;  // what a signal stops (set before the handler is)

// isorun report OUT --serve: in the foreground, requests logged, until Ctrl-C.
int serve_report(const cli_options& o) {
  (void)sweep::load_report_data(o.out);  // usage_error if OUT is not a sweep's folder
  sweep::report_server server(serve_settings(o.serve, true));
  serving = &server;
  {
    const interrupt_scope stop([](int) noexcept { serving->stop(); });
    std::fprintf(stderr, "isorun: serving the report of %s at %s (live: it updates as the sweep goes; Ctrl-C stops)\n",
                 printable(o.out).c_str(), server.url().c_str());
    server.serve(o.out);
  }
  serving = nullptr;  // (the handler is gone)
  return 0;
}

}  // namespace

served_report::served_report(const serve_flags& flags) {
  if (flags.on) server_ = std::make_unique<sweep::report_server>(serve_settings(flags, false));
}

void served_report::start(const std::string& out) {
  if (!server_) return;
  std::fprintf(stderr, "isorun: the report, live: %s\n", server_->url().c_str());
  thread_ = std::thread([server = server_.get(), out] {
    try {
      server->serve(out);
    } catch (const std::exception& e) {  // the sweep goes on without its page
      std::fprintf(stderr, "isorun: warning: the live report stopped: %s\n", printable(e.what()).c_str());
    }
  });
}

void served_report::stop() {
  if (!thread_.joinable()) return;
  server_->stop();
  thread_.join();
}

served_report::~served_report() { stop(); }

int write_report(const cli_options& o) {
  if (o.serve.on) return serve_report(o);
  sweep::write_report(o.out);
  std::fprintf(stderr, "isorun: report in %s\n",
               printable((std::filesystem::path(o.out) / "report.html").string()).c_str());
  return 0;
}

int show_status(const cli_options& o) {
  const std::filesystem::path out = o.out;
  const auto d = sweep::load_report_data(out);  // usage_error if OUT is not a sweep's folder
  std::size_t total = 0;
  {
    std::ifstream in(out / "sweep.json");
    const auto identity = parse_bounded_json(in);
    if (identity.is_object()) total = identity.value("trials", std::size_t{0});
  }
  std::string by_outcome;
  for (const auto& [k, n] : d.outcomes) by_outcome += (by_outcome.empty() ? "" : ", ") + std::to_string(n) + " " + k;
  std::printf("sweep %s in %s: %zu of %zu trials journaled%s%s\n", printable(d.subject).c_str(),
              printable(out.string()).c_str(), d.records.size(), total, by_outcome.empty() ? "" : ": ",
              by_outcome.c_str());
  std::size_t waiting = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(out / "slurm" / "results", ec))
    waiting += e.path().extension() == ".json";
  std::ifstream in(out / "slurm" / "jobs.json");
  const auto jobs = parse_bounded_json(in);
  if (jobs.is_array())
    for (const auto& j : jobs) {
      if (!j.is_object()) continue;  // not isorun's: nothing to follow
      const std::string job = j.value("job", "");
      const auto active = sweep::slurm::active_tasks(job);
      const std::string state = !active           ? "Slurm does not answer now (try again)"
                                : active->empty() ? "done"
                                                  : std::to_string(active->size()) + " array tasks queued or running";
      std::printf("Slurm job array %s: %s\n", printable(job).c_str(), state.c_str());
    }
  if (waiting)
    std::printf("%zu trial results wait to be journaled (run the sweep's command again, or --attach)\n", waiting);
  return 0;
}

}  // namespace isorun::cli
