#include <cstdio>
#include <string>

#include <isorun/isorun.hpp>

std::string shout(const std::string& s) { return s + "!"; }
ISORUN_TASK(shout);

int main(int argc, char** argv) {
  isorun::init(argc, argv);
  auto r = isorun::isolated(shout)("installed");
  std::printf("%s\n", r.c_str());
  return r == "installed!" ? 0 : 1;
}
