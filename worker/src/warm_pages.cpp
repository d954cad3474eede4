#include "isorun/worker/warm_pages.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  // Linux 5.14; an older kernel refuses it (EINVAL), and nothing is mapped
#endif

namespace isorun::worker {
namespace {

struct run {
  std::uintptr_t begin, end;
};

// Inherited by each fork: what the zygote had mapped of its file mappings.
std::vector<run>& noted() {
  static auto* runs = new std::vector<run>;  // never destroyed: a forked child may use it to its end
  return *runs;
}

// A calm wait first: a call sent back to back arrives sooner, and its worker maps nothing.
constexpr int calm_ms = 10;
// About a hundred µs of faults on a VM between two looks at the channel.
constexpr std::uintptr_t slice = 256 << 10;

// A mapping of a file worth warming: readable, of a regular file (not a device's memory, which a
// GPU driver maps, not a shared-memory segment).
bool worth_warming(const char* perms, const char* path) {
  return perms[0] == 'r' && path[0] == '/' && std::strncmp(path, "/dev/", 5) != 0 &&
         std::strncmp(path, "/memfd:", 7) != 0 && !std::strstr(path, " (deleted)");
}

// The runs of pages of [begin, end) that are mapped in this process (/proc/self/pagemap's
// "present" bit, readable without privileges), appended to `out`.
void note_present(int pagemap, std::uintptr_t begin, std::uintptr_t end, std::uintptr_t page, std::vector<run>& out) {
  std::uint64_t entries[512];
  for (std::uintptr_t at = begin; at < end;) {
    const std::size_t n = std::min<std::uintptr_t>((end - at) / page, std::size(entries));
    const ssize_t got = ::pread(pagemap, entries, n * sizeof entries[0], static_cast<off_t>(at / page * 8));
    if (got <= 0) return;
    for (std::size_t i = 0; i < static_cast<std::size_t>(got) / 8; ++i, at += page) {
      if (!(entries[i] >> 63)) continue;
      if (!out.empty() && out.back().end == at) out.back().end = at + page;
      else out.push_back({at, at + page});
    }
  }
}

// Whether `fd` is readable within `ms` (an error counts as readable: the wait after this one meets it).
bool readable(int fd, int ms) {
  pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
  return ::poll(&p, 1, ms) != 0;
}

}  // namespace

void note_pages_to_warm() {
  auto& runs = noted();
  runs.clear();
  if (const char* off = std::getenv("ISORUN_WARM_PAGES"); off && std::strcmp(off, "0") == 0) return;
  std::FILE* maps = std::fopen("/proc/self/maps", "re");
  const int pagemap = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  char line[4352];  // a path of PATH_MAX and the fields before it
  while (maps && pagemap >= 0 && std::fgets(line, sizeof line, maps)) {
    unsigned long begin = 0, end = 0;
    char perms[5] = {};
    int path_at = 0;
    if (std::sscanf(line, "%lx-%lx %4s %*s %*s %*s %n", &begin, &end, perms, &path_at) < 3 || path_at == 0) continue;
    line[std::strcspn(line, "\n")] = '\0';
    if (worth_warming(perms, line + path_at)) note_present(pagemap, begin, end, page, runs);
  }
  if (pagemap >= 0) ::close(pagemap);
  if (maps) std::fclose(maps);
}

void warm_pages_while_waiting(int fd) {
  auto& runs = noted();
  if (runs.empty() || readable(fd, calm_ms)) return;
  for (const run& r : runs)
    for (std::uintptr_t at = r.begin; at < r.end; at += slice) {
      if (readable(fd, 0)) return;
      // A failure (an older kernel; a mapping changed since the zygote noted it) costs only the
      // faults it would have saved.
      ::madvise(reinterpret_cast<void*>(at), std::min(slice, r.end - at), MADV_POPULATE_READ);
    }
  runs.clear();
}

}  // namespace isorun::worker
