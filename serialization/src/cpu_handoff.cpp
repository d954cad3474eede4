#include "isorun/serialization/cpu_handoff.hpp"

#include <dirent.h>
#include <sched.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <cstring>

namespace isorun::serialization {

namespace {

constexpr std::size_t word_bits = 64;
constexpr std::size_t set_words = sizeof(cpu_set_t) * CHAR_BIT / word_bits;
static_assert(sizeof(cpu_set_t) % sizeof(std::uint64_t) == 0);

cpu_mask to_mask(const cpu_set_t& set) {
  std::uint64_t words[set_words];
  std::memcpy(words, &set, sizeof words);
  std::size_t used = set_words;
  while (used > 0 && words[used - 1] == 0) --used;
  return cpu_mask(words, words + used);
}

// False for a mask with no CPU, or more words than a cpu_set_t holds.
bool to_set(const cpu_mask& mask, cpu_set_t& set) noexcept {
  CPU_ZERO(&set);
  if (mask.size() > set_words) return false;
  std::memcpy(&set, mask.data(), mask.size() * sizeof(std::uint64_t));
  return CPU_COUNT(&set) > 0;
}

// `tid`'s affinity set to `set`, or where that fails, to every CPU the cpuset allows (the kernel
// keeps those of a full mask).
void widen(pid_t tid, const cpu_set_t* set) noexcept {
  if (set && ::sched_setaffinity(tid, sizeof *set, set) == 0) return;
  cpu_set_t all;
  std::memset(&all, 0xff, sizeof all);
  ::sched_setaffinity(tid, sizeof all, &all);
}

}  // namespace

cpu_mask hand_this_cpu_to(pid_t tid) noexcept {
  const int cpu = ::sched_getcpu();
  cpu_set_t had;
  if (tid <= 0 || cpu < 0 || ::sched_getaffinity(tid, sizeof had, &had) != 0) return {};
  if (CPU_COUNT(&had) < 2 || !CPU_ISSET(cpu, &had)) return {};
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  try {
    cpu_mask mask = to_mask(had);
    if (::sched_setaffinity(tid, sizeof one, &one) != 0) return {};
    return mask;
  } catch (...) {  // no memory for the copy: the worker is left as it was
    return {};
  }
}

cpu_mask this_thread_cpus() noexcept {
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return {};
  try {
    return to_mask(set);
  } catch (...) {
    return {};
  }
}

void restore_cpus(const cpu_mask& mask, const cpu_mask& before_wait) noexcept {
  if (mask.empty()) return;
  cpu_set_t set, narrowed;
  const bool valid = to_set(mask, set);
  widen(0, valid ? &set : nullptr);
  // Narrowed before the wait: the start went on on one CPU, and the threads it made since have
  // that CPU alone. (Those made before were never narrowed: only the main thread was.)
  if (!to_set(before_wait, narrowed) || CPU_COUNT(&narrowed) != 1) return;
  cpu_set_t both;
  if (valid) {
    CPU_AND(&both, &narrowed, &set);
    if (!CPU_EQUAL(&both, &narrowed) || CPU_COUNT(&set) < 2) return;  // a worker launched on one CPU
  }
  DIR* tasks = ::opendir("/proc/self/task");
  if (!tasks) return;
  const pid_t self = ::gettid();
  while (const dirent* e = ::readdir(tasks)) {
    const pid_t tid = static_cast<pid_t>(std::strtol(e->d_name, nullptr, 10));
    cpu_set_t has;
    if (tid <= 0 || tid == self || ::sched_getaffinity(tid, sizeof has, &has) != 0) continue;
    if (CPU_EQUAL(&has, &narrowed)) widen(tid, valid ? &set : nullptr);
  }
  ::closedir(tasks);
}

}  // namespace isorun::serialization
