// A sweep's inputs checked before anything is created or started: early stopping and the
// metric, each trial's GPUs, out-of-memory retries, the host cap and the caps; then its output
// folder opened.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "backends/backends.hpp"
#include "backends/local_backend.hpp"
#include "engine/folder.hpp"
#include "engine/run_state.hpp"
#include "isorun/alloc/config.hpp"
#include "isorun/runner/errors.hpp"
#include "isorun/runner/gpu_packer.hpp"
#include "isorun/runner/job.hpp"
#include "isorun/runner/suggest.hpp"
#include "isorun/runner/units.hpp"
#include "isorun/sweep/report.hpp"
#include "search/early_stop.hpp"

namespace isorun::sweep {

namespace {
namespace fs = std::filesystem;
using nlohmann::json;

// Each trial's GPU count (spans_gpus(s)), checked: a whole number from 1 to the GPUs the sweep
// has. gpus_per_trial: "{name}" takes it from parameter `name`.
std::vector<std::size_t> gpus_per_trial(const sweep_spec& s, const std::vector<slot>& slots) {
  const std::size_t have = runner::gpu_packer(slots).gpus();
  const int line = s.gpus_per_trial_line;
  if (have == 0)
    throw located(s, line,
                  "gpus_per_trial needs GPUs, and the sweep has none; list them (resources: gpus: [0, 1], "
                  "or --gpus 0,1)");
  const std::string& name = s.gpus_per_trial_param;
  if (!name.empty() && !s.trials.empty() && !s.trials.front().contains(name)) {
    std::vector<std::string> names;
    for (const auto& [k, v] : s.trials.front().items()) names.push_back(k);
    throw located(s, line,
                  "gpus_per_trial takes parameter '" + name + "', which the sweep does not have" +
                      did_you_mean(name, names) + "; its parameters: " + name_list(names));
  }
  std::vector<std::size_t> counts;
  counts.reserve(s.trials.size());
  for (const auto& t : s.trials) {
    int k = s.gpus_per_trial;
    if (!name.empty()) {
      const json& v = t[name];
      if (!v.is_number_integer() || v.get<long long>() < 1 || v.get<long long>() > 1024)
        throw located(s, line,
                      "gpus_per_trial takes parameter '" + name + "', whose value " + v.dump() +
                          " is not a number of GPUs (1 or more)");
      k = v.get<int>();
    }
    if (static_cast<std::size_t>(k) > have)
      throw located(s, line,
                    "a trial asks for " + std::to_string(k) + " GPUs (gpus_per_trial), but the sweep has " +
                        std::to_string(have) + "; list more GPUs or ask for fewer");
    counts.push_back(static_cast<std::size_t>(k));
  }
  return counts;
}

// What out-of-memory retries need: a cap to grow, a max above it, and GPUs where a trial at the
// max fits (else a trial would wait for room that never comes); and a backend that journals
// every attempt as it ends (backend_traits::oom_retry).
void check_oom_retry(const sweep_spec& s, const sweep_options& options, const std::vector<slot>& slots,
                     const std::vector<std::size_t>& gpu_counts) {
  const oom_retry_spec& r = s.oom_retry;
  const std::string what = (r.line ? "oom_retry" : "--oom-retry") + std::string(" (max ") + format_size(r.max) + ")";
  // At its spec line; the flag's errors name the flag, not the spec file.
  auto refused = [&](const std::string& why) { return r.line ? located(s, r.line, why) : spec_error(why, 0); };
  if (const backend_kind& backend = backend_of(s, options); !backend.traits.oom_retry)
    throw refused(what + " runs on this machine only, not with backend: " + std::string(backend.name) +
                  "; remove it, or run the sweep here (backend: local)");
  if (!s.mem_limit) {
    // A cap the first retry can grow from: max / factor, as the spec would write it.
    std::string first = format_size(std::max<std::uint64_t>(1, static_cast<std::uint64_t>(r.max / r.factor)));
    first.erase(std::remove(first.begin(), first.end(), ' '), first.end());  // one word on a command line
    throw refused(what +
                  " retries a trial at a larger cap, and the sweep has no cap to start from; set one below max "
                  "(resources: mem_limit: " +
                  first + ", or --mem-limit " + first + ")");
  }
  if (r.max <= s.mem_limit)
    throw refused(what + ": max is not above mem_limit " + format_size(s.mem_limit) +
                  ", so no retry could have a larger cap; raise max");
  const auto memory = trial_memory(s, slots);
  if (memory.empty()) return;  // CPU slots: nothing to pack against
  std::size_t widest = 1, fit = 0;
  for (std::size_t k : gpu_counts) widest = std::max(widest, k);
  std::string room;
  for (const auto& [gpu, bytes] : memory) {
    fit += bytes >= r.max;
    room += (room.empty() ? "" : ", ") + ("GPU " + std::to_string(gpu) + ": " + format_size(bytes));
  }
  if (fit < widest)
    throw refused(what + ": a trial at the max needs " + format_size(r.max) + " on " + std::to_string(widest) + " GPU" +
                  (widest == 1 ? "" : "s") + ", more than the sweep's GPUs have for trials (" + room +
                  "; free memory less room for warm standby contexts); lower max");
}

}  // namespace

void check_resources(run_state& st) {
  const sweep_spec& s = st.s;
  if (s.early_stopping) {
    // Early stopping: what it judges by, and trials that can report steps, known before anything starts.
    const int line = s.early_stopping.line;
    if (const std::string why = early_stopping_problem(s.early_stopping); !why.empty())
      throw located(s, line, "scheduler: " + why);
    if (s.metric.name.empty())
      throw located(s, line,
                    "scheduler: " + s.early_stopping.type +
                        " judges trials by a metric, and the sweep has none; add "
                        "metric: {name: loss, goal: minimize} (or --metric loss:min)");
  }
  if (const auto shape = s.metric.name.empty() ? std::nullopt : st.program->result_shape()) {
    if (auto problem = metric_problem(s, *shape, "task '" + s.task + "'"); !problem.empty())
      throw located(s, s.metric.line, problem);
    st.metric_known = true;
  }
  const bool submitter = !backend_of(s, st.opt).traits.runs_here;  // its slots are on the nodes
  if (spans_gpus(s) && !submitter) st.gpu_counts = gpus_per_trial(s, st.slots);
  if (s.oom_retry) check_oom_retry(s, st.opt, st.slots, st.gpu_counts);
  // Where the trials run, a cgroup must enforce the host cap (the submitter's machine is not theirs).
  if (s.host_mem_limit && !submitter) runner::check_host_mem_limit(s.host_mem_limit);
  try {
    st.timelines = st.program->uses_isorun_allocator() && alloc::alloc_config::parse(s.alloc_conf).history > 0;
  } catch (const alloc::config_error&) {
  }  // (check_job_spec below says what is wrong with it)
  for (const auto& sl : st.slots) {
    runner::job_spec probe;
    probe.gpus = sl.gpus;
    probe.mem_limit = s.mem_limit;
    probe.alloc_conf = s.alloc_conf;
    runner::check_job_spec(probe);
  }
}

void open_out(run_state& st) {
  const sweep_spec& s = st.s;
  st.out = s.out.empty() ? fs::path("isorun-sweep-" + st.program->short_name()) : fs::path(s.out);
  st.out_text = st.out.string();
  std::error_code ec;
  fs::create_directories(st.out / "logs", ec);
  if (ec) throw internal_error("cannot create " + (st.out / "logs").string() + ": " + ec.message());
  const unique_fd out_dir = detail::open_folder(st.out);
  if (!out_dir) throw internal_error("cannot open " + st.out_text + ": not a folder");
  st.logs = detail::open_subfolder(out_dir.get(), "logs", true, st.out / "logs");
  if (s.checkpoints) {  // refused now, before anything starts, if it cannot hold them
    const unique_fd checkpoints = detail::open_subfolder(out_dir.get(), "checkpoints", true, st.out / "checkpoints");
    // Tried, not asked (access() says yes to root whatever the folder's attributes).
    const std::string probe = ".probe-" + std::to_string(::getpid());
    if (::mkdirat(checkpoints.get(), probe.c_str(), 0700) != 0)
      throw usage_error("the checkpoint folder " + (st.out / "checkpoints").string() + " is not writable (" +
                        std::strerror(errno) + "): the trials' checkpoints could not be saved; fix its permissions");
    ::unlinkat(checkpoints.get(), probe.c_str(), AT_REMOVEDIR);
  }
}

}  // namespace isorun::sweep
