// Slurm through its commands: sbatch to submit job arrays, squeue and scontrol to follow them,
// scancel to stop them.
#include "isorun/sweep/slurm.hpp"

#include <fcntl.h>

#include <algorithm>

#include <cctype>
#include <charconv>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "engine/folder.hpp"
#include "isorun/runner/bounded_json.hpp"
#include "isorun/runner/errors.hpp"
#include "isorun/runner/process.hpp"
#include "isorun/runner/worker_env.hpp"
#include "isorun/sweep/journal.hpp"
#include "isorun/sweep/remote_folder.hpp"

namespace isorun::sweep::slurm {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using ran = runner::program_output;

// Runs a Slurm command to its end and captures what it printed.
ran run(const std::string& name, const std::vector<std::string>& args) {
  const auto exe = runner::find_executable(name);
  if (!exe)
    throw usage_error(name +
                      " not found in PATH: the Slurm backend needs Slurm's commands (sbatch, squeue, "
                      "scontrol, scancel) where the sweep is submitted");
  return runner::run_to_end(*exe, args, runner::inherited_environment());
}

// A word for a shell script: single-quoted, as it is.
std::string quoted(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// sbatch's short options, as its getopt_long reads them: Slurm's slurm_opt.c builds this string
// from sbatch's option table (slurm_option_table_create; the same from Slurm 20.11 to 25.x). A
// letter before ':' takes an argument, before "::" an optional one: either way, in a cluster,
// the rest of the argument is its value.
constexpr std::string_view sbatch_short_options = "A:B:C:D:F:G:HJ:L:M:N:OQS:VWa:b:c:d:e:hi:k::m:n:o:p:q:st:vw:x:";

// The sbatch options isorun sets itself for its job arrays (sbatch_arguments), or that would
// undo what it reads back: the array, where its output goes (isorun reads the logs), the script,
// the job id it parses, and whether and how Slurm warns and requeues a task (checkpoints).
struct own_option {
  std::string_view name;
  char letter;               // its short form, or 0
  std::string_view instead;  // what the spec says instead, if anything
};
constexpr std::string_view requeue_instead = " (whether array tasks are requeued follows the spec's checkpoints:)";
constexpr own_option own_options[] = {
    {"--array", 'a', ""},
    {"--output", 'o', ""},
    {"--error", 'e', ""},
    {"--wrap", 0, ""},
    {"--parsable", 0, ""},
    {"--signal", 0, " (the warning before a time limit is the spec's checkpoints: signal and warn_before)"},
    {"--requeue", 0, requeue_instead},
    {"--no-requeue", 0, requeue_instead},
};

}  // namespace

std::string setting_problem(const std::string& key, const std::string& value) {
  for (unsigned char c : value)
    if (c < 0x20 || c == 0x7f)
      return key + " holds " + (c == '\n' ? std::string("a newline") : "control character " + std::to_string(c)) +
             "; Slurm settings are plain text on one line";
  if (key != "extra") {
    if (value.find_first_of(" \t") != std::string::npos)
      return key + " \"" + value + "\" holds a space; Slurm's " + key + " has none";
    return "";
  }
  if (value.size() < 2 || value[0] != '-')
    return "extra entry \"" + value + "\" is not an sbatch option; each entry is one option, e.g. \"--qos=long\"";
  if (value == "--")
    return "extra entry \"--\" is not an sbatch option but the end of them; each entry is one option, e.g. "
           "\"--qos=long\"";
  auto refused = [&](const own_option& own, const std::string& as) {
    return "extra entry \"" + value + "\" sets " + as + ", which isorun sets itself for its job arrays: leave it out" +
           std::string(own.instead);
  };
  if (value[1] == '-') {
    // A long option, named up to its '='. sbatch reads its options with getopt_long, which takes
    // any unambiguous abbreviation of a long one (--outp= is --output=): every prefix of one of
    // isorun's is refused (one that is ambiguous sbatch would refuse anyway).
    const std::string name = value.substr(0, value.find('='));
    for (const own_option& own : own_options) {
      const bool abbreviated = name.size() > 2 && own.name.size() > name.size() && own.name.starts_with(name);
      if (name == own.name || abbreviated)
        return refused(own, std::string(own.name) + (abbreviated ? " (abbreviated)" : ""));
    }
    return "";
  }
  // Short options, which getopt_long reads as a cluster: each letter an option, until one that
  // takes an argument, which is the rest of the entry ("-Qo/x" is -Q, then -o /x).
  std::string before;  // the cluster's options so far, as sbatch reads them
  for (std::size_t i = 1; i < value.size(); ++i) {
    const char c = value[i];
    const std::string letter = std::string("-") + c;
    for (const own_option& own : own_options)
      if (own.letter == c) {
        std::string as = letter + " (" + std::string(own.name);
        if (i > 1) {  // within a cluster: how sbatch reads it
          as.append(", as sbatch reads it: ").append(before).append(letter);
          if (i + 1 < value.size()) as.append(" ").append(value, i + 1);
        }
        return refused(own, as + ")");
      }
    // (A letter sbatch does not know it refuses; read on as if it took no argument.)
    const std::size_t at = c == ':' ? std::string_view::npos : sbatch_short_options.find(c);
    if (at != std::string_view::npos && at + 1 < sbatch_short_options.size() && sbatch_short_options[at + 1] == ':')
      return "";  // the rest is its argument, required or optional
    before += letter + " ";
  }
  return "";
}

std::vector<std::string> sbatch_arguments(const slurm_spec& s, std::size_t array_tasks, const fs::path& logs,
                                          const std::string& job_name) {
  auto check = [](const std::string& key, const std::string& value) {
    if (const std::string why = setting_problem(key, value); !why.empty()) throw usage_error("Slurm setting " + why);
  };
  check("partition", s.partition);
  check("account", s.account);
  check("time", s.time);
  for (const auto& e : s.extra) check("extra", e);
  std::string pattern;
  for (char c : logs.string()) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f || c == '\\')
      throw usage_error("the output folder " + logs.parent_path().parent_path().string() +
                        " holds a control character or a backslash, which sbatch cannot take in --output; " +
                        std::string(detail::another_out));
    pattern += c == '%' ? std::string("%%") : std::string(1, c);  // a literal '%' in a filename pattern
  }
  // The job name is the spec's (a command's file name): what a terminal or squeue would garble
  // becomes '_'.
  std::string name = job_name;
  for (char& c : name)
    if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f) c = '_';
  std::vector<std::string> a = {
      "--parsable", "--job-name=" + name,
      "--array=0-" + std::to_string(array_tasks - 1) + (s.max_running ? "%" + std::to_string(s.max_running) : ""),
      "--output=" + pattern + "/%A_%a.out"};
  if (s.warning_signal) {
    // Trials that keep checkpoints: the array task's isorun (the batch shell, which execs it) is
    // warned ahead of the time limit, warns its trials, and requeues the task, which resumes
    // them; Slurm requeues it itself after a preemption or a node failure.
    a.push_back("--requeue");
    a.push_back("--signal=B:" + std::to_string(s.warning_signal) + "@" + std::to_string(s.warning_lead.count()));
  } else {
    // A lost array task is isorun's to classify and retry (by the sweep's policy), not Slurm's
    // to requeue behind its back.
    a.push_back("--no-requeue");
  }
  if (!s.partition.empty()) a.push_back("--partition=" + s.partition);
  if (!s.account.empty()) a.push_back("--account=" + s.account);
  if (!s.time.empty()) a.push_back("--time=" + s.time);
  if (s.gpus_per_node) a.push_back("--gres=gpu:" + std::to_string(s.gpus_per_node));
  a.insert(a.end(), s.extra.begin(), s.extra.end());
  return a;
}

std::string batch_script(const fs::path& batch_file, const std::vector<std::string>& node_command,
                         const fs::path& submit_dir, int warning_signal) {
  std::ostringstream script;
  script
      << "#!/bin/sh\n# isorun: array task K runs the trials tasks[K] of " << quoted(batch_file.filename().string())
      << ", here, isolated and capped.\n# Slurm's settings are sbatch's arguments, kept in that file's \"sbatch\".\n";
  script << "cd " << quoted(fs::absolute(submit_dir).string()) << " || exit 1\n";
  // Where isorun writes its failure as a record, for the submitter to read
  // (remote_folder::error_record() for this array task; the batch file is in that folder).
  const remote_folder shared(fs::absolute(batch_file.parent_path().parent_path()), batch_file.parent_path().filename());
  script << "ISORUN_ERROR_FILE=" << quoted(shared.errors().string())
         << "/\"$SLURM_ARRAY_JOB_ID\"_\"$SLURM_ARRAY_TASK_ID\".json; export ISORUN_ERROR_FILE\n";
  // Slurm's warning can come while isorun starts (a requeued task may be warned at once): it is
  // ignored until isorun's own handler takes it, rather than end the task before it could save
  // and requeue. (isorun's children get every signal's default back.)
  if (warning_signal) script << "trap '' " << warning_signal << "\n";
  script << "exec";
  // --node goes with isorun's own flags: before a `--`, past which every word is the command's.
  const auto end_of_flags = std::find(node_command.begin(), node_command.end(), "--");
  for (auto w = node_command.begin(); w != end_of_flags; ++w) script << " " << quoted(*w);
  script << " --node " << quoted(batch_file.string()) << ":\"$SLURM_ARRAY_TASK_ID\"";
  for (auto w = end_of_flags; w != node_command.end(); ++w) script << " " << quoted(*w);
  script << "\n";
  return script.str();
}

submission submit(const slurm_spec& s, const fs::path& out, const std::vector<std::size_t>& trials,
                  const std::vector<std::string>& node_command, const fs::path& submit_dir, const std::string& job_name,
                  const std::vector<made_trial>& made) {
  const fs::path dir = fs::absolute(out) / "slurm";
  submission sub;
  const std::size_t chunk = static_cast<std::size_t>(std::max(1, s.trials_per_task));
  for (std::size_t i = 0; i < trials.size(); i += chunk)
    sub.tasks.emplace_back(trials.begin() + static_cast<std::ptrdiff_t>(i),
                           trials.begin() + static_cast<std::ptrdiff_t>(std::min(trials.size(), i + chunk)));
  // Checked before anything is written: a refused setting leaves no batch behind.
  std::vector<std::string> args = sbatch_arguments(s, sub.tasks.size(), dir / "logs", job_name);
  fs::create_directories(dir / "logs");                // sbatch's --output
  remote_folder(fs::absolute(out), "slurm").create();  // records, reports, verdicts, failure records
  for (sub.batch = 1; fs::exists(dir / ("batch-" + std::to_string(sub.batch) + ".json")); ++sub.batch) {
  }
  const std::string name = "batch-" + std::to_string(sub.batch);
  const fs::path script = dir / (name + ".sh");
  json batch = {{"tasks", sub.tasks}, {"sbatch", args}};
  for (const made_trial& t : made)
    batch["made"][std::to_string(t.index)] = {{"id", t.id}, {"params", t.params}, {"origin", t.origin}};
  write_file_durably(dir / (name + ".json"), batch.dump() + "\n");
  write_file_durably(script, batch_script(dir / (name + ".json"), node_command, submit_dir, s.warning_signal));

  args.push_back(script.string());
  const ran r = run("sbatch", args);
  // What sbatch refuses is what was asked for (a partition, a gres, a time the cluster lacks).
  if (r.code != 0)
    throw usage_error("sbatch refused the job array (" + script.string() + "): " + trim(r.err + r.out) +
                      "; check resources: partition, gpus_per_node, time, account, extra");
  sub.job = trim(r.out);
  if (const auto semi = sub.job.find(';'); semi != std::string::npos) sub.job.resize(semi);  // "ID;CLUSTER"
  if (sub.job.empty()) throw internal_error("sbatch gave no job id for " + script.string());
  return sub;
}

std::vector<made_trial> made_trials(const json& batch) {
  std::vector<made_trial> out;
  const auto made = batch.is_object() ? batch.find("made") : batch.end();
  if (made == batch.end() || !made->is_object()) return out;
  for (const auto& [index, t] : made->items()) {
    // The id names the trial's files (logs, checkpoints, records): only one trial_id() makes.
    // The index is a trial number a sweep can have.
    std::size_t number = 0;
    const auto [end, ec] = std::from_chars(index.data(), index.data() + index.size(), number);
    if (ec != std::errc() || end != index.data() + index.size() || number > (std::size_t{1} << 40)) continue;
    if (t.is_object() && t.contains("id") && t["id"].is_string() && is_trial_id(t["id"].get<std::string>()) &&
        t.contains("params") && t["params"].is_object())
      out.push_back({number, t["id"].get<std::string>(), t["params"], t.value("origin", json())});
  }
  return out;
}

assignment node_trials(const std::string& file_and_task) {
  const auto colon = file_and_task.rfind(':');
  if (colon == std::string::npos) throw usage_error("--node " + file_and_task + ": expected FILE:TASK");
  std::size_t task = 0;
  try {
    task = std::stoul(file_and_task.substr(colon + 1));
  } catch (...) {
    throw usage_error("--node " + file_and_task + ": the array task is not a number");
  }
  std::ifstream in(file_and_task.substr(0, colon));
  const json j = parse_bounded_json(in);
  if (!j.is_object() || !j.contains("tasks") || !j["tasks"].is_array() || task >= j["tasks"].size() ||
      !j["tasks"][task].is_array())
    throw usage_error("--node " + file_and_task + ": no such submission file or array task");
  assignment a;
  for (const auto& i : j["tasks"][task]) {
    if (!i.is_number_unsigned()) throw usage_error("--node " + file_and_task + ": a trial that is not a number");
    a.trials.push_back(i.get<std::size_t>());
  }
  for (made_trial& t : made_trials(j)) a.made[t.index] = std::move(t);
  return a;
}

namespace {

// Slurm's answer for a job it no longer knows (purged after MinJobAge, or never submitted): told
// apart from a slurmctld that did not answer, after which nothing is known.
bool unknown_job(const ran& r) { return r.code != 0 && (r.err + r.out).find("Invalid job id") != std::string::npos; }

}  // namespace

std::optional<std::vector<int>> active_tasks(const std::string& job) {
  const ran r = run("squeue", {"-h", "-r", "-j", job, "-o", "%K"});
  std::vector<int> out;
  if (unknown_job(r)) return out;  // nothing of it is active
  if (r.code != 0) return std::nullopt;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);)
    if (!trim(line).empty()) try {
        out.push_back(std::stoi(line));
      } catch (...) {
      }
  return out;
}

std::optional<std::map<int, task_end>> task_states(const std::string& job) {
  const ran r = run("scontrol", {"show", "job", "-o", job});
  std::map<int, task_end> out;
  if (unknown_job(r)) return out;
  if (r.code != 0) return std::nullopt;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);) {
    auto field = [&](const std::string& key) {
      const auto at = line.find(" " + key + "=");
      if (at == std::string::npos) return std::string();
      const auto from = at + key.size() + 2;
      return line.substr(from, line.find(' ', from) - from);
    };
    const std::string task = field("ArrayTaskId"), state = field("JobState"), code = field("ExitCode");
    if (!task.empty() && !state.empty()) try {
        task_end& e = out[std::stoi(task)];
        e.state = state;
        if (!code.empty() && std::isdigit(static_cast<unsigned char>(code[0]))) e.exit_code = std::stoi(code);  // "2:0"
      } catch (...) {
      }
  }
  return out;
}

bool still_in_queue(const std::string& state) {
  // squeue's default view, and the states of a task Slurm is requeuing or holding to requeue.
  static const std::set<std::string, std::less<>> queued = {
      "PENDING",     "RUNNING",  "SUSPENDED", "COMPLETING", "CONFIGURING",   "REQUEUED",     "REQUEUE_HOLD",
      "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT",  "RESV_DEL_HOLD", "SPECIAL_EXIT", "STOPPED"};
  return queued.count(state) > 0;
}

std::optional<std::map<int, task_end>> ended_states(const std::string& job) {
  const auto active = active_tasks(job);
  if (!active || !active->empty()) return std::nullopt;
  auto states = task_states(job);
  if (!states ||
      std::any_of(states->begin(), states->end(), [](const auto& task) { return still_in_queue(task.second.state); }))
    return std::nullopt;
  return states;
}

std::optional<std::string> node_usage_error(const task_end& end, const fs::path& record) {
  if (end.exit_code != 2) return std::nullopt;
  // Read as the folder's other files are (not through a link, only a regular file, bounded): a
  // record that is none of that, or not isorun's, holds no refusal of isorun's.
  try {
    const unique_fd dir = detail::open_folder(record.parent_path());
    const unique_fd fd = dir ? detail::open_file(dir.get(), record.filename().string(), O_RDONLY, record) : unique_fd();
    if (!fd) return std::nullopt;  // exit 2 from something else: not isorun's refusal
    const nlohmann::json j = parse_bounded_json(detail::read_all(fd.get(), 1 << 16, record));
    if (!j.is_object() || j.value("outcome", "") != "usage" || j.value("exit_code", 0) != 2) return std::nullopt;
    const auto message = j.find("message");
    if (message == j.end() || !message->is_string() || message->get<std::string>().empty()) return std::nullopt;
    return message->get<std::string>();
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

outcome_kind outcome_of(const std::string& state) {
  if (state == "TIMEOUT" || state == "DEADLINE") return outcome_kind::timeout;
  if (state == "OUT_OF_MEMORY") return outcome_kind::out_of_memory;
  // CANCELLED here is someone's scancel of an array task (the sweep's own Ctrl-C stops following
  // before anything is classified): the trial was lost, as on a node failure or a preemption.
  return outcome_kind::crashed;  // CANCELLED, NODE_FAIL, PREEMPTED, BOOT_FAIL, FAILED, COMPLETED without a record
}

void cancel(const std::string& job) { run("scancel", {job}); }

bool requeue_this_task(std::string& why) {
  const char* job = std::getenv("SLURM_ARRAY_JOB_ID");
  const char* task = std::getenv("SLURM_ARRAY_TASK_ID");
  if (!job || !task) {
    why = "not in a Slurm array task";
    return false;
  }
  const ran r = run("scontrol", {"requeue", std::string(job) + "_" + task});
  why = trim(r.err + r.out);
  return r.code == 0;
}

std::optional<std::vector<int>> assigned_gpus() {
  const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
  if (!v || !*v) return std::nullopt;
  std::vector<int> out;
  std::istringstream in(v);
  for (std::string w; std::getline(in, w, ',');) {
    if (w.empty() || w.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
    out.push_back(std::stoi(w));
  }
  return out;
}

}  // namespace isorun::sweep::slurm
