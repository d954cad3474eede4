// A sweep's folder as a crash, a damaged disk or someone else left it, through `isorun report`:
// sweep.json, the journal and a trial's memory timeline (logs/0000000000000001.memory.json, the
// id the seed corpus's records have) in, a page out. The input is the three files, separated
// by lines "====". Not being a sweep's folder is the one error allowed: anything else thrown
// (an internal error, a json exception) is a finding.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "isorun/runner/errors.hpp"
#include "isorun/sweep/html_report.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace fs = std::filesystem;
  static const fs::path dir = [] {
    auto d = fs::temp_directory_path() / ("isorun-fuzz-report-" + std::to_string(::getpid()));
    fs::create_directories(d / "logs");
    return d;
  }();
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  std::string_view files[3];
  for (auto& f : files) {
    const auto cut = rest.find("\n====\n");
    f = rest.substr(0, cut);
    rest = cut == std::string_view::npos ? std::string_view() : rest.substr(cut + 6);
  }
  const fs::path paths[3] = {dir / "sweep.json", dir / "results.jsonl", dir / "logs" / "0000000000000001.memory.json"};
  for (int i = 0; i < 3; ++i)
    std::ofstream(paths[i], std::ios::binary | std::ios::trunc)
        .write(files[i].data(), static_cast<std::streamsize>(files[i].size()));
  try {
    const auto d = isorun::sweep::load_report_data(dir);
    (void)isorun::sweep::render_report(d);
  } catch (const isorun::usage_error&) {
  }
  return 0;
}
