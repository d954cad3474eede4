// The environment a capped command's process hands to a program it starts, as a program may
// make it (any entries, duplicates, LD_PRELOAD lists of any shape): the cap's exec wrappers must
// size what they write exactly, and what they hand on must keep the program on the cap.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cap_env.hpp"

namespace env = isorun::preload::env;

namespace {
constexpr const char* names[] = {"ISORUN_CAP_REGION", "ISORUN_CAP_TERMS", "ISORUN_GPU"};
constexpr const char* values[] = {"ISORUN_CAP_REGION=/proc/1/fd/3", "ISORUN_CAP_TERMS=/proc/1/fd/4", "ISORUN_GPU=0"};
constexpr const char* self = "/opt/isorun/lib/libisorun_cuda_cap.so";

// The environment as the started program sees it keeps the cap: every pinned variable set, and
// only to its pinned value; the LD_PRELOAD ld.so uses (the last) names the library.
void check(char* const* e, const env::pins& p) {
  const char* preload = nullptr;
  bool seen[3] = {};
  for (std::size_t n = 0; e[n]; ++n) {
    if (env::sets(e[n], "LD_PRELOAD")) preload = e[n];
    for (std::size_t i = 0; i < p.count; ++i)
      if (p.entries[i] && env::sets(e[n], names[i])) {
        if (std::strcmp(e[n], p.entries[i]) != 0) std::abort();
        seen[i] = true;
      }
  }
  for (std::size_t i = 0; i < p.count; ++i)
    if (p.entries[i] && !seen[i]) std::abort();
  if (!preload || !env::preloads(preload + 11, self)) std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  // The first byte says which variables are pinned; the rest, split at NUL bytes, is the
  // environment, where "@" stands for the library's path (so the fuzzer finds lists naming it).
  const char* entries[3];
  for (int i = 0; i < 3; ++i) entries[i] = (data[0] >> i) & 1 ? values[i] : nullptr;
  const env::pins pins{names, entries, 3, self};
  std::vector<std::string> strings;
  std::string cur;
  for (std::size_t k = 1; k < size; ++k) {
    const char c = static_cast<char>(data[k]);
    if (c == '\0') {
      strings.push_back(cur);
      cur.clear();
    } else if (c == '@') {
      cur += self;
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) strings.push_back(cur);
  std::vector<char*> envp;
  for (auto& s : strings) envp.push_back(s.data());
  envp.push_back(nullptr);

  const env::plan plan = env::make_plan(envp.data(), pins);
  if (!plan.slots) {
    check(envp.data(), pins);
    return 0;
  }
  // Exactly the sizes the plan asked for: ASan reports a write past either.
  std::vector<char*> out(plan.slots);
  std::vector<char> buffer(plan.buffer);
  env::fill(envp.data(), plan, pins, out.data(), plan.buffer ? buffer.data() : nullptr);
  if (plan.buffer && std::strlen(buffer.data()) + 1 != plan.buffer) std::abort();
  check(out.data(), pins);
  return 0;
}
