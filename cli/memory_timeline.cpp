#include "memory_timeline.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "isorun/runner/errors.hpp"
#include "isorun/runner/printable.hpp"
#include "isorun/sweep/journal.hpp"
#include "isorun/sweep/memory_timeline.hpp"

namespace isorun::cli {
namespace fs = std::filesystem;

void check_timeline_page(const std::string& page) {
  // (The page replaces whatever is at its name.)
  const fs::path folder = fs::path(page).has_parent_path() ? fs::path(page).parent_path() : ".";
  if (::access(folder.c_str(), W_OK | X_OK) != 0)
    throw usage_error("--memory-timeline " + page + ": cannot write there (" + folder.string() + ": " +
                      std::strerror(errno) + ")");
}

void write_timeline_page(const std::string& page, const nlohmann::json& timeline, const std::string& title,
                         bool quiet) {
  try {
    sweep::write_file_durably(page, sweep::render_memory_timeline(timeline, title));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "isorun: no memory timeline: %s\n", printable(e.what()).c_str());
    return;
  }
  if (!quiet) std::fprintf(stderr, "isorun: memory timeline in %s\n", page.c_str());
}

}  // namespace isorun::cli
