// A sweep spec as a user writes it (YAML): every error is a spec_error naming a line. A spec
// that parses with backend: slurm also yields its sbatch command line and batch script, which
// must hold no line break outside the script's own two commands: a setting that could end an
// option and start a shell line was to be refused by the parser.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "isorun/runner/errors.hpp"
#include "isorun/sweep/slurm.hpp"
#include "isorun/sweep/spec.hpp"

namespace {

void check_slurm(const isorun::sweep::slurm_spec& sl) {
  namespace slurm = isorun::sweep::slurm;
  std::vector<std::string> args;
  try {
    args = slurm::sbatch_arguments(sl, 3, "/out/slurm/logs", "isorun-fuzz");
  } catch (const isorun::usage_error&) {
    std::abort();  // the parser let through a setting that submitting refuses
  }
  for (const auto& a : args)
    for (unsigned char c : a)
      if (c < 0x20 || c == 0x7f) std::abort();  // a control character reached sbatch
  const std::string script = slurm::batch_script("/out/slurm/batch-1.json", {"/bin/isorun", "sweep"}, "/work");
  if (script.find("#SBATCH") != std::string::npos) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    auto s = isorun::sweep::parse_spec(text, "fuzz.yaml");
    for (const auto& t : s.trials) (void)isorun::sweep::param_words(t);
    if (s.slurm) check_slurm(*s.slurm);
  } catch (const isorun::sweep::spec_error&) {
  } catch (const isorun::usage_error&) {
  }
  return 0;
}
