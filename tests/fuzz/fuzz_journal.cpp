// The journal as a crashed or tampered-with run left it: resume reads it back.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "isorun/runner/errors.hpp"
#include "isorun/sweep/journal.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::filesystem::path dir = [] {
    auto d = std::filesystem::temp_directory_path() / ("isorun-fuzz-journal-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  std::ofstream(dir / "results.jsonl", std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  try {
    isorun::sweep::journal j(dir);
    for (const auto& [id, rec] : j.latest()) (void)rec.to_json();
  } catch (const isorun::internal_error&) {
  }
  return 0;
}
