#include "memory_timeline.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "isorun/html/memory_timeline.hpp"
#include "isorun/runner/errors.hpp"
#include "isorun/runner/printable.hpp"
#include "isorun/serialization/whole_file.hpp"

namespace isorun::cli {
namespace fs = std::filesystem;

namespace {
fs::path folder_of(const std::string& page) {
  return fs::path(page).has_parent_path() ? fs::path(page).parent_path() : fs::path(".");
}
}  // namespace

void check_timeline_page(const std::string& page) {
  // (The page replaces whatever is at its name.)
  const fs::path folder = folder_of(page);
  if (::access(folder.c_str(), W_OK | X_OK) != 0)
    throw usage_error("--memory-timeline " + page + ": cannot write there (" + folder.string() + ": " +
                      std::strerror(errno) + ")");
}

void write_timeline_page(const std::string& page, const nlohmann::json& timeline, const std::string& title,
                         bool quiet) {
  // Whole or not at all, and never through a link planted at its name.
  if (const int failed = serialization::write_whole_file(page, html::render_memory_timeline(timeline, title), true)) {
    std::fprintf(stderr, "isorun: no memory timeline: cannot write %s: %s\n", printable(page).c_str(),
                 std::strerror(failed));
    return;
  }
  if (!quiet) std::fprintf(stderr, "isorun: memory timeline in %s\n", page.c_str());
}

}  // namespace isorun::cli
