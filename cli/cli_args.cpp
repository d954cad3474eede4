#include "cli_args.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <string_view>

#include "isorun/alloc/config.hpp"
#include "isorun/runner/errors.hpp"
#include "isorun/runner/units.hpp"
#include "isorun/runner/suggest.hpp"

namespace isorun::cli {

const char* usage_text() {
  return R"(usage: isorun [OPTIONS] TASK [key=value ...]    run a registered task in a fresh worker
       isorun [OPTIONS] -- CMD [ARGS ...]        run any program isolated
       isorun tasks [--tasks LIB.so] [--json]    list registered tasks
       isorun gpus [--json]                      show the GPU inventory
       isorun sweep SPEC.yaml [SWEEP OPTIONS]    run a hyperparameter sweep (isorun sweep --help)
       isorun report OUT                         (re)write OUT/report.html for a sweep's folder
       isorun status OUT                         a sweep's progress (also one running on Slurm)

options:
  --gpu N            run on GPU N (default: GPU 0 if there is one, else CPU)
  --gpus LIST        run on these GPUs (0,1), or on any N with room for the cap (any:N); the
                     worker sees exactly them, in PCI bus order, as CUDA devices 0, 1, ...
  --cpu              run with no GPU visible
  --mem-limit SIZE   hard cap on the worker's device memory, on each of its GPUs (CUDA
                     context included): 2G, 512M, 1.5GiB, 2GB, bytes. For -- CMD it is enforced on the CUDA driver API for the command and
                     every process it starts, together (allocations past it fail with
                     CUDA_ERROR_OUT_OF_MEMORY; cuMemGetInfo reports the cap); not covered:
                     memory the driver takes for itself, programs linking libcuda statically
  --mem-limit-mode M for -- CMD: enforced (default) or advisory (only exported, as
                     ISORUN_MEM_LIMIT)
  --timeout DUR      stop the worker after DUR: 500ms, 30s, 5m, 1h
  --grace DUR        time between SIGTERM and SIGKILL when stopping (default 5s)
  --tasks LIB.so     load tasks from this library (repeatable; also ISORUN_TASKS=a.so:b.so;
                     libraries in <prefix>/lib/isorun/tasks are always loaded)
  --alloc-conf STR   allocator configuration, as ISORUN_ALLOC_CONF
  --max-result SIZE  reject results larger than SIZE (default 1T)
  --json             print a JSON record (outcome, result, timings) instead of only the result
  --memory-timeline FILE.html
                     draw the task's device memory over time (allocated, reserved, the cap)
                     and, after an out-of-memory failure, what was live then, into FILE.html
                     (turns on the allocator's history: history:100000 unless --alloc-conf
                     sets history:N)
  -q, --quiet        no summary line on stderr
  -h, --help         this text
  --version          the version

exit codes: 0 success, 1 task raised, 2 bad usage, 3 out of memory, 4 worker crashed,
            5 invalid result, 124 timeout, 125 internal error, 130 interrupted;
            with -- CMD: the command's own status (128+N if killed by signal N)
environment: ISORUN_SIMULATE_GPUS=2x16G simulates a GPU inventory (tests, dry runs);
             ISORUN_CONTAINMENT=process-group contains workers by their process group alone
             (the default is a cgroup v2 per worker where one can be made: see isorun gpus)
)";
}

namespace {

std::string_view value_of(int& i, int argc, char** argv, std::string_view flag, std::string_view& arg) {
  if (auto eq = arg.find('='); eq != std::string_view::npos) return arg.substr(eq + 1);
  if (i + 1 >= argc) throw usage_error(std::string(flag) + " needs a value; see isorun --help");
  return argv[++i];
}

// A whole number in 0..1024, or -1.
int small_number(std::string_view text) {
  char* end = nullptr;
  std::string s(text);
  long v = std::strtol(s.c_str(), &end, 10);
  return s.empty() || *end || v < 0 || v > 1024 || !std::isdigit(static_cast<unsigned char>(s[0])) ? -1 : static_cast<int>(v);
}

int parse_gpu_index(std::string_view text) {
  const int v = small_number(text);
  if (v < 0)
    throw usage_error("--gpu '" + std::string(text) + "': expected a GPU index such as 0 (see isorun gpus), or use --cpu");
  return v;
}

// --gpus 0,1 (these GPUs) or any:N (any N). A bare number is one GPU's index, as in a list of
// one, so `--gpus 0` means what `--gpu 0` does; a count is always spelled any:N.
void parse_gpus(std::string_view text, cli_options& o) {
  const std::string s(text);
  if (text.substr(0, 4) == "any:") {
    o.gpu_count = small_number(text.substr(4));
    if (o.gpu_count < 1)
      throw usage_error("--gpus '" + s + "': any:N needs a count of 1 or more, e.g. any:2");
    return;
  }
  for (std::size_t at = 0; at <= text.size();) {
    const auto comma = std::min(text.find(',', at), text.size());
    const int v = small_number(text.substr(at, comma - at));
    if (v < 0)
      throw usage_error("--gpus '" + s + "': expected GPU indices such as 0,1 (see isorun gpus), or any:N for any N GPUs");
    o.gpus.push_back(v);
    at = comma + 1;
  }
}

}  // namespace

bool wants_json(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") return false;
    if (arg == "--json") return true;
  }
  return false;
}

cli_options parse_command_line(int argc, char** argv) {
  cli_options o;
  o.what = mode::run_task;
  o.argv.assign(argv, argv + argc);
  int i = 1;
  for (; i < argc; ++i) {
    std::string_view arg = argv[i];
    auto flag = arg.substr(0, arg.find('='));
    auto is = [&](std::string_view name) { return flag == name; };
    try {
      if (arg == "--") {
        for (++i; i < argc; ++i) o.command.emplace_back(argv[i]);
        if (o.command.empty()) throw usage_error("'--' must be followed by a command to run");
        if (o.what != mode::run_task) throw usage_error("'--' cannot be combined with a subcommand");
        o.what = mode::run_command;
        break;
      } else if (arg == "-h" || arg == "--help") {
        o.what = mode::help;
        return o;
      } else if (arg == "--version") {
        o.what = mode::version;
        return o;
      } else if (is("--gpu")) {
        o.gpu = parse_gpu_index(value_of(i, argc, argv, flag, arg));
      } else if (is("--gpus")) {
        parse_gpus(value_of(i, argc, argv, flag, arg), o);
      } else if (arg == "--cpu") {
        o.cpu = true;
      } else if (is("--mem-limit")) {
        o.mem_limit = parse_size(value_of(i, argc, argv, flag, arg));
        if (o.mem_limit == 0) throw usage_error("--mem-limit must be greater than zero");
      } else if (is("--mem-limit-mode")) {
        const std::string m(value_of(i, argc, argv, flag, arg));
        if (m != "enforced" && m != "advisory")
          throw usage_error("--mem-limit-mode " + m + ": expected enforced or advisory");
        o.mem_limit_advisory = m == "advisory";
      } else if (is("--timeout")) {
        o.timeout = parse_duration(value_of(i, argc, argv, flag, arg));
        if (o.timeout.count() <= 0) throw usage_error("--timeout must be greater than zero");
      } else if (is("--grace")) {
        o.grace = parse_duration(value_of(i, argc, argv, flag, arg));
      } else if (is("--tasks")) {
        o.task_libraries.emplace_back(value_of(i, argc, argv, flag, arg));
      } else if (is("--alloc-conf")) {
        o.alloc_conf = value_of(i, argc, argv, flag, arg);
        try {
          alloc::alloc_config::parse(o.alloc_conf);
        } catch (const alloc::config_error& e) {
          throw usage_error(std::string("--alloc-conf: ") + e.what());
        }
      } else if (is("--max-result")) {
        o.max_result = parse_size(value_of(i, argc, argv, flag, arg));
      } else if (arg == "--json") {
        o.json = true;
      } else if (is("--memory-timeline")) {
        o.memory_timeline = value_of(i, argc, argv, flag, arg);
        if (o.memory_timeline.empty()) throw usage_error("--memory-timeline needs a file name, e.g. memory.html");
      } else if (arg == "-q" || arg == "--quiet") {
        o.quiet = true;
      } else if (arg.size() > 1 && arg[0] == '-') {
        static const std::vector<std::string> known = {"--gpu",        "--gpus", "--cpu",  "--mem-limit", "--timeout", "--grace",
                                                       "--tasks",      "--alloc-conf", "--max-result", "--json",
                                                       "--quiet",      "--help",  "--version", "--mem-limit-mode",
                                                       "--memory-timeline"};
        throw usage_error("unknown option '" + std::string(arg) + "'" + did_you_mean(flag, known) +
                          "; see isorun --help");
      } else if (o.what == mode::run_task && o.task.empty() && (arg == "tasks" || arg == "gpus")) {
        o.what = arg == "tasks" ? mode::list_tasks : mode::list_gpus;
      } else if (o.what == mode::run_task && o.task.empty() && (arg == "report" || arg == "status")) {
        o.what = arg == "report" ? mode::report : mode::status;
        for (++i; i < argc; ++i) o.rest.emplace_back(argv[i]);
        if (o.rest.size() != 1 || o.rest[0].starts_with("-"))
          throw usage_error("isorun " + std::string(arg) + " OUT: give one sweep output folder (the sweep's --out)");
        break;
      } else if (o.what == mode::run_task && o.task.empty() && arg == "sweep") {
        o.what = mode::sweep;
        for (++i; i < argc; ++i) o.rest.emplace_back(argv[i]);
        break;
      } else if (o.what == mode::run_task && o.task.empty()) {
        o.task = arg;
      } else if (o.what == mode::run_task) {
        o.params.emplace_back(arg);
      } else {
        throw usage_error("unexpected argument '" + std::string(arg) + "'; see isorun --help");
      }
    } catch (const parse_error& e) {
      throw usage_error(std::string(flag) + ": " + e.what());
    }
  }
  const bool gpus_given = !o.gpus.empty() || o.gpu_count;
  if (o.gpu && gpus_given) throw usage_error("--gpu and --gpus exclude each other: --gpu N is --gpus N");
  if ((o.gpu || gpus_given) && o.cpu) throw usage_error(std::string(o.gpu ? "--gpu" : "--gpus") + " and --cpu exclude each other");
  if (const char* env = std::getenv("ISORUN_ALLOC_CONF"); env && o.alloc_conf.empty()) {
    try {
      alloc::alloc_config::parse(env);
    } catch (const alloc::config_error& e) {
      throw usage_error(std::string("ISORUN_ALLOC_CONF: ") + e.what());
    }
  }
  if (!o.memory_timeline.empty() && o.what != mode::run_task)
    throw usage_error("--memory-timeline goes with a TASK (a sweep keeps timelines when its alloc_conf has history:N)");
  if (o.what == mode::run_task && o.task.empty()) {
    if (argc <= 1) o.what = mode::nothing;
    else throw usage_error("no task given; usage: isorun [OPTIONS] TASK [key=value ...] (isorun tasks lists them)");
  }
  return o;
}

}  // namespace isorun::cli
