// OUT/reports.jsonl: every trial's intermediate reports, appended, and fsync'ed in groups (report_log.hpp).
#include "isorun/sweep/report_log.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "engine/folder.hpp"
#include "isorun/runner/bounded_json.hpp"
#include "isorun/runner/errors.hpp"
#include "isorun/runner/unique_fd.hpp"
#include "isorun/sweep/journal.hpp"

namespace isorun::sweep {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {
constexpr const char* file_name = "reports.jsonl";
constexpr const char* events_name = "events.jsonl";  // attempts' starts, checkpoints

// Reads every complete report line of `fd`; returns the bytes up to the last complete line.
std::size_t read_reports(int fd, const fs::path& shown, std::vector<trial_report>& out) {
  return detail::for_each_line(fd, journal::max_line, shown, [&](std::string_view line, int, bool too_long) {
    if (too_long) return;
    const json j = parse_bounded_json(line);
    if (!j.is_object() || !j.contains("trial") || !j["trial"].is_string() || !j.contains("step") ||
        !j["step"].is_number_integer() || !j.contains("metrics") || !j["metrics"].is_object())
      return;  // not a report (a hand-edited line): the curves and the replay go without it
    out.push_back({j["trial"].get<std::string>(), j["step"].get<std::int64_t>(), j["metrics"]});
  });
}
}  // namespace

report_log::report_log(const fs::path& folder) : path_{folder / file_name}, events_path_{folder / events_name} {
  const unique_fd dir = detail::open_folder(folder);
  if (!dir) throw internal_error("cannot open " + folder.string() + ": no such folder");
  unique_fd fd = detail::open_file(dir.get(), file_name, O_RDWR | O_CREAT | O_APPEND, path_);
  detail::drop_cut_line(fd.get(), read_reports(fd.get(), path_, earlier_), path_);
  unique_fd events = detail::open_file(dir.get(), events_name, O_RDWR | O_CREAT | O_APPEND, events_path_);
  const auto whole = detail::for_each_line(events.get(), journal::max_line, events_path_,
                                           [](std::string_view, int, bool) {});
  detail::drop_cut_line(events.get(), whole, events_path_);
  fd_ = fd.release();
  events_fd_ = events.release();
}

report_log::~report_log() {
  if (fd_ >= 0) ::close(fd_);
  if (events_fd_ >= 0) ::close(events_fd_);
}

void report_log::fail(int error, const fs::path& file) const {
  throw internal_error("cannot write the sweep's reports to " + file.string() + ": " + std::strerror(error) +
                       " (run the same command again to resume)");
}

// No fsync here: append() is on the way from a trial's report to its verdict (the stop of a
// pruned trial), and an fdatasync there took 3 ms (up to 30) a report on a VM, during which the
// trial ran on and no other trial's report was read. The line is in the file once written, so a
// crash of isorun loses nothing; sync() makes it durable before any record that follows it.
void report_log::append(const trial_report& r) {
  append_line(fd_, path_, json{{"trial", r.trial}, {"step", r.step}, {"metrics", r.metrics}}.dump() + "\n");
  std::lock_guard lock(mutex_);
  ++appended_;
}

void report_log::append_start(const std::string& trial, int attempt, const json& params) {
  append_line(events_fd_, events_path_,
              json{{"trial", trial}, {"event", "start"}, {"attempt", attempt}, {"params", params}}.dump() + "\n");
}

void report_log::append_checkpoint(const std::string& trial, int attempt, std::int64_t step) {
  append_line(events_fd_, events_path_,
              json{{"trial", trial}, {"event", "checkpoint"}, {"attempt", attempt}, {"step", step}}.dump() + "\n");
}

void report_log::append_line(int fd, const fs::path& file, const std::string& line) {
  {
    std::lock_guard lock(mutex_);
    if (failed_) fail(failed_, path_);
  }
  const off_t before = ::lseek(fd, 0, SEEK_END);
  if (const int failed = detail::write_all(fd, line)) {
    if (before >= 0) [[maybe_unused]]
      int rc = ::ftruncate(fd, before);
    fail(failed, file);
  }
}

void report_log::sync() {
  std::uint64_t upto = 0;
  {
    std::lock_guard lock(mutex_);
    if (failed_) fail(failed_, path_);
    if (synced_ == appended_) return;
    upto = appended_;  // what was written before the fdatasync starts is covered by it
  }
  const int failed = ::fdatasync(fd_) != 0 ? errno : 0;
  std::lock_guard lock(mutex_);
  if (failed) {
    failed_ = failed;
    fail(failed, path_);
  }
  synced_ = std::max(synced_, upto);
}

std::vector<trial_report> report_log::read(const fs::path& folder) {
  std::vector<trial_report> out;
  const unique_fd dir = detail::open_folder(folder);
  if (!dir) return out;
  const unique_fd fd = detail::open_file(dir.get(), file_name, O_RDONLY, folder / file_name);
  if (fd) read_reports(fd.get(), folder / file_name, out);
  return out;
}

}  // namespace isorun::sweep
