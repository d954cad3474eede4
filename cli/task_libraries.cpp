#include "task_libraries.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>

#include "isorun/runner/errors.hpp"
#include "isorun/runner/process.hpp"

#ifndef ISORUN_TASK_SUBDIR
#define ISORUN_TASK_SUBDIR "isorun/tasks"
#endif

namespace isorun::cli {
namespace fs = std::filesystem;

namespace {

std::string existing(const std::string& library, const std::string& named_by) {
  std::error_code ec;
  if (!fs::exists(library, ec)) throw usage_error(named_by + " " + library + ": no such file");
  return fs::absolute(library).string();
}

}  // namespace

std::vector<std::string> task_libraries(const cli_options& o) {
  std::vector<std::string> libs;
  for (const auto& l : o.task_libraries) libs.push_back(existing(l, "--tasks"));
  if (const char* env = std::getenv("ISORUN_TASKS"); env && *env) {
    const std::string s = env;
    for (std::size_t start = 0; start <= s.size();) {
      const auto end = std::min(s.find(':', start), s.size());
      if (end > start) libs.push_back(existing(s.substr(start, end - start), "ISORUN_TASKS entry"));
      start = end + 1;
    }
  }
  // This program (isorun-cli) lives in the library folder, build tree and install tree alike.
  const fs::path dir = fs::path(runner::self_executable()).parent_path() / ISORUN_TASK_SUBDIR;
  std::error_code ec;
  std::vector<std::string> found;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.path().extension() == ".so") found.push_back(entry.path().string());
  std::sort(found.begin(), found.end());
  for (auto& f : found)
    if (std::find(libs.begin(), libs.end(), f) == libs.end()) libs.push_back(std::move(f));
  return libs;
}

void load_libraries(const std::vector<std::string>& libs) {
  for (const auto& l : libs) {
    try {
      if (!::dlopen(l.c_str(), RTLD_NOW | RTLD_GLOBAL))
        throw usage_error(std::string("cannot load task library: ") + ::dlerror());
    } catch (const std::logic_error& e) {  // duplicate task names, thrown by a static initializer
      throw usage_error(e.what());
    }
  }
}

}  // namespace isorun::cli
