#include "options.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <string_view>
#include <utility>

#include "isorun/alloc/config.hpp"
#include "isorun/runner/errors.hpp"
#include "isorun/runner/suggest.hpp"
#include "isorun/runner/units.hpp"

namespace isorun::cli {
namespace {

// Which commands take an option, one bit each. The main command's options also go before a
// subcommand's name (`isorun --tasks LIB.so --grace 1s sweep ...`); `tasks` and `gpus` take
// them after it too.
enum scope : unsigned {
  in_main = 1U << 0,
  in_sweep = 1U << 1,
  in_tasks = 1U << 2,
  in_gpus = 1U << 3,
  in_report = 1U << 4,
  in_status = 1U << 5,
  everywhere = 0x3FU,
};

// Checks a value and stores it (an empty value for a flag). `flag` is the option's long name,
// for messages. Throws usage_error, or parse_error, which apply() prefixes with the flag.
using setter = void (*)(cli_options& o, const std::string& flag, const std::string& value);

// One option: how it is spelled, where it is taken, what the help says, what it sets.
struct option_row {
  const char* names;  // as CLI11 spells them: "-q,--quiet"
  const char* value;  // the value's name in the help ("SIZE"); nullptr for a flag
  unsigned scopes;
  const char* help;  // one paragraph, wrapped to the help's width; nullptr: neither shown nor suggested
  setter set;
};

constexpr std::size_t help_width = 100;  // columns of --help, every line
constexpr std::size_t help_column = 21;  // where option descriptions start

// A whole number in 0..limit, or -1 if the text is not one.
int small_number(std::string_view text, long limit = 1024) {
  if (text.empty() || text.size() > 9 ||
      !std::all_of(text.begin(), text.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
    return -1;
  const long v = std::strtol(std::string(text).c_str(), nullptr, 10);
  return v > limit ? -1 : static_cast<int>(v);
}

int whole_number(const std::string& flag, const std::string& v) {
  const int n = small_number(v, 1L << 30);
  if (n < 0) throw usage_error(flag + " " + v + ": expected a whole number");
  return n;
}

// GPU indices as "0,1" (a bare number is a list of one); `what` says what else could be given.
std::vector<int> gpu_indices(const std::string& flag, const std::string& v, const char* what) {
  std::vector<int> out;
  for (std::size_t at = 0; at <= v.size();) {
    const auto comma = std::min(v.find(',', at), v.size());
    const int i = small_number(std::string_view(v).substr(at, comma - at));
    if (i < 0) throw usage_error(flag + " '" + v + "': expected GPU indices such as 0,1 (see isorun gpus), or " + what);
    out.push_back(i);
    at = comma + 1;
  }
  return out;
}

void set_mem_limit(cli_options& o, const std::string& flag, const std::string& v) {
  o.mem_limit = parse_size(v);
  if (o.mem_limit == 0) throw usage_error(flag + " must be greater than zero");
}

void set_port(cli_options& o, const std::string& flag, const std::string& v) {
  const int n = small_number(v, 65535);
  if (n < 0) throw usage_error(flag + " " + v + ": expected a port number, 0..65535 (0: a free one)");
  o.serve.port = n;
  o.serve.addressed = true;
}

void set_bind(cli_options& o, const std::string&, const std::string& v) {
  o.serve.bind = v;
  o.serve.addressed = true;
}

void set_timeout(cli_options& o, const std::string& flag, const std::string& v) {
  o.timeout = parse_duration(v);
  if (o.timeout.count() <= 0) throw usage_error(flag + " must be greater than zero");
}

void check_alloc_conf(const std::string& where, const std::string& conf) {
  try {
    alloc::alloc_config::parse(conf);
  } catch (const alloc::config_error& e) {
    throw usage_error(where + ": " + e.what());
  }
}

// --gpus of a run: these GPUs (0,1) or any N (any:N). A count is always spelled any:N, so
// `--gpus 0` means what `--gpu 0` does.
void set_run_gpus(cli_options& o, const std::string& flag, const std::string& v) {
  if (v.starts_with("any:")) {
    o.gpu_count = small_number(std::string_view(v).substr(4));
    if (o.gpu_count < 1) throw usage_error(flag + " '" + v + "': any:N needs a count of 1 or more, e.g. any:2");
    return;
  }
  o.gpus = gpu_indices(flag, v, "any:N for any N GPUs");
}

void set_grid(cli_options& o, const std::string& flag, const std::string& v) {
  const auto eq = v.find('=');
  if (eq == std::string::npos || eq == 0) throw usage_error(flag + " " + v + ": expected key=v1,v2,...");
  std::vector<std::string> values;
  for (std::size_t at = eq + 1; at < v.size();) {
    const auto comma = std::min(v.find(',', at), v.size());
    values.push_back(v.substr(at, comma - at));
    at = comma + 1;
  }
  o.sweep.grid.emplace_back(v.substr(0, eq), std::move(values));
}

void set_gpus_per_trial(cli_options& o, const std::string& flag, const std::string& v) {
  o.sweep.gpus_per_trial_param.clear();
  if (v.size() > 2 && v.front() == '{' && v.back() == '}') {
    o.sweep.gpus_per_trial_param = v.substr(1, v.size() - 2);
    o.sweep.gpus_per_trial = 1;
  } else if ((o.sweep.gpus_per_trial = whole_number(flag, v)) < 1) {
    throw usage_error(flag + " must be at least 1, or {name} for parameter name's value");
  }
}

void set_retry(cli_options& o, const std::string& flag, const std::string& v) {
  const auto eq = v.find('=');
  if (eq == std::string::npos) throw usage_error(flag + " " + v + ": expected CLASS=N");
  const std::string cls = v.substr(0, eq);
  if (cls == "out_of_memory") throw usage_error(flag + " out_of_memory: OOM is never retried at the same cap");
  if (cls != "crashed" && cls != "timeout" && cls != "invalid_result" && cls != "task_error")
    throw usage_error(flag + " " + cls + ": unknown outcome class (crashed, timeout, invalid_result, task_error)");
  o.sweep.retries[cls] = whole_number(flag, v.substr(eq + 1));
}

// The options of every command. A name may have a row per command where it means something else
// there (--gpus of a run is not --gpus of a sweep); the value checks are shared.
const option_row table[] = {
    // isorun [OPTIONS] TASK / -- CMD
    {"--gpu", "N", in_main, "run on GPU N (default: GPU 0 if there is one, else CPU)",
     [](cli_options& o, const std::string& f, const std::string& v) {
       const int i = small_number(v);
       if (i < 0) throw usage_error(f + " '" + v + "': expected a GPU index such as 0 (see isorun gpus), or use --cpu");
       o.gpu = i;
     }},
    {"--gpus", "LIST", in_main,
     "run on these GPUs (0,1), or on any N with room for the cap (any:N); the worker sees exactly "
     "them, in PCI bus order, as CUDA devices 0, 1, ...",
     set_run_gpus},
    {"--cpu", nullptr, in_main, "run with no GPU visible",
     [](cli_options& o, const std::string&, const std::string&) { o.cpu = true; }},
    {"--mem-limit", "SIZE", in_main,
     "hard cap on the worker's device memory, on each of its GPUs (CUDA context included): 2G, "
     "512M, 1.5GiB, 2GB, bytes; with --cpu, a TASK's cap on what isorun's allocator gives it. For "
     "-- CMD it is enforced on the CUDA driver API for the command and every process it starts, "
     "together (allocations past it fail with CUDA_ERROR_OUT_OF_MEMORY; cuMemGetInfo reports the "
     "cap): a guard every process stays within, not a security boundary against a program that "
     "sets out to escape it (that is cgroup dmem's); see docs/any-program.md. A -- CMD with no GPU "
     "is refused it: its host memory is --host-mem-limit's",
     set_mem_limit},
    {"--host-mem-limit", "SIZE", in_main | in_sweep,
     "hard cap on the host memory of the worker (or -- CMD, or each trial) and every process it "
     "starts, enforced by its cgroup (no swap past it): past it, it ends out of memory (exit 3). "
     "Refused where no cgroup with the memory controller can enforce it",
     [](cli_options& o, const std::string& f, const std::string& v) {
       o.host_mem_limit = parse_size(v);
       if (o.host_mem_limit == 0) throw usage_error(f + " must be greater than zero");
     }},
    {"--mem-limit-mode", "M", in_main,
     "for -- CMD: enforced (default) or advisory (only exported, as ISORUN_MEM_LIMIT)",
     [](cli_options& o, const std::string& f, const std::string& v) {
       if (v != "enforced" && v != "advisory") throw usage_error(f + " " + v + ": expected enforced or advisory");
       o.mem_limit_advisory = v == "advisory";
     }},
    {"--timeout", "DUR", in_main, "stop the worker after DUR: 500ms, 30s, 5m, 1h", set_timeout},
    {"--grace", "DUR", in_main, "time between SIGTERM and SIGKILL when stopping (default 5s)",
     [](cli_options& o, const std::string&, const std::string& v) { o.grace = parse_duration(v); }},
    {"--tasks", "LIB.so", in_main | in_tasks,
     "load tasks from this library (repeatable; also ISORUN_TASKS=a.so:b.so; libraries in "
     "<libdir>/isorun/tasks are always loaded)",
     [](cli_options& o, const std::string&, const std::string& v) { o.task_libraries.push_back(v); }},
    {"--alloc-conf", "STR", in_main, "allocator configuration, as ISORUN_ALLOC_CONF",
     [](cli_options& o, const std::string& f, const std::string& v) {
       check_alloc_conf(f, v);
       o.alloc_conf = v;
     }},
    {"--max-result", "SIZE", in_main, "reject results larger than SIZE (default: this machine's memory)",
     [](cli_options& o, const std::string&, const std::string& v) { o.max_result = parse_size(v); }},
    {"--json", nullptr, in_main, "print a JSON record (outcome, result, timings) instead of only the result",
     [](cli_options& o, const std::string&, const std::string&) { o.json = true; }},
    {"--json", nullptr, in_tasks | in_gpus, "print JSON instead of text",
     [](cli_options& o, const std::string&, const std::string&) { o.json = true; }},
    {"--memory-timeline", "FILE.html", in_main,
     "draw the device memory over time (allocated, reserved, the cap) and, after an "
     "out-of-memory failure, what was live then, into FILE.html: a TASK's (turns on the "
     "allocator's history: history:100000 unless --alloc-conf sets history:N), or with "
     "--mem-limit what every process of a -- CMD held (the cap's view, by process)",
     [](cli_options& o, const std::string& f, const std::string& v) {
       if (v.empty()) throw usage_error(f + " needs a file name, e.g. memory.html");
       o.memory_timeline = v;
     }},
    {"-q,--quiet", nullptr, in_main, "no summary line on stderr",
     [](cli_options& o, const std::string&, const std::string&) { o.quiet = true; }},
    // isorun sweep
    {"--grid", "KEY=V1,V2", in_sweep, "a parameter of a TASK or a -- PROGRAM and its values (repeatable)", set_grid},
    {"--out", "DIR", in_sweep, "output folder (results.jsonl, results.csv, logs/); default isorun-sweep-TASK",
     [](cli_options& o, const std::string&, const std::string& v) { o.sweep.out = v; }},
    {"--gpus", "LIST", in_sweep, "GPU indices (0,1) or all; without it, trials use CPU slots",
     [](cli_options& o, const std::string& f, const std::string& v) {
       o.sweep.all_gpus = v == "all";
       o.sweep.gpus = o.sweep.all_gpus ? std::vector<int>{} : gpu_indices(f, v, "all");
     }},
    {"--mem-limit", "SIZE", in_sweep, "cap per trial; on GPUs, slots per GPU = floor(free memory / SIZE)",
     set_mem_limit},
    {"--per-gpu", "N", in_sweep, "trials per GPU instead (default: as many caps as fit, at most the cores per GPU)",
     [](cli_options& o, const std::string& f, const std::string& v) { o.sweep.per_gpu = whole_number(f, v); }},
    {"--gpus-per-trial", "N", in_sweep,
     "GPUs each trial runs on at once (one of its places on each; the cap is per GPU), or {name}: as "
     "many as parameter name says, so 1-, 2- and 4-GPU trials mix; served in order, a waiting wide "
     "trial holding the GPUs it waits for",
     set_gpus_per_trial},
    {"--cpu-slots", "N", in_sweep, "parallel CPU trials (default: the cores isorun may run on)",
     [](cli_options& o, const std::string& f, const std::string& v) { o.sweep.cpu_slots = whole_number(f, v); }},
    {"--timeout", "DUR", in_sweep, "per-trial timeout", set_timeout},
    {"--standby", "N", in_sweep, "workers launched ahead per slot, each used for one trial (default 1; 0: none)",
     [](cli_options& o, const std::string& f, const std::string& v) { o.sweep.standby = whole_number(f, v); }},
    {"--no-warm-context", nullptr, in_sweep, "standby workers on GPUs do not create their CUDA context ahead",
     [](cli_options& o, const std::string&, const std::string&) { o.sweep.cold_standby = true; }},
    {"--retry", "CLASS=N", in_sweep, "retries for crashed, timeout, invalid_result or task_error (OOM: --oom-retry)",
     set_retry},
    {"--oom-retry", "FACTOR:MAX[:ATTEMPTS]", in_sweep,
     "run a trial that ran out of memory again with its cap times FACTOR (at least 1.1), up to MAX "
     "(the last attempt at MAX), where the larger cap fits, at most ATTEMPTS times in all (8): 2:16G",
     [](cli_options& o, const std::string&, const std::string& v) {
       o.sweep.oom_retry = sweep::parse_oom_retry_flag(v);
     }},
    {"--rerun-failed", nullptr, in_sweep, "rerun trials whose journaled outcome is a failure",
     [](cli_options& o, const std::string&, const std::string&) { o.sweep.rerun_failed = true; }},
    {"--fail-fast", nullptr, in_sweep, "stop at the first failed trial",
     [](cli_options& o, const std::string&, const std::string&) { o.sweep.fail_fast = true; }},
    {"--metric", "NAME[:min|max]", in_sweep, "rank by this numeric field of the result (max if no goal given)",
     [](cli_options& o, const std::string&, const std::string& v) { o.sweep.metric = sweep::parse_metric_flag(v); }},
    {"--scheduler", "TYPE[:K=V,...]", in_sweep,
     sweep::scheduler_flag_help().c_str(),  // (the registry's rules)
     [](cli_options& o, const std::string&, const std::string& v) {
       o.sweep.scheduler = sweep::parse_scheduler_flag(v);
     }},
    {"--top", "K", in_sweep, "rows in the final table (default 5; 0: no table)",
     [](cli_options& o, const std::string& f, const std::string& v) { o.sweep.top = whole_number(f, v); }},
    {"--wait", nullptr, in_sweep, "if another sweep uses the output folder, wait for it instead of failing",
     [](cli_options& o, const std::string&, const std::string&) { o.sweep.wait = true; }},
    {"--backend", "B", in_sweep, sweep::backend_choices().c_str(),
     [](cli_options& o, const std::string& f, const std::string& v) {
       sweep::sweep_spec probe;  // (the spec's table of backends says which names there are)
       if (!sweep::select_backend(probe, v)) throw usage_error(f + " " + v + ": expected " + sweep::backend_choices());
       o.sweep.backend = v;
     }},
    {"--track", "NAME[=URI]", in_sweep,
     "send the sweep's events to a tracker too: mlflow (URI: its tracking store, e.g. sqlite:///mlflow.db) or "
     "tensorboard (URI: its log folder); or one the spec's track: names (repeatable)",
     [](cli_options& o, const std::string& f, const std::string& v) {
       const auto eq = v.find('=');
       const std::string name = v.substr(0, eq);
       if (!sweep::tracker_name_ok(name))
         throw usage_error(f + " " + v + ": expected NAME or NAME=URI, e.g. mlflow=sqlite:///mlflow.db");
       o.sweep.track.emplace_back(name, eq == std::string::npos ? "" : v.substr(eq + 1));
     }},
    {"--detach", nullptr, in_sweep,
     "with slurm: submit and return; the same command again (or --attach) follows the arrays, "
     "journals their results and resubmits lost trials",
     [](cli_options& o, const std::string&, const std::string&) { o.sweep.detach = true; }},
    {"--attach", nullptr, in_sweep, "the same as running the command again: follow what was submitted",
     [](cli_options&, const std::string&, const std::string&) {}},
    {"--no-progress", nullptr, in_sweep, "no progress output",
     [](cli_options& o, const std::string&, const std::string&) { o.sweep.progress = false; }},
    // isorun report and isorun sweep
    {"--serve", nullptr, in_sweep | in_report,
     "serve the report over HTTP and keep it live: the page updates as trials end (read-only; the "
     "address to open, with its token, is printed)",
     [](cli_options& o, const std::string&, const std::string&) { o.serve.on = true; }},
    {"--port", "N", in_sweep | in_report, "with --serve: the port (default: a free one)", set_port},
    {"--bind", "ADDR", in_sweep | in_report,
     "with --serve: the address to listen on (default 127.0.0.1; 0.0.0.0 or :: serve other "
     "machines too)",
     set_bind},
    {"--node", "FILE:TASK", in_sweep, nullptr,  // an array task of a Slurm submission: isorun passes it
     [](cli_options& o, const std::string&, const std::string& v) { o.sweep.node = v; }},
    // every command
    {"-h,--help", nullptr, everywhere, "this text",
     [](cli_options& o, const std::string&, const std::string&) { o.what = mode::help; }},
    {"--version", nullptr, in_main, "the version",
     [](cli_options& o, const std::string&, const std::string&) {
       if (o.what != mode::help) o.what = mode::version;
     }},
};

std::string long_name(const option_row& row) {
  const std::string_view names = row.names;
  return std::string(names.substr(names.rfind(',') + 1));
}

// Every flag goes through here, whatever the command: its setter, and its message prefixed.
void apply(const option_row& row, cli_options& o, const std::string& value) {
  const std::string flag = long_name(row);
  try {
    row.set(o, flag, value);
  } catch (const parse_error& e) {
    throw usage_error(flag + ": " + e.what());
  } catch (const sweep::spec_error& e) {
    throw usage_error(e.what());
  }
}

// The names a mistyped flag of this command may have meant.
std::vector<std::string> known_names(unsigned where) {
  std::vector<std::string> names;
  for (const auto& row : table)
    if ((row.scopes & where) && row.help) names.push_back(long_name(row));
  return names;
}

// Whether the command line may name the row's option: one of its words is the option, as
// `--name`, `--name=value` or among the letters of `-abc`. (A value that looks like an option
// counts too: that only makes an option more.)
bool named(const option_row& row, const std::vector<std::string>& words) {
  for (std::string_view names = row.names; !names.empty();) {
    const auto comma = names.find(',');
    const std::string_view name = names.substr(0, comma);
    names = comma == std::string_view::npos ? std::string_view{} : names.substr(comma + 1);
    for (const auto& w : words) {
      if (name.starts_with("--")
              ? w.starts_with(name) && (w.size() == name.size() || w[name.size()] == '=')
              : w.size() > 1 && w[0] == '-' && w[1] != '-' && w.find(name[1], 1) != std::string::npos)
        return true;
    }
  }
  return false;
}

// Whether `name` is one of `row`'s names ("-q,--quiet" has two).
bool names_row(const option_row& row, std::string_view name) {
  for (std::string_view names = row.names; !names.empty();) {
    const auto comma = names.find(',');
    if (names.substr(0, comma) == name) return true;
    names = comma == std::string_view::npos ? std::string_view{} : names.substr(comma + 1);
  }
  return false;
}

// Whether `word` is exactly a flag that takes its value from the next word.
bool takes_value(const std::string& word) {
  return std::any_of(std::begin(table), std::end(table),
                     [&](const option_row& row) { return row.value && names_row(row, word); });
}

// Whether `word` is one of isorun's flags (with or without "=value").
bool is_option(const std::string& word) {
  if (word.size() < 2 || word[0] != '-') return false;
  const std::string flag = word.substr(0, word.find('='));
  return flag == "-h" || flag == "--help" || flag == "--version" ||
         std::any_of(std::begin(table), std::end(table), [&](const option_row& row) { return names_row(row, flag); });
}

// Puts the command's rows of the table into its CLI11 app: those the command line names. (CLI11
// compares each new option with all those before it: making every option of the table each
// time would cost each run of isorun some hundred microseconds of its fixed cost. The others
// are not needed: a flag CLI11 does not know is left over, and check_leftovers names it.) Each
// occurrence is applied as it is parsed (trigger_on_parse), so repeated flags (--tasks, --grid,
// --retry) add up, the last of the others wins, and errors come in command-line order.
void add_rows(CLI::App& app, unsigned where, cli_options& o, const std::vector<std::string>& words) {
  for (const auto& row : table) {
    if (!(row.scopes & where) || !named(row, words)) continue;
    CLI::Option* opt = nullptr;
    if (row.value)
      opt = app.add_option(row.names,
                           [&o, &row](const CLI::results_t& values) {
                             for (const auto& v : values) apply(row, o, v);
                             return true;
                           })
                ->type_name(row.value)
                ->expected(1);
    else opt = app.add_flag_callback(row.names, [&o, &row] { apply(row, o, ""); });
    opt->trigger_on_parse();
  }
}

// Appends `text` wrapped to help_width, the current line being `at` columns in, later lines
// starting at `indent`.
void append_wrapped(std::string& out, std::string_view text, std::size_t at, std::size_t indent) {
  bool first = true;
  while (!text.empty()) {
    const auto space = text.find(' ');
    const std::string_view word = text.substr(0, space);
    text = space == std::string_view::npos ? std::string_view{} : text.substr(space + 1);
    if (!first && at + 1 + word.size() > help_width) {
      out += "\n" + std::string(indent, ' ');
      at = indent;
    } else if (!first) {
      out += ' ';
      ++at;
    }
    out += word;
    at += word.size();
    first = false;
  }
  out += '\n';
}

std::string rows_help(unsigned where) {
  std::string out;
  for (const auto& row : table) {
    if (!(row.scopes & where) || !row.help) continue;
    std::string left = "  " + std::string(row.names);
    if (const auto comma = left.find(','); comma != std::string::npos) left.insert(comma + 1, " ");
    if (row.value) left += std::string(" ") + row.value;
    if (left.size() < help_column) left.resize(help_column, ' ');
    else left += "\n" + std::string(help_column, ' ');
    out += left;
    append_wrapped(out, row.help, help_column, help_column);
  }
  return out;
}

const char* main_usage = R"(usage: isorun [OPTIONS] TASK [key=value ...]    run a registered task in a fresh worker
       isorun [OPTIONS] -- CMD [ARGS ...]        run any program isolated
       isorun tasks [--tasks LIB.so] [--json]    list registered tasks
       isorun gpus [--json]                      show the GPU inventory
       isorun sweep SPEC.yaml [SWEEP OPTIONS]    run a hyperparameter sweep (isorun sweep --help)
       isorun report OUT [--serve]               (re)write OUT/report.html, or serve it live
       isorun status OUT                         a sweep's progress (also one running on Slurm)

options:
)";

const char* main_footer = R"(
exit codes: 0 success, 1 task raised, 2 bad usage, 3 out of memory, 4 worker crashed,
            5 invalid result, 124 timeout, 125 internal error, 130 interrupted;
            with -- CMD: the command's own status (128+N if killed by signal N)
Ctrl-C (or SIGTERM, SIGHUP, SIGQUIT) stops what runs gracefully: a task's worker gets SIGTERM,
then SIGKILL after --grace; a -- CMD gets the signal itself, as from its terminal; a sweep launches
no new trials and stops the running ones. A second Ctrl-C kills at once.
environment: ISORUN_SIMULATE_GPUS=2x16G simulates a GPU inventory (tests, dry runs);
             ISORUN_CONTAINMENT=process-group contains workers by their process group alone
             (the default is a cgroup v2 per worker where one can be made: see isorun gpus)
)";

const char* sweep_usage = R"(usage: isorun [--tasks LIB.so] sweep SPEC.yaml [FLAGS]
       isorun [--tasks LIB.so] sweep TASK --grid key=v1,v2 [--grid ...] [FLAGS]
       isorun sweep --grid key=v1,v2 [--grid ...] [FLAGS] -- PROGRAM ARGS...

A command (spec `command: [python3, train.py, --lr, "{lr}"]`, or after --) gets each trial's
parameters where its arguments say {name}, runs under the trial's GPU and cap (the cap enforced
on the CUDA driver API, as for isorun -- CMD), and reports its result as the last line of its
stdout that is a JSON object, or as a JSON object written to the file $ISORUN_RESULT names.
isorun's options before `sweep` (--tasks, --grace, --alloc-conf, --timeout, --mem-limit) apply to
every trial; those of a single run (--gpu, --gpus, --cpu, --json, -q, ...) are refused there.

flags (override the spec):
)";

const char* sweep_footer = R"(
Results: OUT/results.jsonl (the journal), OUT/results.csv, OUT/logs/, and OUT/report.html, a page
with charts and the table (isorun report OUT writes it again; memory timelines need alloc_conf
history:N). Re-running the same command resumes: finished trials are skipped. Ctrl-C stops
launching and cancels running trials (a second Ctrl-C kills them at once); the journal stays
consistent.
)";

}  // namespace

std::string help_text(mode of) {
  switch (of) {
    case mode::sweep: return sweep_usage + rows_help(in_sweep) + sweep_footer;
    case mode::list_tasks:
      return "usage: isorun tasks [--tasks LIB.so] [--json]\n\nLists the registered tasks: each one's "
             "signature and its parameters with their\ndefaults (what TASK key=value ... takes).\n\noptions:\n" +
             rows_help(in_tasks);
    case mode::list_gpus:
      return "usage: isorun gpus [--json]\n\nShows the GPU inventory (or the simulated one) and how "
             "workers are contained.\n\noptions:\n" +
             rows_help(in_gpus);
    case mode::report:
      return "usage: isorun report OUT [--serve [--port N] [--bind ADDR]]\n\n(Re)writes OUT/report.html, the page "
             "of a sweep's output folder OUT (the sweep's --out);\nwith --serve, serves it instead, live, until "
             "Ctrl-C.\n\noptions:\n" +
             rows_help(in_report);
    case mode::status:
      return "usage: isorun status OUT\n\nA sweep's progress from its output folder OUT (the sweep's "
             "--out), also one running\nas Slurm job arrays.\n\noptions:\n" +
             rows_help(in_status);
    default: return main_usage + rows_help(in_main) + main_footer;
  }
}

bool wants_json(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") return false;
    if (arg == "--json") return true;
  }
  return false;
}

namespace {

// The CLI11 apps of every command, filled from the table. CLI11's own help flag and error
// handling are off: help and messages come from the table and from check_leftovers, in isorun's
// words, and a flag it does not know is left over (allow_extras) for us to name with a "did you
// mean" instead of CLI11's "The following arguments were not expected".
struct parser {
  cli_options& o;
  std::vector<std::string> given;  // the words before `--`
  CLI::App app{"isorun", "isorun"};
  std::vector<std::string> words;  // TASK key=value ...
  std::vector<std::string> outs;   // OUT of report and status
  CLI::App* sweep = nullptr;
  CLI::App* tasks = nullptr;
  CLI::App* gpus = nullptr;
  CLI::App* report = nullptr;
  CLI::App* status = nullptr;

  parser(cli_options& opts, std::vector<std::string> words_given) : o(opts), given(std::move(words_given)) {
    app.set_help_flag();
    app.allow_extras();  // inherited by the subcommands made below
    app.require_subcommand(0, 1);
    add_rows(app, in_main, o, given);
    app.add_option("TASK", words);
    sweep = subcommand("sweep", in_sweep);
    if (sweep) sweep->add_option("SPEC", o.sweep.target);
    // `isorun tasks --cpu` was always accepted: the main options reach through.
    if ((tasks = subcommand("tasks", in_tasks))) tasks->fallthrough();
    if ((gpus = subcommand("gpus", in_gpus))) gpus->fallthrough();
    if ((report = subcommand("report", in_report))) report->add_option("OUT", outs);
    if ((status = subcommand("status", in_status))) status->add_option("OUT", outs);
  }

  // A subcommand, if the command line has its name (nullptr if not); its options are made only
  // once its name is seen. (As add_rows makes only the options the command line names: for
  // isorun's fixed cost.)
  CLI::App* subcommand(const char* name, unsigned where) {
    if (std::find(given.begin(), given.end(), name) == given.end()) return nullptr;
    CLI::App* sub = app.add_subcommand(name);
    sub->preparse_callback([this, sub, where](std::size_t) { add_rows(*sub, where, o, given); });
    return sub;
  }

  // The subcommand given, as a command; mode::run_task if none.
  mode chosen() const {
    const auto given_here = [](const CLI::App* sub) { return sub && sub->parsed(); };
    if (given_here(sweep)) return mode::sweep;
    if (given_here(tasks)) return mode::list_tasks;
    if (given_here(gpus)) return mode::list_gpus;
    if (given_here(report)) return mode::report;
    if (given_here(status)) return mode::status;
    return mode::run_task;
  }

  // What CLI11 left over in one app: a flag that app does not know, or a word it has no place for.
  static void check_leftovers(const CLI::App& in, unsigned where, const std::string& see, const char* unknown) {
    for (const auto& word : in.remaining()) {
      if (word.size() > 1 && word[0] == '-') {
        const std::string flag = word.substr(0, word.find('='));
        throw usage_error(std::string(unknown) + " '" + word + "'" + did_you_mean(flag, known_names(where)) + "; see " +
                          see);
      }
    }
    if (!in.remaining().empty()) throw usage_error("unexpected argument '" + in.remaining().front() + "'; see " + see);
  }

  void parse() {
    // A flag that takes a value, followed by another flag: CLI11 would take that flag as the
    // value (`--out --fail-fast`: a folder named "--fail-fast", and no fail-fast). Refused as the
    // missing value it is; `--out=--x` still names such a folder.
    for (std::size_t i = 0; i + 1 < given.size(); ++i)
      if (takes_value(given[i]) && is_option(given[i + 1]))
        throw usage_error(given[i] + " needs a value, but '" + given[i + 1] + "' follows it; see isorun --help");
    std::vector<std::string> reversed(given.rbegin(), given.rend());
    // CLI11 takes `--out=` (an empty value) as `--out` alone, which then eats the next word as
    // its value: refused here, for every flag at once.
    for (const auto& word : reversed)
      if (word.size() > 3 && word.starts_with("--") && word.back() == '=')
        throw usage_error(word.substr(0, word.size() - 1) + " needs a value after '='; see isorun --help");
    try {
      app.parse(reversed);
    } catch (const CLI::ArgumentMismatch& e) {
      // The only way to get one here: a flag that takes a value came last. CLI11 names the flag
      // before its first ':' ("--gpu: 1 required N missing").
      const std::string what = e.what();
      throw usage_error(what.substr(0, what.find(':')) + " needs a value; see isorun --help");
    } catch (const CLI::ParseError& e) {
      throw usage_error(std::string(e.what()) + "; see isorun --help");
    }
  }
};

// What goes with what, once every flag is known.
void check_combinations(cli_options& o, int argc) {
  const bool gpus_given = !o.gpus.empty() || o.gpu_count;
  if (o.gpu && gpus_given) throw usage_error("--gpu and --gpus exclude each other: --gpu N is --gpus N");
  if ((o.gpu || gpus_given) && o.cpu)
    throw usage_error(std::string(o.gpu ? "--gpu" : "--gpus") + " and --cpu exclude each other");
  if (const char* env = std::getenv("ISORUN_ALLOC_CONF"); env && o.alloc_conf.empty())
    check_alloc_conf("ISORUN_ALLOC_CONF", env);
  if (!o.memory_timeline.empty() && o.what != mode::run_task && o.what != mode::run_command)
    throw usage_error(
        "--memory-timeline goes with a TASK or a -- CMD (a sweep keeps timelines when its alloc_conf "
        "has history:N)");
  if (!o.memory_timeline.empty() && o.what == mode::run_command && (!o.mem_limit || o.mem_limit_advisory))
    throw usage_error(
        "--memory-timeline with -- CMD draws what the cap sees: give the command an enforced "
        "--mem-limit (and a GPU)");
  if (o.what == mode::sweep) {
    // Options of a single run, which a sweep would not use: said, not ignored.
    const char* of_a_run = o.gpu                                      ? "--gpu"
                           : !o.gpus.empty() || o.gpu_count           ? "--gpus"
                           : o.cpu                                    ? "--cpu"
                           : o.json                                   ? "--json"
                           : o.quiet                                  ? "--quiet"
                           : o.mem_limit_advisory                     ? "--mem-limit-mode"
                           : o.max_result != cli_options{}.max_result ? "--max-result"
                                                                      : nullptr;
    if (of_a_run)
      throw usage_error(
          std::string(of_a_run) +
          " before 'sweep' is an option of a single run, which a sweep does not "
          "use; give a sweep's flags after 'sweep' (isorun sweep SPEC --gpus 0,1); see isorun sweep --help");
  }
  if (o.serve.addressed && !o.serve.on) throw usage_error("--port and --bind go with --serve");
  if (o.serve.on && o.sweep.detach)
    throw usage_error(
        "--serve with --detach: the command returns at once; serve the report with isorun report OUT --serve");
  if (o.what == mode::run_task && o.task.empty()) {
    if (argc <= 1) o.what = mode::nothing;
    else throw usage_error("no task given; usage: isorun [OPTIONS] TASK [key=value ...] (isorun tasks lists them)");
  }
}

// The subcommand's own words: OUT of report and status, the command after `--`.
void check_subcommand(cli_options& o, const std::vector<std::string>& outs, bool dashes) {
  const std::string name = o.what == mode::report ? "report" : o.what == mode::status ? "status" : "";
  if (!name.empty()) {
    if (outs.size() != 1 || dashes)
      throw usage_error("isorun " + name + " OUT: give one sweep output folder (the sweep's --out)");
    o.out = outs.front();
  }
  if (o.what == mode::sweep && dashes && o.command.empty())
    throw usage_error("'--' must be followed by the command to sweep");
  if (o.what == mode::run_task && dashes) {
    if (o.command.empty()) throw usage_error("'--' must be followed by a command to run");
    if (!o.task.empty())
      throw usage_error("give a TASK or -- CMD, not both ('" + o.task + "' and '" + o.command[0] + "')");
    o.what = mode::run_command;
  } else if (dashes && o.what != mode::sweep && !o.command.empty()) {
    throw usage_error("'--' cannot be combined with a subcommand");
  }
}

}  // namespace

cli_options parse_command_line(int argc, char** argv) {
  cli_options o;
  o.argv.assign(argv, argv + argc);
  // Everything after the first `--` is a program's command line, never isorun's: it is set
  // aside before CLI11 sees the rest (CLI11 would take it as positionals, mixed with TASK's).
  const auto dashes = std::find(o.argv.begin() + 1, o.argv.end(), "--");
  o.command.assign(dashes == o.argv.end() ? dashes : dashes + 1, o.argv.end());
  parser p(o, std::vector<std::string>(o.argv.begin() + 1, dashes));
  p.parse();
  const mode sub = p.chosen();
  if (o.what == mode::help) {  // asked for, it wins over what else is wrong
    o.help_of = sub;
    return o;
  }
  parser::check_leftovers(p.app, in_main, "isorun --help", "unknown option");
  if (sub == mode::sweep) parser::check_leftovers(*p.sweep, in_sweep, "isorun sweep --help", "unknown sweep flag");
  if (sub == mode::report) parser::check_leftovers(*p.report, in_report, "isorun report --help", "unknown option");
  if (sub == mode::status) parser::check_leftovers(*p.status, in_status, "isorun status --help", "unknown option");
  if (o.what == mode::version) return o;
  if (sub != mode::run_task && !p.words.empty())
    throw usage_error("unexpected argument '" + p.words.front() + "'; see isorun --help");
  if (!p.words.empty()) {
    o.task = p.words.front();
    o.params.assign(p.words.begin() + 1, p.words.end());
  }
  o.what = sub;
  check_subcommand(o, p.outs, dashes != o.argv.end());
  check_combinations(o, argc);
  return o;
}

}  // namespace isorun::cli
