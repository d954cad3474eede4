// What users type: key=value task arguments (checked against a task's C++ types), sizes,
// durations, allocator configurations, and the warm-device variable; and any text a task
// writes, made valid UTF-8 for JSON (valid_utf8: what it gives must dump without an error).
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include "isorun/alloc/config.hpp"

#include "isorun/runner/errors.hpp"
#include "isorun/runner/printable.hpp"
#include "isorun/runner/task_arguments.hpp"
#include "isorun/runner/units.hpp"
#include "isorun/serialization/protocol.hpp"
#include "isorun/worker/task.hpp"

namespace {
struct options {
  int epochs = 3;
  double lr = 0.1;
  bool shuffle = true;
  std::string name = "x";
  std::vector<int> layers{64, 32};
  std::uint64_t seed = 0;
  template <class A>
  void serialize(A& ar) {
    ar(CEREAL_NVP(epochs), CEREAL_NVP(lr), CEREAL_NVP(shuffle), CEREAL_NVP(name), CEREAL_NVP(layers), CEREAL_NVP(seed));
  }
};
int fuzz_task(const options& o) { return o.epochs; }
}  // namespace
ISORUN_TASK(fuzz_task);

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> words;
  for (std::size_t start = 0; start <= text.size();) {
    const auto end = text.find('\n', start);
    words.push_back(text.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  static const auto* task = isorun::worker::registry::instance().find("fuzz_task");
  try {
    (void)isorun::runner::arguments::build_task_args(*task, words);
  } catch (const isorun::usage_error&) {
  }
  try {
    (void)isorun::parse_size(text);
  } catch (const isorun::parse_error&) {
  }
  try {
    (void)isorun::parse_duration(text);
  } catch (const isorun::parse_error&) {
  }
  try {
    (void)isorun::alloc::alloc_config::parse(text);
  } catch (const isorun::alloc::config_error&) {
  }
  (void)isorun::serialization::parse_warm_device(text);
  (void)nlohmann::json(isorun::valid_utf8(text)).dump();  // throws type_error.316 on a byte left invalid
  return 0;
}
