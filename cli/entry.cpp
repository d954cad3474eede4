#include "entry.hpp"

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
#include "options.hpp"

namespace isorun::cli {
namespace {

// A failure before or outside the task: on stderr, and as a record on stdout under --json.
int report_failure(bool as_json, const char* outcome, int code, const std::string& what) {
  // The message may quote what others wrote: a spec, a folder's files, a task's words.
  std::fprintf(stderr, "isorun: %s: %s\n", code == 2 ? "error" : "internal error", printable(what).c_str());
  if (as_json) std::cout << nlohmann::json{{"outcome", outcome}, {"exit_code", code}, {"message", what}}.dump() << std::endl;
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

int guarded(int argc, char** argv, const std::function<int()>& work) {
  const bool as_json = wants_json(argc, argv);
  try {
    return work();
  } catch (const usage_error& e) {
    return report_failure(as_json, "usage", 2, e.what());
  } catch (const parse_error& e) {
    return report_failure(as_json, "usage", 2, e.what());
  } catch (const std::exception& e) {
    return report_failure(as_json, "internal_error", 125, e.what());
  }
}

}  // namespace isorun::cli
