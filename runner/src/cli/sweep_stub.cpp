#include "cli_args.hpp"
#include "isorun/errors.hpp"

namespace isorun::cli {
int run_sweep(const cli_options&, const std::vector<std::string>&) {
  throw usage_error("sweeps are not available in this build");
}
}  // namespace isorun::cli
