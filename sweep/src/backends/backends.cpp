#include "backends/backends.hpp"

#include <array>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>

#include "backends/local_backend.hpp"
#include "backends/slurm_backend.hpp"

namespace isorun::sweep {

namespace {
using nlohmann::json;
using clock = std::chrono::steady_clock;

std::unique_ptr<trial_backend> make_local(const run_state& st, int run, clock::time_point run_start) {
  const sweep_spec& s = st.s;
  return std::make_unique<local_backend>(
      local_setup{.spec = &s,
                  .program = st.program.get(),
                  .options = &st.opt,
                  .slots = st.slots,
                  .out = st.out,
                  .logs = st.logs.get(),
                  .timelines = st.timelines,
                  .run = run,
                  .run_start = run_start,
                  // (A sweep whose source makes every trial still makes its workers like the spec's.)
                  .first = !st.queue.empty()  ? std::optional<json>(trial_at(st, st.queue.front()).params)
                           : s.trials.empty() ? std::nullopt
                                              : std::optional<json>(s.trials.front())});
}

// A searcher chooses each trial from the results of those before, so its array tasks are
// submitted as slots come free, which needs a bound on how many run at once.
void check_slurm(const sweep_spec& s) {
  if (s.search && s.slurm && s.slurm->max_running < 1)
    throw located(s, s.search.line,
                  "search: on Slurm needs resources: max_running: N, the array tasks that run at once (its searcher "
                  "chooses each trial from the results of those before, so they are submitted as slots come free)");
}

std::unique_ptr<trial_backend> make_slurm(const run_state& st, int /*run*/, clock::time_point /*run_start*/) {
  std::set<std::string> journaled;
  for (const auto& [id, r] : st.journal->latest())
    if (is_done(st, r)) journaled.insert(id);  // (a failure to run again with --rerun-failed is not)
  return std::make_unique<slurm_backend>(slurm_setup{.spec = &st.s,
                                                     .options = &st.opt,
                                                     .subject = st.subject,
                                                     .out = st.out,
                                                     .queue = st.queue,
                                                     .journaled = std::move(journaled),
                                                     .job_name = "isorun-" + st.program->short_name()});
}

const std::array<backend_kind, 2> backends{{
    {.name = "local", .traits = {}, .check = nullptr, .make = make_local},
    {.name = "slurm",
     .traits = {.runs_here = false, .caller_sources = false, .oom_retry = false, .detach = true},
     .check = check_slurm,
     .make = make_slurm},
}};

const backend_kind& named(std::string_view name) {
  for (const auto& k : backends)
    if (k.name == name) return k;
  throw std::logic_error("no backend named " + std::string(name));
}

}  // namespace

const backend_kind& backend_of(const sweep_spec& s, const sweep_options& options) {
  return named(options.node.empty() ? backend_name(s) : "local");
}

std::string backends_that(bool backend_traits::*trait) {
  std::string names;
  for (const auto& k : backends)
    if (k.traits.*trait) names += (names.empty() ? "" : ", ") + std::string(k.name);
  return names;
}

const backend_traits& backend_traits_of(const sweep_spec& s, const sweep_options& options) {
  return backend_of(s, options).traits;
}

}  // namespace isorun::sweep
