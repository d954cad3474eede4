#pragma once
// A small file's whole text (procfs, sysfs and cgroup files, the inventory cache): "" if it
// cannot be read.

#include <fstream>
#include <sstream>
#include <string>

namespace isorun::runner::detail {

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace isorun::runner::detail
