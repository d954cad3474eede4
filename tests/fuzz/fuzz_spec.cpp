// A sweep spec as a user writes it (YAML): every error is a spec_error naming a line.
#include <cstdint>
#include <string>

#include "isorun/runner/errors.hpp"
#include "isorun/sweep/spec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    auto s = isorun::sweep::parse_spec(text, "fuzz.yaml");
    for (const auto& t : s.trials) (void)isorun::sweep::param_words(t);
  } catch (const isorun::sweep::spec_error&) {
  } catch (const isorun::usage_error&) {
  }
  return 0;
}
