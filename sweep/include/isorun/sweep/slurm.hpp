#pragma once
/// @file slurm.hpp
/// Talking to Slurm, for sweeps whose trials run on a cluster (resources: {backend: slurm}): a
/// submission is one job array (sbatch), each array task an `isorun` on its node that runs the
/// trials listed for it, isolated and capped on the GPUs Slurm gave it, and leaves each trial's
/// record as a file in OUT/slurm/results/ (written whole, then renamed: a node that dies
/// mid-write leaves nothing half-read). The submitting side merges those into the journal.
/// Slurm's own commands (sbatch, squeue, scontrol, scancel) are the only interface: nothing
/// links against Slurm.

#include <cstddef>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "isorun/runner/outcome.hpp"
#include "isorun/sweep/spec.hpp"

namespace isorun::sweep::slurm {

/// One job array: its id and, per array task, the trials (indices into the spec's trials) it runs.
struct submission {
  std::string job;                              ///< the array's job id
  int batch = 0;                                ///< its number in OUT/slurm (batch-N.json, batch-N.sh)
  std::vector<std::vector<std::size_t>> tasks;  ///< trials of array task 0, 1, ...
};

/// @brief Why `value` cannot be given to sbatch as the spec's Slurm setting `key` (partition,
///        account, time, or one entry of extra), or "" if it can.
/// Every setting reaches sbatch as one argument of its command line, never as a line of the
/// batch script, so no value can end a directive and start a shell line. What is refused is what
/// would still mislead: control characters anywhere (a newline, an escape), whitespace in a
/// partition, account or time (Slurm's names and durations have none), an extra entry that is not
/// one option (it must start with '-'; "--" ends them), and the options isorun sets itself
/// (--array, --output, --error, --wrap, --parsable, --signal, --requeue, --no-requeue), read as
/// sbatch's getopt_long reads them: a long one abbreviated, a short one within a cluster ("-Qo/x"
/// is -Q -o /x).
std::string setting_problem(const std::string& key, const std::string& value);

/// @brief The command line sbatch gets for a job array of `array_tasks` tasks whose output goes
///        to `logs` (one file per array task, JOB_TASK.out): the array, --output, --no-requeue,
///        then the spec's partition, account, time, gres and extra options, each as one argument.
///        `%` in the logs path is doubled, as sbatch's filename patterns want.
/// @throws usage_error for a setting setting_problem() refuses, or a logs path sbatch cannot take
///         as a pattern (a control character; a backslash, which turns its patterns off).
std::vector<std::string> sbatch_arguments(const slurm_spec& s, std::size_t array_tasks,
                                          const std::filesystem::path& logs, const std::string& job_name);

/// @brief The batch script of submission `batch_file` (OUT/slurm/batch-N.json): a comment, then
///        `cd SUBMIT_DIR` and `exec NODE_COMMAND --node BATCH_FILE:$SLURM_ARRAY_TASK_ID` (--node
///        before a `--` in NODE_COMMAND, past which the words are a command's), every word
///        single-quoted. It holds no #SBATCH directive: those travel as sbatch's arguments.
///        With a `warning_signal` (trials that keep checkpoints), the shell ignores it before the
///        exec, so that a warning that comes while isorun starts cannot end the task.
std::string batch_script(const std::filesystem::path& batch_file, const std::vector<std::string>& node_command,
                         const std::filesystem::path& submit_dir, int warning_signal = 0);

/// A trial a source made (a searcher's, a population's child), which the spec's list does not
/// hold: a submission file carries it for its array tasks.
// NOLINTNEXTLINE(bugprone-exception-escape): its moves are std::string's and nlohmann::json's, which do not throw
struct made_trial {
  std::size_t index = 0;
  std::string id;         ///< trial_id() of it
  nlohmann::json params;  ///< its parameters
  nlohmann::json origin;  ///< where it came from, or null
};

/// @brief Writes OUT/slurm/batch-N.json (the trials of each array task, those among them that a
///        source made, and the sbatch command line) and batch-N.sh for `trials` (in chunks of
///        trials_per_task) and submits the array with sbatch. Each array task runs, in
///        `submit_dir`, `node_command` plus `--node OUT/slurm/batch-N.json:$SLURM_ARRAY_TASK_ID`.
/// @throws usage_error if sbatch is not found, a setting is refused (see sbatch_arguments), or
///         sbatch refuses the array (its reason: a partition or gres the cluster lacks, ...);
///         nothing is submitted then.
submission submit(const slurm_spec& s, const std::filesystem::path& out, const std::vector<std::size_t>& trials,
                  const std::vector<std::string>& node_command, const std::filesystem::path& submit_dir,
                  const std::string& job_name, const std::vector<made_trial>& made = {});

/// What one array task runs: its trials' indices, and those of them a source made, by index.
struct assignment {
  std::vector<std::size_t> trials;
  std::map<std::size_t, made_trial> made;
};

/// @brief What array task `task` of OUT/slurm/batch-N.json runs ("FILE:K" as --node gives it).
/// @throws usage_error for a malformed reference or file.
assignment node_trials(const std::string& file_and_task);

/// @brief The trials a source made in submission file `batch` (its "made"), each as checked: an
///        id trial_id() could make, an object of parameters, a bounded index; others are left out.
std::vector<made_trial> made_trials(const nlohmann::json& batch);

/// @brief The array tasks of `job` that Slurm still has queued, running or being requeued
///        (squeue). Empty once the whole array is done, or when Slurm no longer knows the job;
///        nullopt when Slurm could not be asked (slurmctld busy or restarting): nothing is known
///        then, and nothing may be taken for ended.
std::optional<std::vector<int>> active_tasks(const std::string& job);

/// @brief Requeues the array task this process runs in (scontrol requeue): Slurm ends it and
///        runs it again later, from its batch script. False, with Slurm's words in `why`, where it
///        cannot (requeue is off on the cluster, or this is no array task).
bool requeue_this_task(std::string& why);

/// The exit code of an array task's isorun that was warned, stopped its trials (which saved
/// their checkpoints) and could not requeue itself: its trials are preempted, to be resumed in a
/// new array.
inline constexpr int preempted_exit = 75;

/// How an array task ended, as Slurm says.
struct task_end {
  std::string state;   ///< COMPLETED, FAILED, TIMEOUT, NODE_FAIL, PREEMPTED, OUT_OF_MEMORY, CANCELLED, ...
  int exit_code = -1;  ///< the batch script's exit code (ExitCode=N:signal), -1 if Slurm gave none
};

/// @brief How each array task of `job` ended (scontrol show job), by task index. Tasks Slurm
///        has forgotten (MinJobAge) are missing; nullopt when Slurm could not be asked.
std::optional<std::map<int, task_end>> task_states(const std::string& job);

/// @brief Whether Slurm state `state` is one a task can still leave: queued, running, or on its
///        way back to the queue (COMPLETING, REQUEUED, ...). Such a task has not ended, whatever
///        its trials' processes did.
bool still_in_queue(const std::string& state);

/// @brief How each task of `job` ended, once the whole array has: Slurm says so twice over, no
///        task in its queue (squeue) and every task's state final (scontrol; a task being
///        requeued may leave squeue's view for a moment). nullopt while any may still run, or
///        where Slurm does not answer.
std::optional<std::map<int, task_end>> ended_states(const std::string& job);

/// @brief The usage error an array task's isorun stopped with, if that is how it ended: exit
///        code 2 (isorun's code for input it refuses, such as a GPU the node does not have) and
///        a usage record in its error file `record` (remote_folder::error_record(), where the
///        batch script has isorun write its failure: ISORUN_ERROR_FILE). nullopt for any other
///        end: those are lost trials, retried by the sweep's policy, while a usage error would
///        only repeat.
std::optional<std::string> node_usage_error(const task_end& end, const std::filesystem::path& record);

/// @brief The outcome class of a trial whose array task ended in Slurm state `state` without
///        leaving its record: TIMEOUT (Slurm's time limit) is a timeout, OUT_OF_MEMORY (its
///        cgroup's limit) out_of_memory, and a node failure, a preemption, a scancel of the task
///        or anything else crashed; each is retried as the sweep's policy says.
outcome_kind outcome_of(const std::string& state);

/// @brief Cancels `job` (scancel): every array task still queued or running.
void cancel(const std::string& job);

/// @brief The GPU indices Slurm gave this process, from CUDA_VISIBLE_DEVICES as a list of
///        numbers (gres); nullopt if it is unset or not such a list.
std::optional<std::vector<int>> assigned_gpus();

}  // namespace isorun::sweep::slurm
