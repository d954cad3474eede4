// The smallest C++ program that can serve as its own worker, built three ways: with libisorun
// (MIN_MAIN_WITH_ISORUN, calling isorun::init), with the C++ standard library only
// (MIN_MAIN_WITH_STD: what any C++ program loads), and with neither. bench_calls spawns all three:
// the differences are what linking libisorun adds to a program's start.
#ifdef MIN_MAIN_WITH_ISORUN
#include "isorun/isorun.hpp"
#endif
#ifdef MIN_MAIN_WITH_STD
#include <string>
#include <vector>
#endif

int main(int argc, char** argv) {
#ifdef MIN_MAIN_WITH_ISORUN
  isorun::init(argc, argv);
#endif
#ifdef MIN_MAIN_WITH_STD
  const std::vector<std::string> args(argv, argv + argc);
  return args.size() > 100;
#else
  (void)argc;
  (void)argv;
  return 0;
#endif
}
