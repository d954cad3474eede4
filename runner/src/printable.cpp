#include "isorun/runner/printable.hpp"

#include <cstdio>

#include "isorun/runner/task_arguments.hpp"

namespace isorun {

std::string printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  char buf[8];
  auto escape = [&](const char* format, unsigned value) {
    std::snprintf(buf, sizeof buf, format, value);
    out += buf;
  };
  for (std::size_t i = 0; i < text.size();) {
    // Up to the next byte that is not UTF-8: it is escaped alone, and the text goes on after it.
    const std::size_t bad = runner::arguments::utf8_error_at(text.substr(i));
    const std::size_t end = bad == std::string_view::npos ? text.size() : i + bad;
    while (i < end) {
      const auto c = static_cast<unsigned char>(text[i]);
      if (c == '\n' || c == '\t' || (c >= 0x20 && c < 0x7f) || c >= 0xc3) {  // (0xc3 and up: no C1 lead byte)
        out += text[i++];
      } else if (c < 0x80) {  // C0, DEL
        escape("\\x%02x", c);
        ++i;
      } else if (c == 0xc2 && static_cast<unsigned char>(text[i + 1]) <= 0x9f) {  // U+0080 to U+009F
        escape("\\u%04x", static_cast<unsigned char>(text[i + 1]));
        i += 2;
      } else {
        out += text[i++];
      }
    }
    if (i < text.size()) escape("\\x%02x", static_cast<unsigned char>(text[i++]));
  }
  return out;
}

std::string valid_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (;;) {
    const std::size_t bad = runner::arguments::utf8_error_at(text);
    if (bad == std::string_view::npos) return out.append(text);
    out.append(text.substr(0, bad)).append("\xef\xbf\xbd");  // U+FFFD, for that one byte
    text.remove_prefix(bad + 1);
  }
}

}  // namespace isorun
