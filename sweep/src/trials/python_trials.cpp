#include "trials/python_trials.hpp"
#include "trials/trial_program.hpp"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iterator>

#include "isorun/runner/driver_cap.hpp"
#include "isorun/runner/errors.hpp"
#include "isorun/runner/process.hpp"
#include "isorun/runner/worker_env.hpp"
#include "isorun/serialization/protocol.hpp"

namespace isorun::sweep::python_trials {

namespace {
namespace fs = std::filesystem;

// "module:function" -> "module"; "dir/file.py:function" -> "dir/file.py".
std::string where(const std::string& target) { return target.substr(0, target.rfind(':')); }

// A file's path rather than a module's name: what the user would type to run it.
bool is_file(const std::string& where) {
  return where.find('/') != std::string::npos || (where.size() > 3 && where.ends_with(".py"));
}

// Exit codes of the check below, beyond 0.
constexpr int no_isorun = 3, no_module = 4, import_failed = 5, refused = 6;

// What the check below writes before the JSON of a refusal, on a line of its own in its stdout
// (after anything the module printed, before anything it prints at exit). Given to it as its
// second argument.
constexpr std::string_view refusal_mark = "\x1eisorun-check-refused ";

// Run by the interpreter with the target, refusal_mark and the spec's parameter names
// (trial_program.hpp): can it serve trials, does it find the function (by importing its module or
// loading its file, as a trial does), and does the function take those parameters
// (isorun._trial.check)? A refusal is {"message", "parameter": the spec's at fault, or null}.
constexpr const char* check_script = R"(import json, os, sys
target, mark, names = sys.argv[1], sys.argv[2], sys.argv[3:]  # (a trial's import sets sys.argv)
try:
    import isorun._core, isorun._payload
    from isorun._trial import check, ImportFailed, Refused
except Exception as e:
    print(f"{type(e).__name__}: {e}", file=sys.stderr)
    sys.exit(3)
try:
    check(target, [os.getcwd()], names)
except ImportFailed as e:
    print(e, file=sys.stderr)
    sys.exit(5)
except Refused as e:
    sys.stdout.flush()
    said = json.dumps({"message": str(e), "parameter": e.parameter})
    os.write(1, f"\n{mark}{said}\n".encode())
    sys.exit(6)
except BaseException as e:
    print(f"{type(e).__name__}: {e}", file=sys.stderr)
    sys.exit(4)
)";

// The check's refusal: where in the spec (its parameter's line, else python:'s) and what.
spec_error refusal(const sweep_spec& s, const std::string& out) {
  nlohmann::json said;
  if (const auto at = out.rfind(refusal_mark); at != std::string::npos) {
    const std::size_t from = at + refusal_mark.size(), end = out.find('\n', from);
    said = nlohmann::json::parse(out.substr(from, end == std::string::npos ? end : end - from), nullptr, false);
  }
  if (!said.is_object() || !said.contains("message") || !said["message"].is_string())
    return located(s, s.python_line, "python: " + s.python + " is refused by the check of its parameters");
  const auto parameter = said.find("parameter");
  const auto line = parameter != said.end() && parameter->is_string()
                        ? s.param_lines.find(parameter->get<std::string>())
                        : s.param_lines.end();
  return located(s, line == s.param_lines.end() ? s.python_line : line->second,
                 "python: " + said["message"].get<std::string>());
}

// The last `n` lines of `text` (what a module printed before it failed: argparse's usage and error).
std::string last_lines(std::string text, std::size_t n) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  std::size_t from = text.size();
  for (std::size_t i = 0; i < n; ++i) {
    const auto nl = from == 0 ? std::string::npos : text.rfind('\n', from - 1);
    if (nl == std::string::npos) return text;
    from = nl;
  }
  return text.substr(from + 1);
}

}  // namespace

std::string last_line(std::string text) { return last_lines(std::move(text), 1); }

std::string interpreter() {
  const char* chosen = std::getenv("ISORUN_PYTHON");
  const std::string name = chosen && *chosen ? chosen : "python3";
  const auto exe = runner::find_executable(name);
  if (!exe)
    throw usage_error("python: the interpreter '" + name + "' is not found" +
                      (chosen && *chosen ? " (ISORUN_PYTHON)" : " in PATH") +
                      "; set ISORUN_PYTHON to a Python that has the isorun package");
  return *exe;
}

void check(const sweep_spec& s) {
  const std::string python = [&] {
    try {
      return interpreter();
    } catch (const usage_error& e) {
      throw located(s, s.python_line, e.what());
    }
  }();
  const std::string module = where(s.python);
  if (is_file(module)) {
    std::error_code ec;
    if (!fs::is_regular_file(module, ec))
      throw located(s, s.python_line,
                    "python: " + module +
                        " is not a file (a path is taken from the folder isorun "
                        "runs in, " +
                        fs::current_path(ec).string() + ")");
  }
  std::vector<std::string> env = runner::inherited_environment();
  env.push_back(std::string(trial_env) + "=1");
  std::vector<std::string> args = {"-c", check_script,
                                   request(s, nlohmann::json::object())["function"].get<std::string>(),
                                   std::string(refusal_mark)};
  std::ranges::move(parameter_names(s), std::back_inserter(args));
  const runner::program_output r = runner::run_to_end(python, std::move(args), std::move(env));
  if (r.code == no_isorun)
    throw located(s, s.python_line,
                  "python: " + python + " cannot import the isorun package (" + last_line(r.err) +
                      "); install it there (pip install . in isorun's repository), or set "
                      "ISORUN_PYTHON to a Python that has it");
  if (r.code == import_failed)
    throw located(s, s.python_line,
                  "python: " + s.python + " fails to import in a trial:\n" + last_lines(r.err, 6) +
                      "\n(a trial imports its module as a script run with no arguments, sys.argv "
                      "being [its file]: parse the command line under if __name__ == \"__main__\":)");
  if (r.code == no_module)
    throw located(s, s.python_line,
                  "python: " + s.python + " is not found by " + python +
                      (r.err.empty() ? "" : " (" + last_line(r.err) + ")") +
                      "; modules are found from the folder isorun runs in and PYTHONPATH, or name "
                      "a file: path/to/file.py:function");
  if (r.code == refused) throw refusal(s, r.out);
  if (r.code != 0)
    throw located(s, s.python_line,
                  "python: " + python + " did not run (exit " + std::to_string(r.code) + "): " + last_line(r.err));
}

nlohmann::json request(const sweep_spec& s, const nlohmann::json& params) {
  std::string target = s.python;
  std::error_code ec;
  if (const std::string module = where(target); is_file(module))
    target = fs::absolute(module, ec).lexically_normal().string() + target.substr(module.size());
  return {{"function", target}, {"path", {fs::current_path(ec).string()}}, {"kwargs", params}};
}

void launch(const sweep_spec& s, runner::job_spec& spec) {
  spec.executable = interpreter();
  spec.worker_argv = {"-m", "isorun._worker"};
  spec.extra_env.push_back(std::string(trial_env) + "=1");
  spec.task_libraries.clear();  // C++ task libraries mean nothing to this worker
  std::vector<std::string> preload = s.preload;
  // An interpreter launched ahead (standby) imports the trial's own module too, as it waits: the
  // trial then pays no import. Not a zygote: what the module does at import (a device check, a
  // thread pool) would be done once there, without CUDA and with one thread, for every trial.
  if (s.standby > 0 && !s.zygote) {
    const std::string target = request(s, nlohmann::json::object())["function"].get<std::string>();
    if (where(target).find(',') == std::string::npos) preload.push_back(target);  // (',' separates the list)
  }
  if (!preload.empty()) {
    std::string list;
    for (const auto& m : preload) list += (list.empty() ? "" : ",") + where(m);
    spec.extra_env.push_back("ISORUN_PY_PRELOAD=" + list);
  }
  if (s.mem_limit && !spec.gpus.empty()) {
    // The driver-API cap for what the function allocates on the device (PyTorch, JAX, CuPy):
    // the library at launch, the call's region with the request (local_backend).
    std::string preload = runner::driver_cap::library();
    if (const char* other = std::getenv("LD_PRELOAD"); other && *other) preload += std::string(":") + other;
    spec.extra_env.push_back("LD_PRELOAD=" + preload);
    spec.extra_env.push_back(std::string(serialization::env::cap_deferred) + "=" + std::to_string(s.mem_limit));
  }
}

}  // namespace isorun::sweep::python_trials

namespace isorun::sweep {
namespace {

class python_trials_program final : public trial_program {
 public:
  using trial_program::trial_program;

  std::string subject() const override { return "python:" + s_.python; }
  std::string short_name() const override { return s_.python.substr(s_.python.rfind(':') + 1); }

  void check() const override { python_trials::check(s_); }
  std::string request(const nlohmann::json& params) const override { return python_trials::request(s_, params).dump(); }

  std::string worker_task() const override { return python_trials::task_name; }
  void launch(runner::job_spec& spec) const override { python_trials::launch(s_, spec); }

  // A Python trial's framework allocates through the driver: the call's region rides with its
  // request (a standby interpreter was launched before it).
  std::unique_ptr<runner::driver_cap> bring_cap(runner::job_spec& spec) const override {
    if (!spec.mem_limit || spec.gpus.empty()) return nullptr;
    auto cap = std::make_unique<runner::driver_cap>(spec.mem_limit);
    add_variables(spec, cap->variables());
    return cap;
  }

  bool carry_variables(runner::job_spec& spec, const std::vector<std::string>& variables) const override {
    add_variables(spec, variables);
    return true;
  }

 private:
  // Into the request's "variables", which the interpreter sets before the function runs.
  static void add_variables(runner::job_spec& spec, const std::vector<std::string>& variables) {
    nlohmann::json request = nlohmann::json::parse(reinterpret_cast<const char*>(spec.args.data()),
                                                   reinterpret_cast<const char*>(spec.args.data()) + spec.args.size());
    for (const auto& v : variables) request["variables"][v.substr(0, v.find('='))] = v.substr(v.find('=') + 1);
    const std::string text = request.dump();
    spec.args = blob(text.data(), text.size());
  }
};

}  // namespace

std::unique_ptr<trial_program> python_program(const sweep_spec& s) {
  return std::make_unique<python_trials_program>(s);
}

}  // namespace isorun::sweep
