#include "entry.hpp"

#include <fcntl.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "isorun/runner/errors.hpp"
#include "isorun/runner/printable.hpp"
#include "isorun/runner/units.hpp"
#include "isorun/sweep/run.hpp"
#include "options.hpp"

namespace isorun::cli {
namespace {

// ISORUN_ERROR_FILE as it was given, once taken out of the environment.
std::string& error_file() {
  static std::string path;
  return path;
}

// ISORUN_ERROR_FILE, taken out of the environment (the programs isorun runs do not see it).
std::string take_error_file() {
  if (const char* path = std::getenv(error_file_env)) error_file() = path;
  ::unsetenv(error_file_env);
  return error_file();
}

// A failure before or outside the task: on stderr, as a record on stdout under --json, and in
// the error file a program running isorun asked for.
int report_failure(bool as_json, const std::string& error_file, const char* outcome, int code,
                   const std::string& what) {
  // The message may quote what others wrote: a spec, a folder's files, a task's words.
  std::fprintf(stderr, "isorun: %s: %s\n", code == 125 ? "internal error" : "error", printable(what).c_str());
  const std::string record =
      nlohmann::json{{"outcome", outcome}, {"exit_code", code}, {"message", valid_utf8(what)}}.dump() + "\n";
  if (as_json) std::cout << record << std::flush;
  if (!error_file.empty()) {
    // Never through a link; a file that cannot be written leaves the caller the exit code and stderr.
    const int fd = ::open(error_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd >= 0) {
      [[maybe_unused]] const auto n = ::write(fd, record.data(), record.size());
      ::close(fd);
    }
  }
  return code;
}

}  // namespace

void stop_with_parent() {
  const char* parent = std::getenv("ISORUN_STOP_WITH_PARENT");
  if (!parent) return;
  const long pid = std::strtol(parent, nullptr, 10);
  ::unsetenv("ISORUN_STOP_WITH_PARENT");
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (pid > 0 && ::getppid() != pid) std::raise(SIGTERM);  // it died before this took effect
}

void hand_on_error_file() {
  if (!error_file().empty()) ::setenv(error_file_env, error_file().c_str(), 1);
}

int guarded(int argc, char** argv, const std::function<int()>& work) {
  const bool as_json = wants_json(argc, argv);
  const std::string error_file = take_error_file();
  try {
    return work();
  } catch (const usage_error& e) {
    return report_failure(as_json, error_file, "usage", 2, e.what());
  } catch (const parse_error& e) {
    return report_failure(as_json, error_file, "usage", 2, e.what());
  } catch (const sweep::search_error& e) {  // the searcher's failure, not isorun's: exit 1 (docs/sweeps.md)
    return report_failure(as_json, error_file, "search_error", 1, e.what());
  } catch (const std::exception& e) {
    return report_failure(as_json, error_file, "internal_error", 125, e.what());
  }
}

}  // namespace isorun::cli
