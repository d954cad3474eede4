#include "report_command.hpp"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "isorun/runner/bounded_json.hpp"
#include "isorun/runner/printable.hpp"
#include "isorun/sweep/html_report.hpp"
#include "isorun/sweep/slurm.hpp"

namespace isorun::cli {

int write_report(const cli_options& o) {
  sweep::write_report(o.out);
  std::fprintf(stderr, "isorun: report in %s\n",
               printable((std::filesystem::path(o.out) / "report.html").string()).c_str());
  return 0;
}

int show_status(const cli_options& o) {
  const std::filesystem::path out = o.out;
  const auto d = sweep::load_report_data(out);  // usage_error if OUT is not a sweep's folder
  std::size_t total = 0;
  {
    std::ifstream in(out / "sweep.json");
    const auto identity = parse_bounded_json(in);
    if (identity.is_object()) total = identity.value("trials", std::size_t{0});
  }
  std::string by_outcome;
  for (const auto& [k, n] : d.outcomes) by_outcome += (by_outcome.empty() ? "" : ", ") + std::to_string(n) + " " + k;
  std::printf("sweep %s in %s: %zu of %zu trials journaled%s%s\n", printable(d.subject).c_str(),
              printable(out.string()).c_str(), d.records.size(), total, by_outcome.empty() ? "" : ": ",
              by_outcome.c_str());
  std::size_t waiting = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(out / "slurm" / "results", ec))
    waiting += e.path().extension() == ".json";
  std::ifstream in(out / "slurm" / "jobs.json");
  const auto jobs = parse_bounded_json(in);
  if (jobs.is_array())
    for (const auto& j : jobs) {
      if (!j.is_object()) continue;  // not isorun's: nothing to follow
      const std::string job = j.value("job", "");
      const auto active = sweep::slurm::active_tasks(job);
      const std::string state = !active           ? "Slurm does not answer now (try again)"
                                : active->empty() ? "done"
                                                  : std::to_string(active->size()) + " array tasks queued or running";
      std::printf("Slurm job array %s: %s\n", printable(job).c_str(), state.c_str());
    }
  if (waiting)
    std::printf("%zu trial results wait to be journaled (run the sweep's command again, or --attach)\n", waiting);
  return 0;
}

}  // namespace isorun::cli
