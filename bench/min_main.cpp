// The smallest C++ program that can serve as its own worker, built twice: with libisorun
// (MIN_MAIN_WITH_ISORUN, calling isorun::init) and without. bench_calls spawns both: the
// difference is what linking libisorun adds to any program's start.
#ifdef MIN_MAIN_WITH_ISORUN
#include "isorun/isorun.hpp"
#endif

int main(int argc, char** argv) {
#ifdef MIN_MAIN_WITH_ISORUN
  isorun::init(argc, argv);
#else
  (void)argc;
  (void)argv;
#endif
  return 0;
}
