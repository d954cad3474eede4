#include "isorun/serialization/cpu_handoff.hpp"

#include <sched.h>

#include <climits>
#include <cstring>

namespace isorun::serialization {

namespace {

constexpr std::size_t word_bits = 64;
constexpr std::size_t set_words = sizeof(cpu_set_t) * CHAR_BIT / word_bits;
static_assert(sizeof(cpu_set_t) % sizeof(std::uint64_t) == 0);

}  // namespace

cpu_mask hand_this_cpu_to(pid_t tid) noexcept {
  const int cpu = ::sched_getcpu();
  cpu_set_t had;
  if (cpu < 0 || ::sched_getaffinity(tid, sizeof had, &had) != 0) return {};
  if (CPU_COUNT(&had) < 2 || !CPU_ISSET(cpu, &had)) return {};
  std::uint64_t words[set_words];
  std::memcpy(words, &had, sizeof words);
  std::size_t used = set_words;
  while (used > 0 && words[used - 1] == 0) --used;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  try {
    cpu_mask mask(words, words + used);
    if (::sched_setaffinity(tid, sizeof one, &one) != 0) return {};
    return mask;
  } catch (...) {  // no memory for the copy: the worker is left as it was
    return {};
  }
}

void restore_cpus(const cpu_mask& mask) noexcept {
  if (mask.empty()) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (mask.size() <= set_words) std::memcpy(&set, mask.data(), mask.size() * sizeof(std::uint64_t));
  if (mask.size() <= set_words && CPU_COUNT(&set) > 0 && ::sched_setaffinity(0, sizeof set, &set) == 0) return;
  std::memset(&set, 0xff, sizeof set);  // the kernel keeps the CPUs the cpuset allows
  ::sched_setaffinity(0, sizeof set, &set);
}

}  // namespace isorun::serialization
