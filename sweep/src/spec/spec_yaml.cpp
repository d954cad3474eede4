// Sweep specs in YAML: only the CLI (and tests) link this, so workers never load yaml-cpp.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "isorun/runner/suggest.hpp"
#include "isorun/runner/task_arguments.hpp"
#include "isorun/runner/units.hpp"
#include "isorun/sweep/slurm.hpp"
#include "isorun/sweep/spec.hpp"
#include "isorun/sweep/stop_rule.hpp"

namespace isorun::sweep {
namespace {
using nlohmann::json;

int line_of(const YAML::Node& n) { return n.Mark().line >= 0 ? n.Mark().line + 1 : 0; }

[[noreturn]] void fail(const YAML::Node& n, const std::string& what) {
  throw spec_error("line " + std::to_string(line_of(n)) + ": " + what, line_of(n));
}

// Refuses `key`, none of `keys`, as `what` ("search: unknown key"): with the closest known one,
// and every key the section takes, in the order given.
[[noreturn]] void unknown_key(const YAML::Node& key, const std::string& what, const std::vector<std::string>& keys) {
  std::string listed;
  for (const auto& k : keys) listed += (listed.empty() ? "" : ", ") + k;
  fail(key, what + " '" + key.Scalar() + "'" + did_you_mean(key.Scalar(), keys) + "; known: " + listed);
}

// Refuses a key of mapping `m` that is none of `keys` (unknown_key).
void check_keys(const YAML::Node& m, const std::string& what, const std::vector<std::string>& keys) {
  for (const auto& kv : m)
    if (std::find(keys.begin(), keys.end(), kv.first.Scalar()) == keys.end()) unknown_key(kv.first, what, keys);
}

// A YAML scalar as JSON: integer, number, bool or string, in that order.
json scalar(const YAML::Node& n) {
  const std::string s = n.Scalar();
  if (n.Tag() == "!") return s;  // quoted: a string
  try {
    std::size_t pos = 0;
    long long i = std::stoll(s, &pos);
    if (pos == s.size()) return i;
  } catch (...) {
  }
  try {
    std::size_t pos = 0;
    double d = std::stod(s, &pos);
    if (pos == s.size()) return d;
  } catch (...) {
  }
  if (s == "true" || s == "True") return true;
  if (s == "false" || s == "False") return false;
  return s;
}

json to_json(const YAML::Node& n) {
  if (n.IsScalar()) return scalar(n);
  if (n.IsSequence()) {
    json a = json::array();
    for (const auto& x : n) a.push_back(to_json(x));
    return a;
  }
  if (n.IsMap()) {
    json o = json::object();
    for (const auto& kv : n) o[kv.first.Scalar()] = to_json(kv.second);
    return o;
  }
  return nullptr;
}

double number(const YAML::Node& n, const std::string& what) {
  json v = n.IsScalar() ? scalar(n) : json();
  if (!v.is_number()) fail(n, what + " must be a number");
  return v.get<double>();
}

std::pair<double, double> bounds(const YAML::Node& n, const std::string& what) {
  if (!n.IsSequence() || n.size() != 2) fail(n, what + " takes [low, high]");
  double lo = number(n[0], what), hi = number(n[1], what);
  if (!(lo < hi)) fail(n, what + ": low must be below high");
  return {lo, hi};
}

// The values of one grid parameter: a list, {values: [...]}, {range: [a, b], num: n, scale},
// {range: [a, b], step: s}, or a constant.
std::vector<json> grid_values(const std::string& name, const YAML::Node& v) {
  if (v.IsSequence()) {
    if (v.size() == 0) fail(v, "parameter '" + name + "' has an empty list");
    std::vector<json> out;
    for (const auto& x : v) out.push_back(to_json(x));
    return out;
  }
  if (v.IsMap()) {
    for (const auto& kv : v) {
      const std::string k = kv.first.Scalar();
      if (k != "values" && k != "range" && k != "num" && k != "scale" && k != "step")
        fail(kv.first, "parameter '" + name + "': unknown key '" + k + "' (expected values, range, num, scale, step)");
    }
    if (v["values"]) return grid_values(name, v["values"]);
    if (!v["range"]) fail(v, "parameter '" + name + "' needs a list, values: or range:");
    auto [lo, hi] = bounds(v["range"], "parameter '" + name + "' range");
    const bool integral = scalar(v["range"][0]).is_number_integer() && scalar(v["range"][1]).is_number_integer();
    std::vector<json> out;
    if (v["step"]) {
      double step = number(v["step"], "step");
      if (step <= 0) fail(v["step"], "parameter '" + name + "': step must be positive");
      for (double x = lo; x <= hi + 1e-9 * std::abs(hi); x += step)
        out.push_back(integral && std::floor(step) == step ? json(static_cast<long long>(x)) : json(x));
      return out;
    }
    if (!v["num"]) fail(v, "parameter '" + name + "': range needs num: or step:");
    double n = number(v["num"], "num");
    if (n < 2 || n != std::floor(n) || n > 10000)
      fail(v["num"], "parameter '" + name + "': num must be a whole number from 2");
    const std::string scale = v["scale"] ? v["scale"].Scalar() : "linear";
    if (scale != "linear" && scale != "log") fail(v["scale"], "parameter '" + name + "': scale is linear or log");
    if (scale == "log" && lo <= 0) fail(v["range"], "parameter '" + name + "': a log range needs positive bounds");
    for (int i = 0; i < static_cast<int>(n); ++i) {
      const double t = i / (n - 1);
      const double x = scale == "log" ? std::exp(std::log(lo) + t * (std::log(hi) - std::log(lo))) : lo + t * (hi - lo);
      char buf[32];  // 12 significant digits: 0.3, not 0.30000000000000004, in ids and tables
      std::snprintf(buf, sizeof buf, "%.12g", x);
      out.push_back(std::stod(buf));
    }
    return out;
  }
  return {to_json(v)};
}

void cartesian(std::vector<json>& trials, const std::vector<std::pair<std::string, std::vector<json>>>& dims) {
  for (const auto& [name, values] : dims) {
    std::vector<json> next;
    for (const auto& t : trials)
      for (const auto& v : values) {
        json u = t;
        u[name] = v;
        next.push_back(std::move(u));
      }
    trials = std::move(next);
  }
}

sweep_spec parse_yaml(const std::string& text);

// Everything in a spec ends up as JSON (trial ids, arguments, the journal): UTF-8 only, and no
// control characters (a NUL makes yaml-cpp take the text for UTF-16 or UTF-32). The error names
// the line and byte of the first offence.
void check_plain_text(const std::string& text) {
  auto fail_at = [&](std::size_t at, const std::string& what) {
    const int line = static_cast<int>(1 + std::count(text.begin(), text.begin() + static_cast<long>(at), '\n'));
    throw spec_error("line " + std::to_string(line) + ", byte " + std::to_string(at + 1) + ": " + what, line);
  };
  if (const auto at = runner::arguments::utf8_error_at(text); at != std::string_view::npos)
    fail_at(at, "not valid UTF-8 text; save the spec as UTF-8");
  const auto control = std::find_if(text.begin(), text.end(), [](char ch) {
    const auto c = static_cast<unsigned char>(ch);
    return (c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7f;
  });
  if (control != text.end())
    fail_at(static_cast<std::size_t>(control - text.begin()),
            "control character " + std::to_string(static_cast<int>(*control)) + "; a spec is plain text");
}

}  // namespace

sweep_spec parse_spec(const std::string& text, const std::string& source) {
  try {
    check_plain_text(text);
    sweep_spec s = parse_yaml(text);
    s.source = source;
    // Whatever the YAML escapes made of the values, each trial must be text JSON can carry.
    for (const auto& t : s.trials) {
      try {
        (void)t.dump();
      } catch (const nlohmann::json::exception&) {
        throw spec_error("a parameter value is not valid UTF-8 text", 0);
      }
    }
    return s;
  } catch (const spec_error& e) {
    throw spec_error(source + ": " + e.what(), e.line());  // the file is named once, here
  } catch (const YAML::Exception& e) {
    // A shape the checks above did not foresee (a list where a mapping belongs, say): still the
    // spec's fault, and yaml-cpp knows where.
    const int line = e.mark.is_null() ? 0 : e.mark.line + 1;
    throw spec_error(source + ": " + (line ? "line " + std::to_string(line) + ": " : std::string()) +
                         "unexpected structure: " + e.msg,
                     line);
  }
}

namespace {

// task:, command: or python:
// A command's words: a list of plain values (`not_plain` for one that is not), or one line split
// at spaces (no shell quoting: the list is for that).
std::vector<std::string> command_words(const YAML::Node& c, const std::string& not_plain) {
  std::vector<std::string> words;
  if (c.IsScalar()) {
    std::istringstream line(c.Scalar());
    for (std::string w; line >> w;) words.push_back(w);
    return words;
  }
  for (const auto& w : c) {
    if (!w.IsScalar()) fail(w, not_plain);
    words.push_back(w.Scalar());
  }
  return words;
}

void parse_subject(const YAML::Node& root, sweep_spec& s) {
  if ((root["task"] ? 1 : 0) + (root["command"] ? 1 : 0) + (root["python"] ? 1 : 0) > 1)
    fail(root["python"] ? root["python"] : root["command"], "give one of task:, command: or python:, not several");
  if (auto py = root["python"]) {
    s.python_line = line_of(py);
    const std::string target = py.IsScalar() ? py.Scalar() : "";
    const auto colon = target.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == target.size())
      fail(py, "python: names a function as module:function or path/to/file.py:function, e.g. trials:train");
    s.python = target;
  } else if (auto c = root["command"]) {
    s.command_line = line_of(c);
    if (!c.IsScalar() && !c.IsSequence())
      fail(c, "command: is a list of words, e.g. [python3, train.py, --lr, \"{lr}\"]");
    s.command = command_words(c, "command: each word is a plain value, e.g. [python3, train.py, --lr, \"{lr}\"]");
    if (s.command.empty()) fail(c, "command: is empty; it needs at least the program to run");
  } else {
    if (!root["task"] || !root["task"].IsScalar())
      fail(root,
           "the spec needs task: NAME (a registered task), command: [PROGRAM, ARGS...] or python: "
           "module:function");
    s.task = root["task"].Scalar();
  }
}

// metric: a name, or {name:, goal:}
void parse_metric(const YAML::Node& m, sweep_spec& s) {
  s.metric.line = line_of(m);
  if (m.IsScalar()) {
    s.metric.name = m.Scalar();
  } else {
    if (!m.IsMap()) fail(m, "metric: is a name, or {name: ..., goal: maximize|minimize}");
    if (!m["name"]) fail(m, "metric needs name:");
    s.metric.name = m["name"].Scalar();
    if (auto g = m["goal"]) {
      if (g.Scalar() != "maximize" && g.Scalar() != "minimize") fail(g, "metric goal is maximize or minimize");
      s.metric.maximize = g.Scalar() == "maximize";
    }
  }
}

// scheduler: NAME, or {type: NAME, SETTING: VALUE, ...} with a rule's settings (stop_rule.hpp).
void parse_pbt(const YAML::Node& n, sweep_spec& s, int& population);

void parse_scheduler(const YAML::Node& n, sweep_spec& s, int& pbt_population) {
  const int line = line_of(n);
  if (!n.IsScalar() && (!n.IsMap() || !n["type"] || !n["type"].IsScalar()))
    fail(n,
         "scheduler: is {type: asha, max_t: 81, grace_period: 1, reduction_factor: 3} or {type: median, "
         "grace_period: 5, min_samples: 3} (rules: " +
             stop_rule_names() + ")");
  const YAML::Node type_node = n.IsScalar() ? n : n["type"];
  const std::string& type = type_node.Scalar();
  if (type == "none") {
    s.early_stopping = {};
    return;
  }
  if (type == "pbt") {
    parse_pbt(n, s, pbt_population);
    return;
  }
  const stop_rule_kind* kind = find_stop_rule(type);
  if (!kind) fail(type_node, "scheduler: " + early_stopping_problem({.type = type}));
  early_stopping_spec e = default_early_stopping(*kind);
  e.line = line;
  if (n.IsMap()) {
    std::vector<std::string> known = {"type"};
    for (const auto& setting : kind->settings) known.emplace_back(setting.name);
    for (const auto& kv : n) {
      const std::string k = kv.first.Scalar();
      if (k == "type") continue;
      if (std::find(known.begin(), known.end(), k) == known.end()) {
        std::string listed;
        for (const auto& name : known) listed += (listed.empty() ? "" : ", ") + name;
        // NOLINTBEGIN(performance-inefficient-string-concatenation): a message, made once, then thrown
        fail(kv.first,
             "unknown scheduler setting '" + k + "'" + did_you_mean(k, known) + " for " + type + "; known: " + listed);
        // NOLINTEND(performance-inefficient-string-concatenation)
      }
      const double x = number(kv.second, k);
      if (x != std::floor(x) || x < 0 || x > 1e12) fail(kv.second, k + " must be a whole number of steps, 0 or more");
      if (const std::string why = set_early_stopping(e, k, static_cast<std::int64_t>(x)); !why.empty())
        fail(kv.second, "scheduler: " + why);
    }
  }
  if (const std::string why = early_stopping_problem(e); !why.empty()) fail(n, "scheduler: " + why);
  s.early_stopping = std::move(e);
}

// Parameter names, each given once, and the line where each is.
struct param_names {
  sweep_spec& s;
  std::set<std::string> names;
  void claim(const YAML::Node& at, const std::string& name) {
    if (!names.insert(name).second) fail(at, "parameter '" + name + "' is given twice");
    s.param_lines[name] = line_of(at);
  }
};

// zip: each group's lists advance together, crossed with `trials`.
void zip_trials(const YAML::Node& z, param_names& names, std::vector<json>& trials) {
  if (!z.IsSequence()) fail(z, "zip: is a list of groups, each {name: [values], ...}");
  for (const auto& group : z) {
    if (!group.IsMap() || group.size() == 0) fail(group, "a zip group maps names to equally long lists");
    std::size_t len = 0;
    std::vector<std::pair<std::string, std::vector<json>>> cols;
    for (const auto& kv : group) {
      names.claim(kv.first, kv.first.Scalar());
      if (!kv.second.IsSequence() || kv.second.size() == 0)
        fail(kv.second, "zip parameter '" + kv.first.Scalar() + "' needs a non-empty list");
      if (len && kv.second.size() != len)
        fail(kv.second, "zip parameter '" + kv.first.Scalar() + "' has " + std::to_string(kv.second.size()) +
                            " values, others in its group have " + std::to_string(len));
      len = kv.second.size();
      cols.emplace_back(kv.first.Scalar(), grid_values(kv.first.Scalar(), kv.second));
    }
    std::vector<json> next;
    for (const auto& t : trials)
      for (std::size_t i = 0; i < len; ++i) {
        json u = t;
        for (const auto& [name, values] : cols) u[name] = values[i];
        next.push_back(std::move(u));
      }
    trials = std::move(next);
  }
}

// random: `count` draws, each crossed with `trials`.
void random_trials(const YAML::Node& r, param_names& names, std::vector<json>& trials) {
  if (!r.IsMap()) fail(r, "random: is a mapping: {count: N, seed: S, params: {...}}");
  if (!r["count"] || !r["params"] || !r["params"].IsMap()) fail(r, "random: needs count: and params:");
  const double count = number(r["count"], "random count");
  if (count < 1 || count != std::floor(count) || count > 100000)
    fail(r["count"], "random count must be a whole number from 1");
  const std::uint64_t seed = r["seed"] ? static_cast<std::uint64_t>(number(r["seed"], "random seed")) : 0;
  std::vector<std::pair<std::string, YAML::Node>> draws;
  for (const auto& kv : r["params"]) {
    names.claim(kv.first, kv.first.Scalar());
    const auto& d = kv.second;
    if (!d.IsMap() || !(d["uniform"] || d["loguniform"] || d["choice"]))
      fail(d,
           "random parameter '" + kv.first.Scalar() + "' needs uniform: [a, b], loguniform: [a, b] or choice: [...]");
    if (d["uniform"]) bounds(d["uniform"], "uniform");
    if (d["loguniform"] && bounds(d["loguniform"], "loguniform").first <= 0)
      fail(d, "loguniform needs positive bounds");
    if (d["choice"] && (!d["choice"].IsSequence() || d["choice"].size() == 0)) fail(d, "choice needs a non-empty list");
    draws.emplace_back(kv.first.Scalar(), d);
  }
  std::vector<json> next;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  for (int i = 0; i < static_cast<int>(count); ++i) {
    json drawn = json::object();
    for (const auto& [name, d] : draws) {
      if (d["uniform"]) {
        auto [lo, hi] = bounds(d["uniform"], "uniform");
        drawn[name] = lo + u01(rng) * (hi - lo);
      } else if (d["loguniform"]) {
        auto [lo, hi] = bounds(d["loguniform"], "loguniform");
        drawn[name] = std::exp(std::log(lo) + u01(rng) * (std::log(hi) - std::log(lo)));
      } else {
        drawn[name] = to_json(d["choice"][static_cast<std::size_t>(rng() % d["choice"].size())]);
      }
    }
    for (const auto& t : trials) {
      json u = t;
      u.update(drawn);
      next.push_back(std::move(u));
    }
  }
  trials = std::move(next);
}

// One of Slurm's settings (partition, account, time, extra, gpus_per_node, trials_per_task,
// max_running) into `sl`.
void parse_slurm_setting(const std::string& k, const YAML::Node& v, slurm_spec& sl) {
  // Checked as parsed, not as written: a YAML escape ("\n") is a newline only now.
  auto setting = [&](const YAML::Node& n) {
    if (!n.IsScalar()) fail(n, k + " is text");
    if (const std::string why = slurm::setting_problem(k, n.Scalar()); !why.empty()) fail(n, why);
    return n.Scalar();
  };
  if (k == "partition") sl.partition = setting(v);
  else if (k == "account") sl.account = setting(v);
  else if (k == "time") sl.time = setting(v);
  else if (k == "extra") {
    if (!v.IsSequence()) fail(v, "extra is a list of sbatch options, e.g. [\"--qos=long\"]");
    for (const auto& e : v) sl.extra.push_back(setting(e));
  } else {
    const double n = number(v, k);
    if (n < (k == "max_running" || k == "gpus_per_node" ? 0 : 1) || n != static_cast<int>(n))
      fail(v, k + " must be a whole number" + (k == "trials_per_task" ? ", at least 1" : ", 0 or more"));
    (k == "gpus_per_node"     ? sl.gpus_per_node
     : k == "trials_per_task" ? sl.trials_per_task
                              : sl.max_running) = static_cast<int>(n);
  }
}

// resources: preload: [numpy, torch]
void parse_preload(const YAML::Node& v, sweep_spec& s) {
  if (!v.IsSequence()) fail(v, "preload is a list of modules, e.g. [numpy, torch]");
  for (const auto& m : v) {
    if (!m.IsScalar() || m.Scalar().empty() || m.Scalar().find_first_of(", \t\n") != std::string::npos)
      fail(m, "preload: each entry is one module's name, e.g. numpy");
    s.preload.push_back(m.Scalar());
  }
}

// resources: backend: local or slurm
void parse_backend(const YAML::Node& v, sweep_spec& s) {
  if (!v.IsScalar() || !select_backend(s, v.Scalar())) fail(v, "backend is " + backend_choices());
}

// resources: gpus_per_trial: a whole number, or "{name}" to take it from a parameter.
void parse_gpus_per_trial(const YAML::Node& v, sweep_spec& s) {
  s.gpus_per_trial_line = line_of(v);
  const std::string text = v.IsScalar() ? v.Scalar() : "";
  if (text.size() > 2 && text.front() == '{' && text.back() == '}') {
    s.gpus_per_trial_param = text.substr(1, text.size() - 2);  // checked against the trials by sweep_run
  } else {
    const double n = number(v, "gpus_per_trial");
    s.gpus_per_trial = static_cast<int>(n);
    if (s.gpus_per_trial < 1 || s.gpus_per_trial != n)
      fail(v, "gpus_per_trial must be a whole number, at least 1, or \"{name}\" to take it from parameter name");
  }
}

bool is_slurm_setting(const std::string& k) {
  return k == "partition" || k == "account" || k == "time" || k == "gpus_per_node" || k == "trials_per_task" ||
         k == "max_running" || k == "extra";
}

[[noreturn]] void unknown_resource(const YAML::Node& key, const std::string& k) {
  const std::vector<std::string> known = {
      "gpus",         "mem_limit",      "host_mem_limit",  "per_gpu",     "cpu_slots", "alloc_conf", "standby",
      "warm_context", "gpus_per_trial", "preload",         "start",       "backend",   "partition",  "account",
      "time",         "gpus_per_node",  "trials_per_task", "max_running", "extra"};
  fail(key,
       "unknown resource '" + k + "'" + did_you_mean(k, known) +
           "; known: gpus, mem_limit, host_mem_limit, per_gpu, cpu_slots, alloc_conf, standby, warm_context, "
           "gpus_per_trial, preload, start, backend, and for backend: slurm partition, account, time, gpus_per_node, "
           "trials_per_task, max_running, extra");
}

// One of resources: but Slurm's settings.
void parse_resource(const YAML::Node& key, const std::string& k, const YAML::Node& v, sweep_spec& s) {
  if (k == "gpus") {
    if (v.IsScalar() && v.Scalar() == "all") s.all_gpus = true;
    else if (v.IsSequence())
      for (const auto& g : v) s.gpus.push_back(static_cast<int>(number(g, "gpus entry")));
    else fail(v, "gpus is a list of indices or all");
  } else if (k == "mem_limit") {
    s.mem_limit = parse_size(v.Scalar());
    if (!s.mem_limit) fail(v, "mem_limit must be greater than zero (leave it out for no cap)");
  } else if (k == "host_mem_limit") {
    s.host_mem_limit = parse_size(v.Scalar());
    if (!s.host_mem_limit) fail(v, "host_mem_limit must be greater than zero");
  } else if (k == "per_gpu") {
    s.per_gpu = static_cast<int>(number(v, "per_gpu"));
    if (s.per_gpu < 1) fail(v, "per_gpu must be at least 1");
  } else if (k == "cpu_slots") {
    s.cpu_slots = static_cast<int>(number(v, "cpu_slots"));
    if (s.cpu_slots < 1) fail(v, "cpu_slots must be at least 1");
  } else if (k == "alloc_conf") {
    s.alloc_conf = v.Scalar();
  } else if (k == "standby") {
    s.standby = static_cast<int>(number(v, "standby"));
    if (s.standby < 0) fail(v, "standby must be 0 (none) or more workers per slot");
  } else if (k == "preload") {
    parse_preload(v, s);
  } else if (k == "start") {
    if (v.Scalar() != "exec" && v.Scalar() != "zygote")
      fail(v,
           "start is exec (each trial's interpreter exec'd: the default) or zygote (forked from one that "
           "imported the preloads)");
    s.zygote = v.Scalar() == "zygote";
  } else if (k == "warm_context") {
    if (v.Scalar() != "true" && v.Scalar() != "false") fail(v, "warm_context is true or false");
    s.warm_context = v.Scalar() == "true";
  } else if (k == "backend") {
    parse_backend(v, s);
  } else if (k == "gpus_per_trial") {
    parse_gpus_per_trial(v, s);
  } else {
    unknown_resource(key, k);
  }
}

// resources:
void parse_resources(const YAML::Node& root, sweep_spec& s) {
  slurm_spec slurm_settings;
  int slurm_setting_line = 0;
  if (auto res = root["resources"]) {
    if (!res.IsMap()) fail(res, "resources: is a mapping (gpus:, mem_limit:, per_gpu:, ...)");
    for (const auto& kv : res) {
      const std::string k = kv.first.Scalar();
      const auto& v = kv.second;
      try {
        if (is_slurm_setting(k)) {
          // Slurm's settings; they mean something only with backend: slurm (checked below).
          parse_slurm_setting(k, v, slurm_settings);
          slurm_setting_line = slurm_setting_line ? slurm_setting_line : line_of(kv.first);
        } else {
          parse_resource(kv.first, k, v, s);
        }
      } catch (const parse_error& e) {
        fail(v, std::string(e.what()));
      }
    }
  }
  if (s.slurm) {
    *s.slurm = slurm_settings;
  } else if (slurm_setting_line) {
    throw spec_error(
        "line " + std::to_string(slurm_setting_line) +
            ": partition, account, time, gpus_per_node, trials_per_task, max_running and extra are Slurm's; "
            "add backend: slurm to resources",
        slurm_setting_line);
  }
}

// A distribution of `search: params:`: {float: [lo, hi], log: true, step: 0.1}, {int: [lo, hi],
// log, step}, {categorical: [a, b]}; as {"type", "low", "high", "log", "step"} or {"type",
// "choices"}.
json parse_distribution(const std::string& name, const YAML::Node& n) {
  const std::string where = "search parameter '" + name + "'";
  const std::string forms =
      "{float: [1e-4, 0.1], log: true}, {int: [16, 256], step: 16} or {categorical: [relu, gelu]}";
  if (!n.IsMap()) fail(n, where + " is a distribution: " + forms);
  json d;
  for (const auto& kv : n) {
    const std::string k = kv.first.Scalar();
    if (k == "float" || k == "int") {
      if (d.contains("type")) fail(kv.first, where + " has two kinds; give one of float, int, categorical");
      std::string what = where;
      what.append(" ").append(k);
      const auto [lo, hi] = bounds(kv.second, what);
      if (k == "int" && (lo != std::floor(lo) || hi != std::floor(hi)))
        fail(kv.second, where + ": int bounds are whole numbers, e.g. {int: [16, 256]}");
      d["type"] = k;
      d["low"] = k == "int" ? json(static_cast<std::int64_t>(lo)) : json(lo);
      d["high"] = k == "int" ? json(static_cast<std::int64_t>(hi)) : json(hi);
    } else if (k == "categorical") {
      if (d.contains("type")) fail(kv.first, where + " has two kinds; give one of float, int, categorical");
      if (!kv.second.IsSequence() || kv.second.size() == 0)
        fail(kv.second, where + ": categorical takes a non-empty list of choices, e.g. [relu, gelu]");
      d["type"] = "categorical";
      d["choices"] = json::array();
      for (const auto& c : kv.second) {
        if (!c.IsScalar()) fail(c, where + ": each choice is a plain value (a number, a string, true, false)");
        d["choices"].push_back(scalar(c));
      }
    } else if (k == "log") {
      const json v = kv.second.IsScalar() ? scalar(kv.second) : json();
      if (!v.is_boolean()) fail(kv.second, where + ": log is true or false");
      d["log"] = v;
    } else if (k == "step") {
      d["step"] = number(kv.second, where + " step");
      if (!(d["step"].get<double>() > 0)) fail(kv.second, where + ": step must be above 0");
    } else {
      // NOLINTBEGIN(performance-inefficient-string-concatenation): a message, made once, then thrown
      fail(kv.first, where + ": unknown key '" + k + "'" +
                         did_you_mean(k, {"float", "int", "categorical", "log", "step"}) + "; a distribution is " +
                         forms);
      // NOLINTEND(performance-inefficient-string-concatenation)
    }
  }
  if (!d.contains("type")) fail(n, where + " needs its kind: " + forms);
  if (d["type"] == "categorical") {
    if (d.contains("log") || d.contains("step")) fail(n, where + ": log and step are for float and int");
    return d;
  }
  const double lo = d["low"].get<double>();
  if (d.value("log", false) && !(lo > 0))
    fail(n, where + ": a log distribution's low bound must be above 0 (it is " + d["low"].dump() + ")");
  if (d.value("log", false) && d.contains("step")) fail(n, where + ": give log or step, not both");
  if (d["type"] == "int" && d.contains("step")) {
    const double step = d["step"].get<double>();
    if (step != std::floor(step)) fail(n, where + ": an int's step is a whole number");
    d["step"] = static_cast<std::int64_t>(step);
  }
  return d;
}

// search: {type: optuna, sampler: tpe, seed: 0, trials: 100, params: {...}} or {type: command,
// command: [...], trials: 100}. What it needs of the rest of the spec (the metric) is checked in
// parse_yaml.
// search: type optuna's settings: the sampler (one of Optuna's, or the Python API's pickled one)
// and the seed.
void parse_optuna_settings(const YAML::Node& v, search_spec& r) {
  if (v["command"]) fail(v["command"], "search command is for type: command");
  if (auto n = v["sampler"]) {
    static const std::vector<std::string> samplers = {"tpe", "cmaes", "gp", "nsgaii", "random", "qmc"};
    const std::string name = n.IsScalar() ? n.Scalar() : "";
    // ("pickled:CLASS": the Python API's, a sampler object handed over in $ISORUN_SEARCH_SAMPLER;
    // its class is named so that the folder's fingerprint tells one sampler from another.)
    const bool pickled = name.rfind("pickled:", 0) == 0 && name.size() > 8 &&
                         name.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.",
                                                8) == std::string::npos;
    if (std::find(samplers.begin(), samplers.end(), name) == samplers.end() && !pickled)
      fail(n, "search sampler '" + name + "' is not one of Optuna's isorun runs" + did_you_mean(name, samplers) +
                  "; known: tpe, cmaes, gp, nsgaii, random, qmc");
    r.sampler = name;
  }
  if (auto n = v["seed"]) {
    const double seed = number(n, "search seed");
    if (seed < 0 || seed > 4294967295.0 || seed != std::floor(seed))
      fail(n, "search seed is a whole number from 0 to 2^32-1");
    r.seed = static_cast<std::int64_t>(seed);
  }
}

// search: params: each parameter's distribution, or (a searcher of one's own) the names it chooses.
void parse_search_params(const YAML::Node& v, search_spec& r, const std::string& example) {
  if (auto p = v["params"]) {
    if (p.IsSequence() && p.size() > 0 && r.type == "command") {  // the names a searcher of one's own chooses
      for (const auto& name : p) {
        if (!name.IsScalar()) fail(name, "search params: each name is a plain word");
        r.params[name.Scalar()] = nullptr;
      }
    } else if (!p.IsMap() || p.size() == 0) {
      fail(p, "search params is a mapping of parameter names to distributions" +
                  std::string(r.type == "command" ? " (or a list of the names the searcher chooses)" : "") + ", " +
                  example);
    } else {
      for (const auto& kv : p) r.params[kv.first.Scalar()] = parse_distribution(kv.first.Scalar(), kv.second);
    }
  } else {
    fail(v, r.type == "optuna" ? "search type optuna needs params: (each parameter's distribution), " + example
                               : "search needs params: (the names of the parameters the searcher chooses, e.g. "
                                 "[lr, layers]), so that the trials' program can be checked before anything starts");
  }
}

void parse_search(const YAML::Node& v, sweep_spec& s) {
  search_spec r;
  r.line = line_of(v);
  const std::string example =
      "e.g. {type: optuna, sampler: tpe, seed: 0, trials: 100, params: {lr: {float: [1e-4, 0.1], log: true}}}";
  if (!v.IsMap()) fail(v, "search is a mapping, " + example);
  check_keys(v, "search: unknown key",
             {"type", "sampler", "seed", "trials", "params", "objectives", "command", "timeout"});
  const YAML::Node type = v["type"];
  if (!type || !type.IsScalar() || (type.Scalar() != "optuna" && type.Scalar() != "command"))
    fail(type ? type : v,
         "search type is optuna (Optuna's samplers) or command (a searcher program of your own), " + example);
  r.type = type.Scalar();
  if (auto n = v["trials"]) {
    const double t = number(n, "search trials");
    if (t < 1 || t > 1e6 || t != std::floor(t))
      fail(n, "search trials must be a whole number from 1 to 1000000 (the budget)");
    r.trials = static_cast<int>(t);
  } else {
    fail(v,
         "search needs trials: (the most trials it may ask for; a searcher may end sooner by saying done), " + example);
  }
  if (auto n = v["timeout"]) {
    try {
      r.timeout = parse_duration(n.IsScalar() ? n.Scalar() : "");
    } catch (const std::exception& e) {
      fail(n, std::string("search timeout is not a duration: ") + e.what() + "; e.g. 60s");
    }
  }
  if (r.type == "command") {
    const YAML::Node c = v["command"];
    if (!c || (!c.IsSequence() && !c.IsScalar())) fail(v, "search type command needs command: [PROGRAM, ARGS...]");
    r.command = command_words(c, "search command: each word is a plain value");
    if (r.command.empty()) fail(c, "search command is empty; it needs at least the program to run");
    for (const char* optuna_only : {"sampler", "seed"})
      if (v[optuna_only]) fail(v[optuna_only], std::string("search ") + optuna_only + " is for type: optuna");
  } else {
    parse_optuna_settings(v, r);
  }
  parse_search_params(v, r, example);
  if (auto o = v["objectives"]) {
    if (!o.IsSequence() || o.size() == 0)
      fail(o, "search objectives is a list, e.g. [{name: accuracy, goal: maximize}, {name: latency, goal: minimize}]");
    for (const auto& m : o) {
      sweep_spec one;
      parse_metric(m, one);
      r.objectives.push_back(one.metric);
    }
  }
  s.search = std::move(r);
}

// A trial of the search's parameters for the checks made before a sweep starts (each at its
// low bound or first choice), with the spec's own `params:` (constants, added to every trial).
json search_sample(const search_spec& r, const json& constants) {
  json t = constants;
  for (const auto& [name, d] : r.params.items())
    t[name] = d.is_null() ? json(0) : d["type"] == "categorical" ? d["choices"][0] : d["low"];
  return t;
}

// scheduler: {type: pbt, interval: 5, quantile: 0.25, resample_probability: 0.25, seed: 0,
// population: N, mutations: {lr: perturb, dropout: {uniform: [0, 0.5]}}}. What it needs of the rest
// of the spec (checkpoints, a metric, the population) is checked by check_pbt.
void parse_pbt(const YAML::Node& n, sweep_spec& s, int& population) {
  pbt_spec p;
  p.line = line_of(n);
  const std::string example =
      "e.g. {type: pbt, interval: 5, quantile: 0.25, mutations: {lr: perturb, dropout: {uniform: [0, 0.5]}}}";
  if (!n.IsMap()) fail(n, "scheduler pbt takes its settings, " + example);
  check_keys(n, "pbt: unknown scheduler setting",
             {"type", "interval", "quantile", "resample_probability", "seed", "population", "mutations"});
  const YAML::Node interval = n["interval"];
  if (!interval) fail(n, "scheduler pbt needs interval: (the steps between its decisions), " + example);
  const double steps = number(interval, "pbt interval");
  if (steps < 1 || steps != std::floor(steps) || steps > 1e12)
    fail(interval, "pbt interval must be a whole number of steps, 1 or more");
  p.interval = static_cast<std::int64_t>(steps);
  if (auto q = n["quantile"]) {
    p.quantile = number(q, "pbt quantile");
    if (!(p.quantile > 0 && p.quantile <= 0.5)) fail(q, "pbt quantile must be above 0 and at most 0.5, e.g. 0.25");
  }
  if (auto r = n["resample_probability"]) {
    p.resample_probability = number(r, "pbt resample_probability");
    if (!(p.resample_probability >= 0 && p.resample_probability <= 1))
      fail(r, "pbt resample_probability must be from 0 to 1");
  }
  if (auto seed = n["seed"]) {
    const double x = number(seed, "pbt seed");
    if (x < 0 || x != std::floor(x) || x > 1e15) fail(seed, "pbt seed is a whole number, 0 or more");
    p.seed = static_cast<std::uint64_t>(x);
  }
  if (auto pop = n["population"]) {
    const double x = number(pop, "pbt population");
    if (x < 2 || x != std::floor(x) || x > 100000) fail(pop, "pbt population must be a whole number, 2 or more");
    population = static_cast<int>(x);
  }
  const YAML::Node m = n["mutations"];
  if (!m || !m.IsMap() || m.size() == 0)
    fail(m ? m : n, "scheduler pbt needs mutations: (which parameters change, and how), " + example);
  for (const auto& kv : m) {
    const std::string name = kv.first.Scalar();
    const YAML::Node& how = kv.second;
    if (how.IsScalar() && how.Scalar() == "perturb") {
      p.mutations[name] = "perturb";
      continue;
    }
    if (!how.IsMap() || how.size() != 1)
      fail(how, "pbt mutation of '" + name +
                    "' is perturb (x 0.8 or x 1.2), {uniform: [a, b]}, {loguniform: [a, b]} "
                    "or {choice: [...]}");
    const std::string kind = how.begin()->first.Scalar();
    if (kind == "uniform" || kind == "loguniform") {
      const auto [lo, hi] = bounds(how.begin()->second, "pbt mutation of '" + name + "'");
      if (kind == "loguniform" && !(lo > 0))
        fail(how, "pbt mutation of '" + name + "': loguniform needs a low above 0");
      p.mutations[name] = {{kind, {lo, hi}}};
    } else if (kind == "choice") {
      if (!how.begin()->second.IsSequence() || how.begin()->second.size() == 0)
        fail(how, "pbt mutation of '" + name + "': choice takes a non-empty list");
      p.mutations[name] = {{"choice", to_json(how.begin()->second)}};
    } else {
      // NOLINTBEGIN(performance-inefficient-string-concatenation): a message, made once, then thrown
      fail(how.begin()->first, "pbt mutation of '" + name + "': unknown kind '" + kind + "'" +
                                   did_you_mean(kind, {"uniform", "loguniform", "choice"}) +
                                   "; perturb, {uniform: [a, b]}, {loguniform: [a, b]} or {choice: [...]}");
      // NOLINTEND(performance-inefficient-string-concatenation)
    }
  }
  s.pbt = std::move(p);
}

// track: {mlflow: {uri: ..., experiment: ...}, mine: {command: [python3, sink.py], ...}}: each
// tracker by name, its settings the rest of its mapping.
void parse_track(const YAML::Node& v, sweep_spec& s) {
  if (!v.IsMap()) fail(v, "track is a mapping of trackers by name, e.g. {mlflow: {uri: sqlite:///mlflow.db}}");
  for (const auto& kv : v) {
    track_spec t;
    t.name = kv.first.Scalar();
    t.line = line_of(kv.first);
    if (!tracker_name_ok(t.name))
      fail(kv.first, "track: a tracker's name is letters, digits, _ and - (it names its folder OUT/track/NAME)");
    const YAML::Node& body = kv.second;
    if (!body.IsNull() && !body.IsMap())
      fail(body, "track: " + t.name + " is a mapping of its settings, e.g. {uri: sqlite:///mlflow.db}, or empty");
    for (const auto& setting : body) {
      const std::string key = setting.first.Scalar();
      if (key != "command") {
        t.settings[key] = to_json(setting.second);
        continue;
      }
      if (!setting.second.IsSequence() || setting.second.size() == 0)
        fail(setting.second, "track: " + t.name + ": command is a list of words, e.g. [python3, my_tracker.py]");
      for (const auto& w : setting.second) {
        if (!w.IsScalar()) fail(w, "track: " + t.name + ": each word of command is a string");
        t.command.push_back(w.Scalar());
      }
    }
    if (t.command.empty() && !builtin_tracker(t.name))
      fail(kv.first, "track: " + t.name + " is not a tracker isorun has (" + builtin_tracker_names() +
                         "); a tracker of your own gives its command: [...]");
    s.track.push_back(std::move(t));
  }
}

// checkpoints: true, or {keep: 2, signal: SIGUSR1}.
void parse_checkpoints(const YAML::Node& v, sweep_spec& s) {
  checkpoint_spec c;
  c.on = true;
  c.line = v.Mark().line + 1;
  if (v.IsScalar()) {
    const json on = scalar(v);
    if (!on.is_boolean()) fail(v, "checkpoints is true, false or a mapping, e.g. {keep: 2, signal: SIGUSR1}");
    c.on = on.get<bool>();
    s.checkpoints = c;
    return;
  }
  if (!v.IsMap()) fail(v, "checkpoints is true, false or a mapping, e.g. {keep: 2, signal: SIGUSR1}");
  for (const auto& kv : v) {
    const std::string k = kv.first.Scalar();
    if (k == "keep") {
      const double n = number(kv.second, "checkpoints keep");
      if (n < 1 || n > 1000 || n != std::floor(n))
        fail(kv.second,
             "checkpoints keep must be a whole number from 1 to 1000 (the latest checkpoints kept per "
             "trial; a later attempt resumes from the latest), e.g. 2");
      c.keep = static_cast<int>(n);
    } else if (k == "signal") {
      static const std::map<std::string, int> names = {
          {"SIGUSR1", SIGUSR1}, {"SIGUSR2", SIGUSR2}, {"SIGINT", SIGINT},     {"SIGTERM", SIGTERM},
          {"SIGHUP", SIGHUP},   {"SIGALRM", SIGALRM}, {"SIGWINCH", SIGWINCH}, {"SIGURG", SIGURG}};
      std::string name = kv.second.IsScalar() ? kv.second.Scalar() : "";
      if (!name.empty() && name.rfind("SIG", 0) != 0) name.insert(0, "SIG");
      const auto it = names.find(name);
      if (it == names.end())
        fail(kv.second, "checkpoints signal '" + (kv.second.IsScalar() ? kv.second.Scalar() : std::string("?")) +
                            "' is not one isorun sends as a warning; use SIGUSR1 (the default), SIGUSR2, SIGINT, "
                            "SIGTERM, SIGHUP, SIGALRM, SIGWINCH or SIGURG");
      c.signal = it->second;
    } else if (k == "warn_before") {
      std::chrono::milliseconds lead{0};
      try {
        lead = parse_duration(kv.second.IsScalar() ? kv.second.Scalar() : std::string());
      } catch (const std::exception& e) {
        fail(kv.second, std::string("checkpoints warn_before is not a duration: ") + e.what() + "; e.g. 2m");
      }
      if (lead < std::chrono::seconds(1))
        fail(kv.second,
             "checkpoints warn_before must be at least 1s (how long before a Slurm time limit the trials "
             "are warned), e.g. 2m");
      c.warn_before = std::chrono::duration_cast<std::chrono::seconds>(lead);
    } else {
      unknown_key(kv.first, "checkpoints: unknown key", {"keep", "signal", "warn_before"});
    }
  }
  s.checkpoints = c;
}

// policy: oom_retry: {factor: 2, max: 16G}. What it needs of the rest of the spec (a cap, a max
// above it) is checked by sweep_run, once flags may have changed the cap.
void parse_oom_retry(const YAML::Node& v, sweep_spec& s) {
  if (!v.IsMap()) fail(v, "oom_retry is a mapping, e.g. {factor: 2, max: 16G}");
  oom_retry_spec r;
  r.line = line_of(v);
  for (const auto& kv : v) {
    const std::string k = kv.first.Scalar();
    if (k == "factor") {
      r.factor = number(kv.second, "oom_retry factor");
      if (!(r.factor >= oom_retry_spec::min_factor) || !std::isfinite(r.factor))
        fail(kv.second,
             "oom_retry factor must be a number of at least 1.1 (each retry gets a cap at least 10% larger), e.g. 2");
    } else if (k == "max_attempts") {
      const double n = number(kv.second, "oom_retry max_attempts");
      if (!(n >= 2 && n <= 1000) || n != std::floor(n))
        fail(kv.second,
             "oom_retry max_attempts must be a whole number from 2 to 1000 (the attempts at growing caps, "
             "the first included), e.g. 8");
      r.max_attempts = static_cast<int>(n);
    } else if (k == "max") {
      try {
        r.max = parse_size(kv.second.Scalar());
      } catch (const parse_error& e) {
        fail(kv.second, "oom_retry max is not a size: " + std::string(e.what()));
      }
      if (r.max == 0) fail(kv.second, "oom_retry max must be above 0, e.g. 16G");
    } else {
      unknown_key(kv.first, "oom_retry: unknown key", {"factor", "max", "max_attempts"});
    }
  }
  if (!r.factor) fail(v, "oom_retry needs factor: (a number of at least 1.1), e.g. {factor: 2, max: 16G}");
  if (!r.max) fail(v, "oom_retry needs max: (the largest cap), e.g. {factor: 2, max: 16G}");
  s.oom_retry = r;
}

// policy:
void parse_policy(const YAML::Node& pol, sweep_spec& s) {
  if (!pol.IsMap()) fail(pol, "policy: is a mapping (timeout:, retries:, fail_fast:, oom_retry:)");
  for (const auto& kv : pol) {
    const std::string k = kv.first.Scalar();
    const auto& v = kv.second;
    if (k == "timeout") {
      try {
        s.timeout = parse_duration(v.Scalar());
      } catch (const parse_error& e) {
        fail(v, e.what());
      }
    } else if (k == "fail_fast") {
      s.fail_fast = v.Scalar() == "true";
    } else if (k == "retries") {
      if (!v.IsMap()) fail(v, "retries maps outcome classes to counts, e.g. {crashed: 2, timeout: 1}");
      for (const auto& r : v) {
        const std::string cls = r.first.Scalar();
        if (cls == "out_of_memory")
          fail(r.first,
               "out_of_memory is never retried at the same cap (it would fail again); oom_retry: {factor: 2, max: 16G} "
               "retries it at larger caps");
        if (cls != "crashed" && cls != "timeout" && cls != "invalid_result" && cls != "task_error")
          fail(r.first, "retries: unknown outcome class '" + cls + "' (crashed, timeout, invalid_result, task_error)");
        const double n = number(r.second, "retries");
        if (n < 0 || n > 100 || n != std::floor(n)) fail(r.second, "retries must be a whole number 0..100");
        s.retries[cls] = static_cast<int>(n);
      }
    } else if (k == "oom_retry") {
      parse_oom_retry(v, s);
    } else {
      unknown_key(kv.first, "unknown policy", {"timeout", "retries", "fail_fast", "oom_retry"});
    }
  }
}

// search: with the spec's params, which are then constants every trial has: the searcher chooses
// the rest, and the spec's one trial is a sample of what it may choose.
void apply_search(const YAML::Node& root, const YAML::Node& se, sweep_spec& s, std::vector<json>& trials) {
  // The searcher chooses the trials; the spec's params are constants every trial has.
  parse_search(se, s);
  if (trials.size() != 1 || root["zip"] || root["random"])
    fail(root["params"] && trials.size() != 1 ? root["params"] : se,
         "with search:, params: are constants every trial gets (one value each) and zip:/random: have no place; "
         "the searcher chooses the rest (search: params:)");
  for (const auto& [name, d] : s.search.params.items())
    if (trials.front().contains(name))
      fail(se["params"], "parameter '" + name + "' is both a constant in params: and chosen by search:; keep one");
  const YAML::Node chosen = se["params"];  // (each name's line, as for params:)
  for (const auto& entry : chosen) {
    const YAML::Node name = chosen.IsMap() ? entry.first : YAML::Node(entry);
    s.param_lines[name.Scalar()] = line_of(name);
  }
  if (s.search.objectives.empty()) {
    if (s.metric.name.empty())
      fail(se, "search needs metric: (what it optimizes, e.g. {name: loss, goal: minimize}), or search objectives:");
    s.search.objectives = {s.metric};
  } else if (s.metric.name.empty()) {
    s.metric = s.search.objectives.front();  // ranked by the first
  }
  s.search_constants = trials.front();
  trials = {search_sample(s.search, trials.front())};
}

// scheduler pbt against the rest of the spec: the first population is the spec's trials, and
// children start from checkpoints of a metric's best.
void check_pbt(const YAML::Node& root, const sweep_spec& s, int pbt_population) {
  const YAML::Node at = root["scheduler"];
  if (!s.checkpoints)
    fail(at,
         "scheduler pbt starts each new trial from a top trial's checkpoint: add checkpoints: {keep: 2}, and "
         "save them in the trials (docs/sweeps.md#checkpoints)");
  if (s.metric.name.empty())
    fail(at, "scheduler pbt ranks trials by a metric: add metric: {name: loss, goal: minimize}");
  if (s.search) fail(at, "scheduler pbt makes its own trials; it does not go with search:");
  if (pbt_population && static_cast<std::size_t>(pbt_population) != s.trials.size())
    fail(at["population"], "pbt population " + std::to_string(pbt_population) + ", but params: expand to " +
                               std::to_string(s.trials.size()) +
                               " trials; the first population is the spec's trials (random: {count: N} draws N)");
  if (s.trials.size() < 2) fail(at, "scheduler pbt needs a population of 2 or more trials; params: expand to 1");
  for (const auto& [name, how] : s.pbt.mutations.items())
    if (!s.trials.front().contains(name))
      fail(at["mutations"], "pbt mutation of '" + name + "', which is none of the trials' parameters");
}

sweep_spec parse_yaml(const std::string& text) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw spec_error("line " + std::to_string(e.mark.line + 1) + ": malformed YAML: " + e.msg, e.mark.line + 1);
  }
  if (!root.IsMap()) throw spec_error("a sweep spec is a YAML mapping (task:, params:, ...)", 1);
  sweep_spec s;
  check_keys(root, "unknown key",
             {"task", "command", "python", "metric", "scheduler", "params", "zip", "random", "search", "resources",
              "policy", "checkpoints", "track", "out"});
  parse_subject(root, s);
  if (auto m = root["metric"]) parse_metric(m, s);
  int pbt_population = 0;
  if (auto sch = root["scheduler"]) parse_scheduler(sch, s, pbt_population);

  param_names names{s, {}};
  std::vector<std::pair<std::string, std::vector<json>>> dims;
  if (auto p = root["params"]) {
    if (!p.IsMap()) fail(p, "params: is a mapping of parameter names");
    for (const auto& kv : p) {
      names.claim(kv.first, kv.first.Scalar());
      dims.emplace_back(kv.first.Scalar(), grid_values(kv.first.Scalar(), kv.second));
    }
  }
  std::vector<json> trials{json::object()};
  cartesian(trials, dims);
  if (auto z = root["zip"]) zip_trials(z, names, trials);
  if (auto r = root["random"]) random_trials(r, names, trials);
  if (auto se = root["search"]) apply_search(root, se, s, trials);
  s.trials = std::move(trials);
  parse_resources(root, s);
  if (!s.preload.empty() && s.python.empty())
    fail(root["resources"]["preload"], "preload names modules for Python interpreters; it goes with python: only");
  if (s.zygote && s.python.empty())
    fail(root["resources"]["start"], "start: zygote forks Python interpreters; it goes with python: only");
  if (auto pol = root["policy"]) parse_policy(pol, s);
  if (auto c = root["checkpoints"]) parse_checkpoints(c, s);
  if (auto t = root["track"]) parse_track(t, s);
  if (s.slurm && s.checkpoints) {
    s.slurm->warning_signal = s.checkpoints.signal;
    s.slurm->warning_lead = s.checkpoints.warn_before;
  }
  if (auto o = root["out"]) s.out = o.Scalar();
  if (s.pbt) check_pbt(root, s, pbt_population);
  if (s.trials.empty()) fail(root, "the spec expands to no trials");
  return s;
}
}  // namespace

sweep_spec spec_from_grid(const std::string& task, const grid_flags& grid) {
  std::string yaml = "task: \"" + task + "\"\nparams:\n";
  for (const auto& [name, values] : grid) {
    if (values.empty()) throw spec_error("--grid " + name + "= has no values", 0);
    yaml += "  \"" + name + "\": [";
    for (std::size_t i = 0; i < values.size(); ++i) yaml += (i ? ", " : "") + values[i];
    yaml += "]\n";
  }
  try {
    sweep_spec s = parse_yaml(yaml);
    s.source = "--grid";
    s.param_lines.clear();  // lines of the YAML made up here mean nothing to the user
    return s;
  } catch (const spec_error& e) {
    throw spec_error(std::string("--grid: ") + e.what(), 0);
  }
}

sweep_spec spec_from_grid(const std::vector<std::string>& command, const grid_flags& grid) {
  if (command.empty()) throw spec_error("'--' must be followed by the command to sweep", 0);
  sweep_spec s = spec_from_grid(std::string("command"), grid);
  s.task.clear();
  s.command = command;
  return s;
}

// How a spec names each backend: its name, what it is, how a spec selects it and tells that it
// has. A new backend is a row here beside its section's keys; the CLI's --backend reads this.
struct backend_choice {
  std::string_view name, about;
  void (*select)(sweep_spec&);
  bool (*chosen)(const sweep_spec&);
};
constexpr backend_choice backend_table[] = {
    {"local", "this machine; the default", [](sweep_spec& s) { s.slurm.reset(); },
     [](const sweep_spec& s) { return !s.slurm; }},
    {"slurm", "job arrays through sbatch; the spec's resources give partition, time, gpus_per_node, ...",
     [](sweep_spec& s) {
       if (!s.slurm) s.slurm.emplace();
     },
     [](const sweep_spec& s) { return s.slurm.has_value(); }},
};

// The trackers isorun has: python3 -m isorun.track.NAME (python/isorun/track/).
constexpr std::string_view builtin_tracker_table[] = {"mlflow", "tensorboard"};

bool tracker_name_ok(std::string_view name) {
  return !name.empty() && name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") ==
                              std::string_view::npos;
}

bool builtin_tracker(std::string_view name) {
  return std::find(std::begin(builtin_tracker_table), std::end(builtin_tracker_table), name) !=
         std::end(builtin_tracker_table);
}

const std::string& builtin_tracker_names() {
  static const std::string text = [] {
    std::string t;
    for (std::string_view n : builtin_tracker_table) t += (t.empty() ? "" : ", ") + std::string(n);
    return t;
  }();
  return text;
}

bool select_backend(sweep_spec& s, std::string_view name) {
  for (const auto& b : backend_table)
    if (b.name == name) {
      b.select(s);
      return true;
    }
  return false;
}

std::string_view backend_name(const sweep_spec& s) {
  for (const auto& b : backend_table)
    if (b.chosen(s)) return b.name;
  return backend_table[0].name;
}

const std::string& backend_choices() {
  static const std::string text = [] {
    std::string t;
    for (const auto& b : backend_table) {
      if (!t.empty()) t += &b == std::end(backend_table) - 1 ? " or " : ", ";
      t += std::string(b.name) + " (" + std::string(b.about) + ")";
    }
    return t;
  }();
  return text;
}

}  // namespace isorun::sweep
