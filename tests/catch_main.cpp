// Every test binary is also an isorun worker: the tasks it registers run in re-executed copies.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "isorun/init.hpp"

int main(int argc, char** argv) {
  isorun::init(argc, argv);
  return Catch::Session().run(argc, argv);
}
