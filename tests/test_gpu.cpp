// Checks that need a real GPU (ctest label `gpu`). Without one the binary exits 77, which ctest
// reports as skipped.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "isorun/gpu_inventory.hpp"
#include "isorun/process.hpp"
#include "test_support.hpp"

using nlohmann::json;

namespace {

isorun::test::captured run(std::vector<std::string> args) {
  args.insert(args.begin(), {"--tasks", CLI_TEST_TASKS});
  return isorun::test::run_captured(ISORUN_CLI, args);
}

}  // namespace

TEST_CASE("the worker sees exactly the assigned GPU, by UUID", "[gpu]") {
  const auto inv = isorun::runner::gpu_inventory::detect();
  auto r = run({"-q", "--gpu", "0", "--mem-limit", "1G", "where"});
  REQUIRE(r.code == 0);
  CHECK(json::parse(r.out) == inv.gpus[0].uuid + " cap=" + std::to_string(1ULL << 30));
}

TEST_CASE("the CUDA allocator enforces --mem-limit minus the CUDA context", "[gpu]") {
  auto ok = run({"-q", "--json", "--gpu", "0", "--mem-limit", "1G", "hog", "arg0=256"});
  REQUIRE(ok.code == 0);
  json j = json::parse(ok.out);
  CHECK(j["peak_reserved"].get<std::uint64_t>() <= (1ULL << 30));
  auto oom = run({"--gpu", "0", "--mem-limit", "1G", "hog", "arg0=2048"});
  CHECK(oom.code == 3);
  CHECK(oom.err.find("CUDA context") != std::string::npos);
  auto expandable = run({"-q", "--gpu", "0", "--mem-limit", "1G", "--alloc-conf", "strategy:expandable", "hog", "arg0=512"});
  CHECK(expandable.code == 0);
}

TEST_CASE("the digits classifier gives the same answer on GPU and CPU", "[gpu]") {
  const std::vector<std::string> params = {"digits", "model=mlp", "lr=0.1", "hidden=64", "epochs=30", "seed=1"};
  auto with = [&](std::vector<std::string> head) {
    head.insert(head.end(), params.begin(), params.end());
    auto r = run(head);
    REQUIRE(r.code == 0);
    return json::parse(r.out);
  };
  json gpu = with({"-q", "--gpu", "0", "--mem-limit", "2G"});
  json cpu = with({"-q", "--cpu"});
  CHECK(gpu["device"].get<std::string>().rfind("cuda:", 0) == 0);
  CHECK(gpu["accuracy"].get<double>() >= 0.95);
  CHECK(std::abs(gpu["accuracy"].get<double>() - cpu["accuracy"].get<double>()) <= 0.02);
  CHECK(std::abs(gpu["test_loss"].get<double>() - cpu["test_loss"].get<double>()) <= 0.05);
}

int main(int argc, char** argv) {
  if (std::getenv("ISORUN_SIMULATE_GPUS") || isorun::runner::gpu_inventory::detect().gpus.empty()) {
    std::printf("no GPU (NVML finds none): skipping the GPU checks\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
