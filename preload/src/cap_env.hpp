#pragma once
// The environment a process of a capped command hands to a program it starts: what must change
// so the program stays on the cap (the pinned variables restored, this library first in
// LD_PRELOAD), computed and written without allocating, since the exec wrappers may run in a
// vfork child. Header-only so that tests/fuzz/fuzz_cap_env.cpp drives the same code.
#include <cstddef>
#include <cstring>

namespace isorun::preload::env {

/// Whether `entry` ("NAME=...") sets variable `name`.
inline bool sets(const char* entry, const char* name) {
  const std::size_t n = std::strlen(name);
  return std::strncmp(entry, name, n) == 0 && entry[n] == '=';
}

/// Whether the LD_PRELOAD value `list` (paths separated by ':' or ' ') names library `self`.
inline bool preloads(const char* list, const char* self) {
  const std::size_t n = std::strlen(self);
  if (n == 0) return false;
  for (const char* p = list; (p = std::strstr(p, self)); p += n)
    if ((p == list || p[-1] == ':' || p[-1] == ' ') && (p[n] == '\0' || p[n] == ':' || p[n] == ' ')) return true;
  return false;
}

/// What the environment must keep: `count` variables by name, each with the entry
/// ("NAME=value") it must have, or null where it is not pinned; and the library's path.
struct pins {
  const char* const* names;
  const char* const* entries;
  std::size_t count;
  const char* self;
};

/// How an environment must change: `slots` entries for the new one (its null included) and
/// `buffer` bytes for a new LD_PRELOAD entry; 0 slots when it needs no change.
struct plan {
  std::size_t slots = 0;
  std::size_t buffer = 0;
  const char* preload = nullptr;  ///< the environment's last LD_PRELOAD entry (the one ld.so uses)
};

/// @brief What `envp` lacks to keep the cap under `p`. A pinned variable set to anything else,
///        more than once or not at all, or an LD_PRELOAD that does not name the library, asks
///        for a new environment.
inline plan make_plan(char* const* envp, const pins& p) {
  constexpr std::size_t max_pins = 8;
  plan out;
  if (!p.self || p.count > max_pins) return out;
  std::size_t n = 0;
  bool change = false;
  bool seen[max_pins] = {};
  for (; envp && envp[n]; ++n) {
    if (sets(envp[n], "LD_PRELOAD")) out.preload = envp[n];
    for (std::size_t i = 0; i < p.count; ++i)
      if (p.entries[i] && sets(envp[n], p.names[i])) {
        seen[i] = std::strcmp(envp[n], p.entries[i]) == 0;
        change |= !seen[i];
      }
  }
  for (std::size_t i = 0; i < p.count; ++i) change |= p.entries[i] && !seen[i];
  constexpr std::size_t key = sizeof "LD_PRELOAD=" - 1;
  const bool preload_ok = out.preload && preloads(out.preload + key, p.self);
  if (!change && preload_ok) return out;
  out.slots = n + p.count + 2;
  if (!preload_ok) out.buffer = key + std::strlen(p.self) + (out.preload ? 1 + std::strlen(out.preload + key) : 0) + 1;
  return out;
}

/// @brief Writes the environment `pl` (from make_plan with the same `envp` and `p`) asks for into
///        `out` (pl.slots entries) and `buffer` (pl.buffer bytes): `envp` without the pinned
///        variables, then each pinned entry once, then, where LD_PRELOAD lacked the library, a
///        new LD_PRELOAD with the library first and the old list after it.
inline void fill(char* const* envp, const plan& pl, const pins& p, char** out, char* buffer) {
  constexpr std::size_t key = sizeof "LD_PRELOAD=" - 1;
  std::size_t k = 0;
  for (std::size_t n = 0; envp && envp[n]; ++n) {
    bool drop = pl.buffer && envp[n] == pl.preload;
    for (std::size_t i = 0; i < p.count && !drop; ++i) drop = p.entries[i] && sets(envp[n], p.names[i]);
    if (!drop) out[k++] = envp[n];
  }
  for (std::size_t i = 0; i < p.count; ++i)
    if (p.entries[i]) out[k++] = const_cast<char*>(p.entries[i]);
  if (pl.buffer) {
    char* at = buffer;
    auto put = [&at](const char* s) { at = ::stpcpy(at, s); };
    put("LD_PRELOAD=");
    put(p.self);
    if (pl.preload) {
      put(":");
      put(pl.preload + key);
    }
    out[k++] = buffer;
  }
  out[k] = nullptr;
}

}  // namespace isorun::preload::env
