#pragma once
/// @file printable.hpp
/// Text that others control (a task's exception message, its stderr, a spec's or a journal's
/// strings) as it may be printed to a terminal.

#include <string>
#include <string_view>

#include "isorun/internal_api.hpp"

namespace isorun {

/// @brief `text` with every control character in a visible form, so that printing it cannot
///        drive the terminal (set its title, clear it, move the cursor over lines isorun printed):
///        C0 controls, DEL and the C1 controls U+0080 to U+009F become `\xHH` (the C1 ones as
///        `\u00HH`), bytes that are not UTF-8 `\xHH`. Newline and tab stay: they only move the
///        cursor forward, and the messages that need them (a traceback, a spec's excerpt, stderr
///        lines) are unreadable without. A backslash stays as it is.
[[nodiscard]] ISORUN_INTERNAL_API std::string printable(std::string_view text);

/// @brief `text` as valid UTF-8: each byte that is not part of a well-formed sequence becomes
///        U+FFFD. Text a task produces (its stderr, its exception's message and type) goes
///        through this before it is kept in an outcome: JSON (the journal, `--json`) and Python
///        strings take UTF-8 only, and a Latin-1 message or a line cut inside a character must
///        not stop a run.
[[nodiscard]] ISORUN_INTERNAL_API std::string valid_utf8(std::string_view text);

}  // namespace isorun
