#pragma once
/// @file units.hpp
/// Byte sizes and durations as users write them: `2G`, `512M`, `1.5GiB`, `2GB`, `500ms`, `30s`.

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include "isorun/export.hpp"

namespace isorun {

/// A size or duration string that could not be parsed; the message says what is accepted.
class ISORUN_API parse_error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// @brief Parses a byte size: plain bytes (`1048576`), or a number with a unit. `K/M/G/T`,
///        `KB/MB/GB/TB` and `KiB/MiB/GiB/TiB` all mean powers of 1024, as GPU memory is
///        counted. Fractions are allowed (`1.5G`). Case-insensitive.
/// @throws parse_error for anything else (negative, empty, unknown unit, overflow).
ISORUN_API std::uint64_t parse_size(std::string_view text);

/// @brief Parses a duration: a number followed by `ms`, `s`, `m`, `h` (`500ms`, `1.5s`, `5m`).
///        The unit is required: a bare `10` could mean seconds or milliseconds.
/// @throws parse_error for anything else.
ISORUN_API std::chrono::milliseconds parse_duration(std::string_view text);

/// @brief `1610612736` → `"1.50 GiB"`.
ISORUN_API std::string format_size(std::uint64_t bytes);

/// @brief `1234ms` → `"1.23 s"`.
ISORUN_API std::string format_duration(std::chrono::nanoseconds d);

inline namespace literals {
constexpr std::uint64_t operator""_KiB(unsigned long long v) { return v << 10; }
constexpr std::uint64_t operator""_MiB(unsigned long long v) { return v << 20; }
constexpr std::uint64_t operator""_GiB(unsigned long long v) { return v << 30; }
}  // namespace literals

}  // namespace isorun
