// Every test binary is also an isorun worker: the tasks it registers run in re-executed copies.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdlib>

#include "isorun/worker/init.hpp"

int main(int argc, char** argv) {
  isorun::init(argc, argv);
  // Tests give the same verdict on any machine: calls made in this process see no GPU unless a
  // test names an inventory (programs a test starts are pinned by test_environment()).
  ::setenv("ISORUN_SIMULATE_GPUS", "none", 0);
  return Catch::Session().run(argc, argv);
}
