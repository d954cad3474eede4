// A trial's checkpoints (checkpoint.hpp): staged, committed whole, the latest kept.
#include "isorun/worker/checkpoint.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace isorun {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view prefix = "step-";
constexpr std::string_view staging_prefix = ".writing-";

[[noreturn]] void fail(const std::string& what, const fs::path& where, int err) {
  throw std::runtime_error("checkpoint folder " + where.string() + ": " + what + ": " + std::strerror(err));
}

// fsync of one file or folder, by path, never through a link.
void sync_path(const fs::path& p, bool directory) {
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | (directory ? O_DIRECTORY : 0));
  if (fd < 0) fail("cannot open " + p.filename().string() + " to sync it", p.parent_path(), errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) fail("cannot sync " + p.filename().string(), p.parent_path(), err);
}

// Everything under `root` durable: its files, then its folders, deepest first, then itself.
void sync_tree(const fs::path& root) {
  std::vector<fs::path> folders;
  for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator(); ++it) {
    const auto status = it->symlink_status();
    if (fs::is_regular_file(status)) sync_path(it->path(), false);
    else if (fs::is_directory(status)) folders.push_back(it->path());
  }
  for (auto f = folders.rbegin(); f != folders.rend(); ++f) sync_path(*f, true);
  sync_path(root, true);
}

// The step a committed folder's name says: ASCII digits, any step from 0 to INT64_MAX (every
// step a checkpoint can be committed at is listed again: one never listed would be neither
// resumed from nor pruned); nullopt for any other name.
std::optional<std::int64_t> step_of(const std::string& name) {
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  std::int64_t step = 0;
  for (std::size_t i = prefix.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    const int digit = name[i] - '0';
    if (step > (INT64_MAX - digit) / 10) return std::nullopt;
    step = step * 10 + digit;
  }
  return step;
}

}  // namespace

std::string checkpoint_name(std::int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%s%012lld", prefix.data(), static_cast<long long>(step));
  return buf;
}

checkpoint_folder::checkpoint_folder(fs::path dir, int keep) : dir_{std::move(dir)}, keep_{keep} {
  if (keep < 1)
    throw std::invalid_argument("checkpoints keep " + std::to_string(keep) +
                                ": at least 1 (the latest checkpoint is what a later attempt resumes from)");
  // Each level that exists must be a real folder: a link would put a trial's checkpoints (and
  // what isorun removes from them) somewhere else.
  for (const fs::path& level : {dir_.parent_path(), dir_}) {
    struct stat st {};
    if (::lstat(level.c_str(), &st) != 0) {
      if (errno != ENOENT) fail("cannot look at it", level, errno);
      if (::mkdir(level.c_str(), 0755) != 0 && errno != EEXIST) fail("cannot create it", level, errno);
      sync_path(level.has_parent_path() ? level.parent_path() : fs::path("."), true);  // it survives a crash too
      if (::lstat(level.c_str(), &st) != 0) fail("cannot look at it", level, errno);
    }
    if (S_ISLNK(st.st_mode))
      throw std::runtime_error("checkpoint folder " + level.string() +
                               " is a symbolic link; isorun writes checkpoints only into a folder of its own "
                               "(remove the link)");
    if (!S_ISDIR(st.st_mode))
      throw std::runtime_error("checkpoint folder " + level.string() + " is not a folder (remove or rename it)");
  }
  if (::access(dir_.c_str(), W_OK | X_OK) != 0)
    fail("not writable (checkpoints could not be saved; fix its permissions)", dir_, errno);
}

std::vector<checkpoint_info> checkpoint_folder::committed() const {
  std::vector<checkpoint_info> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    if (!e.is_directory(ec) || e.is_symlink(ec)) continue;
    if (const auto step = step_of(e.path().filename().string())) found.push_back({*step, e.path()});
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.step < b.step; });
  return found;
}

std::optional<checkpoint_info> checkpoint_folder::latest() const {
  auto all = committed();
  if (all.empty()) return std::nullopt;
  return all.back();
}

fs::path checkpoint_folder::stage(std::int64_t step) const {
  static std::atomic<unsigned> serial{0};
  fs::path staged = dir_ / (std::string(staging_prefix) + std::to_string(step) + "-" + std::to_string(::getpid()) +
                            "-" + std::to_string(serial++));
  std::error_code ec;
  fs::remove_all(staged, ec);
  if (::mkdir(staged.c_str(), 0755) != 0) fail("cannot create a staging folder", dir_, errno);
  return staged;
}

void checkpoint_folder::check_step(std::int64_t step) const {
  if (step < 0) throw std::invalid_argument("checkpoint step " + std::to_string(step) + " is negative");
  if (const auto last = latest(); last && step <= last->step)
    throw std::invalid_argument("checkpoint step " + std::to_string(step) + " is not after the latest committed one, " +
                                std::to_string(last->step) + ", in " + dir_.string() +
                                " (steps only go forward; the checkpoint was not committed)");
}

checkpoint_info checkpoint_folder::commit(const fs::path& staged, std::int64_t step) {
  check_step(step);
  sync_tree(staged);
  const fs::path target = dir_ / checkpoint_name(step);
  if (::rename(staged.c_str(), target.c_str()) != 0) fail("cannot commit " + staged.filename().string(), dir_, errno);
  sync_path(dir_, true);
  // The oldest beyond `keep` go; a failure there costs only space.
  auto all = committed();
  for (std::size_t i = 0; i + static_cast<std::size_t>(keep_) < all.size(); ++i) {
    std::error_code ec;
    fs::remove_all(all[i].path, ec);
  }
  return {step, target};
}

fs::path checkpoint_folder::command_staged(std::int64_t step) const {
  const fs::path own = dir_ / (std::string(command_staging) + "-" + std::to_string(step));
  struct stat st {};
  return ::lstat(own.c_str(), &st) == 0 && S_ISDIR(st.st_mode) ? own : dir_ / command_staging;
}

void checkpoint_folder::clear_staging() const {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    const std::string name = e.path().filename().string();
    if (name.compare(0, staging_prefix.size(), staging_prefix) == 0 || name == command_staging ||
        name.rfind(std::string(command_staging) + "-", 0) == 0)
      fs::remove_all(e.path(), ec);
  }
  if (::mkdir((dir_ / command_staging).c_str(), 0755) != 0 && errno != EEXIST) fail("cannot create tmp", dir_, errno);
}

}  // namespace isorun
