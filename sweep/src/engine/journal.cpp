// The journal and the output folder: durable appends, crash repair, the lock.
#include "isorun/sweep/journal.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <xxhash.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "engine/folder.hpp"
#include "isorun/runner/bounded_json.hpp"
#include "isorun/runner/errors.hpp"
#include "isorun/runner/printable.hpp"
#include "isorun/runner/unique_fd.hpp"
#include "isorun/serialization/whole_file.hpp"

namespace isorun::sweep {
namespace fs = std::filesystem;
using nlohmann::json;

std::string trial_id(const std::string& task, const nlohmann::json& params) {
  const std::string canonical = task + "\n" + params.dump();  // object keys are sorted
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx",
                static_cast<unsigned long long>(XXH3_64bits(canonical.data(), canonical.size())));
  return buf;
}

bool is_trial_id(const std::string& id) {
  return id.size() == 16 &&
         std::all_of(id.begin(), id.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); });
}

json trial_record::to_json() const {
  json j = {{"id", id},
            {"params", params},
            {"outcome", std::string(outcome_name(*this))},
            {"attempts", attempts},
            {"wall_s", wall_s},
            {"device", device},
            {"slot", slot},
            {"peak_reserved", peak_reserved},
            {"peak_allocated", peak_allocated},
            {"mem_limit", mem_limit},
            {"run", run},
            {"start_s", start_s}};
  j["result"] = result;
  if (!error.empty()) j["error"] = error;
  if (!timeline.empty()) j["timeline"] = timeline;
  if (step >= 0) j["step"] = step;
  if (retry_mem_limit) j["retry_mem_limit"] = retry_mem_limit;
  if (checkpoint >= 0) j["checkpoint"] = checkpoint;
  if (!origin.is_null()) j["origin"] = origin;
  if (!resumes.empty()) {
    j["resumes"] = resumes;
    j["steps_redone"] = steps_redone();
  }
  return j;
}

std::int64_t trial_record::steps_redone() const {
  std::int64_t sum = 0;
  for (const auto& r : resumes)
    if (r.is_object() && r.contains("redone") && r["redone"].is_number_integer())
      sum += r["redone"].get<std::int64_t>();
  return sum;
}

namespace {
// Field `key` of a record, `fallback` where it is absent. A value of another type, or one out of
// the field's range, makes the line no record (rather than a number cast out of range).
template <class T>
T field(const json& j, const char* key, T fallback) {
  const auto it = j.find(key);
  if (it == j.end()) return fallback;
  const json& v = *it;
  if constexpr (std::is_same_v<T, std::string>) {
    if (v.is_string()) return v.get<std::string>();
  } else if constexpr (std::is_same_v<T, double>) {
    if (v.is_number()) return v.get<double>();
  } else if constexpr (std::is_unsigned_v<T>) {
    if (v.is_number_unsigned()) return v.get<T>();
  } else if (v.is_number_unsigned()) {
    if (v.get<unsigned long long>() <= static_cast<unsigned long long>(std::numeric_limits<T>::max()))
      return v.get<T>();
  } else if (v.is_number_integer()) {
    const long long x = v.get<long long>();
    if (x >= std::numeric_limits<T>::min() && x <= std::numeric_limits<T>::max()) return static_cast<T>(x);
  }
  throw std::invalid_argument(std::string("field ") + key + " has the wrong type");
}
}  // namespace

trial_record trial_record::from_json(const json& j) {
  if (!j.is_object()) throw std::invalid_argument("a record is an object");
  trial_record r;
  r.id = j.at("id").get<std::string>();
  r.params = j.at("params");
  if (!r.params.is_object()) throw std::invalid_argument("params is not an object");
  const std::string outcome = j.at("outcome").get<std::string>();
  r.pruned = outcome == "pruned";
  r.preempted = outcome == "preempted";
  r.kind = r.pruned || r.preempted ? outcome_kind::cancelled
                                   : outcome_kind_named(outcome).value_or(outcome_kind::internal_error);
  r.result = j.value("result", json());
  r.error = field(j, "error", std::string());
  r.wall_s = field(j, "wall_s", 0.0);
  r.device = field(j, "device", std::string());
  r.slot = field(j, "slot", 0);
  r.attempts = field(j, "attempts", 1);
  r.peak_reserved = field(j, "peak_reserved", std::uint64_t{0});
  r.peak_allocated = field(j, "peak_allocated", std::uint64_t{0});
  r.mem_limit = field(j, "mem_limit", std::uint64_t{0});
  r.run = field(j, "run", 0);
  r.start_s = field(j, "start_s", 0.0);
  r.timeline = field(j, "timeline", std::string());
  r.step = field(j, "step", std::int64_t{-1});
  r.retry_mem_limit = field(j, "retry_mem_limit", std::uint64_t{0});
  r.checkpoint = field(j, "checkpoint", std::int64_t{-1});
  if (const auto it = j.find("resumes"); it != j.end() && it->is_array()) r.resumes = *it;
  if (const auto it = j.find("origin"); it != j.end() && it->is_object()) r.origin = *it;
  return r;
}

std::string trial_record::to_line() const {
  return to_json().dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
}

journal::journal(const fs::path& folder) : path_{folder / "results.jsonl"} {
  const unique_fd dir = detail::open_folder(folder);
  if (!dir) throw internal_error("cannot open " + folder.string() + ": no such folder");
  unique_fd fd = detail::open_file(dir.get(), "results.jsonl", O_RDWR | O_CREAT | O_APPEND, path_);
  const std::size_t complete = detail::for_each_line(
      fd.get(), max_line, path_, [&](std::string_view line, int number, bool too_long) {
        const std::string where = path_.string() + " line " + std::to_string(number);
        if (too_long) {
          warnings_.push_back(where + " is longer than " + std::to_string(max_line >> 20) +
                              " MiB: not a trial record; ignored");
          return;
        }
        try {
          trial_record r = trial_record::from_json(parse_bounded_json(line));
          if (final_record(r)) ended_at_[r.id] = records_++;
          latest_[r.id] = std::move(r);
        } catch (const std::exception&) {
          warnings_.push_back(where + " is not a trial record; ignored (" + std::string(line.substr(0, 60)) +
                              (line.size() > 60 ? "..." : "") + ")");
        }
      });
  detail::drop_cut_line(fd.get(), complete, path_);
  fd_ = fd.release();
}

journal::~journal() {
  if (fd_ >= 0) ::close(fd_);
}

journal::journal(journal&& other) noexcept
    : fd_{std::exchange(other.fd_, -1)},
      path_{std::move(other.path_)},
      latest_{std::move(other.latest_)},
      warnings_{std::move(other.warnings_)} {}

journal& journal::operator=(journal&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
    latest_ = std::move(other.latest_);
    warnings_ = std::move(other.warnings_);
  }
  return *this;
}

void journal::append(const std::vector<trial_record>& records) {
  std::string text;
  for (const auto& r : records) text += r.to_line();
  const off_t before = ::lseek(fd_, 0, SEEK_END);
  const char* step = "cannot write the sweep journal";
  int failed = detail::write_all(fd_, text);
  if (!failed && ::fsync(fd_) != 0) {
    failed = errno;
    step = "cannot make the sweep journal durable (fsync)";
  }
  if (failed) {
    // Whole lines only: what this batch wrote, in part or not durably, is cut off again, so the
    // journal holds exactly the trials that count as done (the reader would drop a cut line
    // anyway); those trials run again on resume.
    if (before >= 0) [[maybe_unused]]
      int rc = ::ftruncate(fd_, before);
    const bool full = failed == ENOSPC || failed == EDQUOT;
    throw internal_error(std::string(step) + ": " + std::strerror(failed) + " (" + path_.string() + "; " +
                         std::to_string(latest_.size()) + " trials are journaled; " +
                         (full ? "free space" : "check the disk (dmesg)") +
                         " and run the same command again to resume)");
  }
  for (const auto& r : records) {
    if (final_record(r)) ended_at_[r.id] = records_++;
    latest_[r.id] = r;
  }
}

std::vector<std::string> journal::order() const {
  std::vector<std::pair<std::uint64_t, std::string>> by_place;
  by_place.reserve(ended_at_.size());
  for (const auto& [id, at] : ended_at_) by_place.emplace_back(at, id);
  std::sort(by_place.begin(), by_place.end());
  std::vector<std::string> ids;
  ids.reserve(by_place.size());
  for (auto& [at, id] : by_place) ids.push_back(std::move(id));
  return ids;
}

folder_lock::folder_lock(const fs::path& out, bool wait) {
  const fs::path path = out / "sweep.lock";
  const unique_fd dir = detail::open_folder(out);
  if (!dir) throw internal_error("cannot open " + out.string() + ": no such folder");
  unique_fd fd = detail::open_file(dir.get(), "sweep.lock", O_RDWR | O_CREAT, path);
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK) throw internal_error("cannot lock " + path.string() + ": " + std::strerror(errno));
    char holder[64] = {};
    [[maybe_unused]] auto n = ::pread(fd.get(), holder, sizeof holder - 1, 0);
    std::string who = holder;
    while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
    if (!wait)
      throw usage_error("output folder " + out.string() + " is in use by another sweep (" +
                        (who.empty() ? std::string("its pid is unknown") : "pid " + who) +
                        "); wait for it to finish, pass --wait to wait for it, or " + std::string(detail::another_out));
    std::fprintf(stderr, "isorun: waiting for the sweep using %s (pid %s) to finish\n", printable(out.string()).c_str(),
                 printable(who).c_str());
    while (::flock(fd.get(), LOCK_EX) != 0)
      if (errno != EINTR) throw internal_error("cannot lock " + path.string() + ": " + std::strerror(errno));
  }
  const std::string me = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd.get(), 0) == 0) {
    [[maybe_unused]] auto n = ::pwrite(fd.get(), me.data(), me.size(), 0);
  }
  fd_ = fd.release();
}

folder_lock::~folder_lock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

folder_lock::folder_lock(folder_lock&& other) noexcept : fd_{std::exchange(other.fd_, -1)} {}

folder_lock& folder_lock::operator=(folder_lock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

void write_file_durably(const fs::path& path, const std::string& content) {
  if (const int failed = serialization::write_whole_file(path.string(), content, true))
    throw internal_error("cannot write " + path.string() + ": " + std::strerror(failed));
}

}  // namespace isorun::sweep
