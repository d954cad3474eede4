// Both halves of the submitter-node folder protocol (remote_folder.hpp).
#include "isorun/sweep/remote_folder.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "engine/folder.hpp"
#include "isorun/runner/bounded_json.hpp"
#include "isorun/runner/errors.hpp"
#include "isorun/sweep/report_lines.hpp"

namespace isorun::sweep {

namespace fs = std::filesystem;
using nlohmann::json;

remote_folder::remote_folder(fs::path out, std::string name)
    : out_{std::move(out)}, dir_{out_ / name}, name_{std::move(name)} {}

void remote_folder::create() const {
  for (const char* sub : {"results", "reports", "stop", "errors"}) fs::create_directories(dir_ / sub);
}

void remote_folder::start_afresh(const std::string& id) const {
  std::error_code ec;
  fs::remove(dir_ / "results" / (id + ".json"), ec);
  fs::remove(dir_ / "stop" / id, ec);
  fs::remove(dir_ / "reports" / (id + ".jsonl"), ec);
}

void remote_folder::stop(const std::string& id) const {
  const unique_fd folder = detail::open_subfolders(out_, {name_.c_str(), "stop"}, true);
  detail::open_file(folder.get(), id, O_WRONLY | O_CREAT, dir_ / "stop" / id);
}

remote_folder::reports_read remote_folder::reports_since(const std::string& id, std::uint64_t& offset) const {
  reports_read out;
  const unique_fd folder = detail::open_subfolders(out_, {name_.c_str(), "reports"}, false);
  if (!folder) return out;
  const std::string name = id + ".jsonl";
  const fs::path shown = dir_ / "reports" / name;
  const unique_fd fd = detail::open_file(folder.get(), name, O_RDONLY, shown);
  if (!fd) return out;
  // A look that stopped inside a line too long for a report left `offset` past a byte that is no
  // newline: the rest of that line is skipped too, not read as a line of its own.
  char before = '\n';
  if (offset > 0 && ::pread(fd.get(), &before, 1, static_cast<off_t>(offset - 1)) != 1) before = '\n';
  if (::lseek(fd.get(), static_cast<off_t>(offset), SEEK_SET) < 0) return out;
  // The cap of the reports a local trial prints (report_lines): what a node appends is the same
  // report, so a longer line is none, and is not held.
  bool skipped = false;
  const auto read = detail::read_lines(
      fd.get(), report_lines::max_line, max_report_look, before != '\n', shown,
      [&](std::string_view line, int, bool too_long) {
        if (too_long) {
          skipped = true;
          return;
        }
        json j = parse_bounded_json(line);
        if (!j.is_object()) return;
        if (j.contains("step") && j["step"].is_number_integer() && j.contains("metrics") && j["metrics"].is_object())
          out.reports.emplace_back(j["step"].get<std::int64_t>(), std::move(j["metrics"]));
        else if (j.size() == 1)  // a checkpoint's line, as checkpoint() writes it, and nothing more
          if (const auto step = checkpoint_line(line)) out.checkpoints.push_back(*step);
      });
  // A line still being written waits for the next look, unless it is already too long to be a
  // report: then what was read of it is skipped, so that no look reads it again.
  offset += read.long_tail ? read.read : read.complete;
  if (skipped || read.long_tail)
    out.skipped = shown.string() + " holds a line longer than " + std::to_string(report_lines::max_line >> 20) +
                  " MiB, which no report is; it is skipped";
  return out;
}

std::vector<remote_folder::found_record> remote_folder::records() const {
  std::vector<found_record> out;
  const unique_fd folder = detail::open_subfolders(out_, {name_.c_str(), "results"}, false);
  if (!folder) return out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_ / "results", ec)) {
    if (e.path().extension() != ".json") continue;  // (".tmp": still being written)
    const std::string file = e.path().filename().string();
    try {
      const unique_fd fd = detail::open_file(folder.get(), file, O_RDONLY, e.path());
      if (!fd) continue;
      out.push_back(
          {file, trial_record::from_json(parse_bounded_json(detail::read_all(fd.get(), journal::max_line, e.path())))});
    } catch (const std::exception&) {
      remove_record(file);  // not a record (nor a link, a FIFO or a huge file: they go too)
    }
  }
  return out;
}

void remote_folder::remove_record(const std::string& file) const {
  std::error_code ec;
  fs::remove(dir_ / "results" / file, ec);
}

fs::path remote_folder::error_record(const std::string& job, std::size_t task) const {
  return errors() / (job + "_" + std::to_string(task) + ".json");
}

void remote_folder::report(const std::string& id, std::int64_t step, const json& metrics) const {
  append_report_line(id, json{{"step", step}, {"metrics", metrics}}.dump() + "\n");
}

void remote_folder::checkpoint(const std::string& id, std::int64_t step) const {
  append_report_line(id, json{{"checkpoint", step}}.dump() + "\n");
}

void remote_folder::append_report_line(const std::string& id, const std::string& line) const {
  const std::string name = id + ".jsonl";
  const fs::path shown = dir_ / "reports" / name;
  const unique_fd folder = detail::open_subfolders(out_, {name_.c_str(), "reports"}, true);
  const unique_fd fd = detail::open_file(folder.get(), name, O_WRONLY | O_APPEND | O_CREAT, shown);
  if (::write(fd.get(), line.data(), line.size()) != static_cast<ssize_t>(line.size()))
    throw internal_error("cannot write " + shown.string() + ": " + std::strerror(errno));
}

bool remote_folder::stop_requested(const std::string& id) const {
  std::error_code ec;
  return fs::exists(dir_ / "stop" / id, ec);
}

bool remote_folder::has_record(const std::string& id) const {
  std::error_code ec;
  return fs::exists(dir_ / "results" / (id + ".json"), ec);
}

std::unique_ptr<record_store> remote_folder::records_store() const {
  return std::make_unique<result_files>(dir_ / "results");
}

}  // namespace isorun::sweep
