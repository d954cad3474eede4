// Compiled, never run: the umbrella header stands alone and keeps nlohmann/json (a dependency of
// the CLI and sweeps only) out of every user's translation unit.
#include "isorun/isorun.hpp"

#ifdef NLOHMANN_JSON_VERSION_MAJOR
#error "isorun/isorun.hpp pulls in nlohmann/json"
#endif
