#pragma once
/// @file journal.hpp
/// A sweep's durable record in its output folder: the journal (results.jsonl, one JSON record
/// per finished trial, each batch fsync'ed before it counts), the folder's lock, and files
/// written whole or not at all. What makes kill -9 and resume safe.

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "isorun/runner/outcome.hpp"

namespace isorun::sweep {

/// @brief Stable id of a trial: 16 hex digits of XXH3 over the task and canonical parameters.
std::string trial_id(const std::string& task, const nlohmann::json& params);

/// @brief Whether `id` is one trial_id() could make (16 lowercase or uppercase hex digits): the
///        only names under which a trial's files are looked up, whoever wrote the id.
bool is_trial_id(const std::string& id);

/// How a finished trial ended, as journaled.
struct trial_record {
  std::string id;
  nlohmann::json params;
  outcome_kind kind = outcome_kind::success;
  nlohmann::json result;  ///< the task's result (success) or null
  std::string error;      ///< description for failures
  double wall_s = 0;
  std::string device;
  int slot = 0;
  int attempts = 0;
  std::uint64_t peak_reserved = 0;
  std::uint64_t peak_allocated = 0;
  std::uint64_t mem_limit = 0;  ///< the trial's cap per device (0: none)
  int run = 0;                  ///< which run of the sweep (1, 2, ... as it is resumed; 0: unknown)
  double start_s = 0;           ///< when it started, seconds after its run started
  std::string timeline;         ///< its memory timeline, relative to the output folder ("" none)
  /// Stopped early by the sweep's scheduler (ASHA, median): journaled as outcome "pruned", with
  /// `kind` cancelled and `result` its last report. Done, not failed; never retried or rerun.
  bool pruned = false;
  std::int64_t step = -1;  ///< the last step the trial reported (-1: it reported none)
  /// An attempt that ran out of memory and is run again at this larger cap (0: none). Such a
  /// record is not the trial's end: it keeps the attempt's cap in the journal, and a resumed
  /// sweep starts the trial again at this cap.
  std::uint64_t retry_mem_limit = 0;
  /// Stopped by a planned stop of the sweep (Ctrl-C, isorun stopped) in a sweep that keeps
  /// checkpoints: journaled as outcome "preempted", with `kind` cancelled. Neither a success nor
  /// a failure, and not the trial's end: a resumed sweep runs it again from its checkpoint.
  bool preempted = false;
  /// With checkpoints: the latest step the trial had committed when the attempt ended (-1: none).
  std::int64_t checkpoint = -1;
  /// With checkpoints: where this trial's attempts resumed, in every run so far, oldest first:
  /// {"run", "attempt", "from": step, "redone": steps the attempt before had reported past it}.
  nlohmann::json resumes = nlohmann::json::array();
  /// Where the trial came from, if a source says (population-based training's lineage: its
  /// parent, the member it replaced, the parent's checkpoint step, its generation); else null.
  nlohmann::json origin = nullptr;
  /// @brief The steps redone over all resumes (the sum of their "redone").
  [[nodiscard]] std::int64_t steps_redone() const;
  [[nodiscard]] nlohmann::json to_json() const;
  /// @brief The record as one line of JSON, newline included: what the journal and a node's
  ///        result file hold. A string that is not UTF-8 (text a task wrote that reached the
  ///        record by a path that did not make it valid) is written with U+FFFD for its bad
  ///        bytes, never refused: a record that cannot be written would stop the sweep on every
  ///        resume.
  [[nodiscard]] std::string to_line() const;
  /// @brief The record `j` holds. @throws std::exception (a json or std::invalid_argument one)
  ///        if it holds none: a required field missing, a field of the wrong type or range.
  static trial_record from_json(const nlohmann::json& j);
};

/// @brief A record's outcome as journaled and shown: "pruned" for a pruned trial, else its kind.
[[nodiscard]] inline std::string_view outcome_name(const trial_record& r) noexcept {
  return r.pruned ? std::string_view("pruned") : r.preempted ? std::string_view("preempted") : to_string(r.kind);
}

/// @brief Whether a record is a trial's end: not an attempt retried at a larger cap.
[[nodiscard]] inline bool final_record(const trial_record& r) noexcept {
  return r.retry_mem_limit == 0 && !r.preempted;
}

/// @brief Whether a record counts as done without failing: a success, or a pruned trial.
[[nodiscard]] inline bool done_well(const trial_record& r) noexcept {
  return r.kind == outcome_kind::success || r.pruned;
}

/// OUT/results.jsonl, open for appending. Reading it keeps complete lines only: a line cut short
/// by a crash is truncated away before anything is appended; a line that is not a record (or is
/// longer than max_line) is reported and ignored; the last record of a trial is the one that
/// counts. It is never opened through a symbolic link, nor used unless it is a regular file.
class journal {
 public:
  /// The longest line read as a record: no record isorun writes comes near it, and a reader
  /// holds no more than this of a damaged or planted file.
  static constexpr std::size_t max_line = std::size_t{256} << 20;

  /// @brief Opens (or creates) the journal in `folder` and reads what it holds.
  /// @throws usage_error if a link or anything but a regular file is there; internal_error if
  ///         it cannot be opened, read or repaired.
  explicit journal(const std::filesystem::path& folder);
  ~journal();
  journal(journal&&) noexcept;
  journal& operator=(journal&&) noexcept;

  /// The last record of each trial, by id.
  [[nodiscard]] const std::map<std::string, trial_record>& latest() const noexcept { return latest_; }
  /// The ids of the trials that ended, in the order of their last final records (as the sweep's
  /// trial source was told them): what a resumed sweep tells its source again, in this order.
  [[nodiscard]] std::vector<std::string> order() const;
  /// Lines that were not records, one message each (file and line number).
  [[nodiscard]] const std::vector<std::string>& warnings() const noexcept { return warnings_; }

  /// @brief Appends `records` and fsyncs once (a group commit): durable when this returns.
  ///        Also makes them the latest records of their trials.
  /// @throws internal_error if the write or the fsync fails.
  void append(const std::vector<trial_record>& records);

 private:
  int fd_ = -1;
  std::filesystem::path path_;
  std::map<std::string, trial_record> latest_;
  std::map<std::string, std::uint64_t> ended_at_;  // id -> place of its last final record
  std::uint64_t records_ = 0;
  std::vector<std::string> warnings_;
};

/// One sweep's hold on an output folder: flock on OUT/sweep.lock, holding the holder's pid. The
/// kernel releases it when the process dies, so kill -9 and resume still work. The lock file is
/// never opened through a symbolic link, nor used unless it is a regular file.
class folder_lock {
 public:
  /// @brief Takes the lock, or waits for it with `wait`.
  /// @throws usage_error naming the holder's pid if another sweep holds it and !`wait`, or if
  ///         a link or anything but a regular file is there; internal_error if the lock file
  ///         cannot be used.
  folder_lock(const std::filesystem::path& folder, bool wait);
  ~folder_lock();
  folder_lock(folder_lock&& other) noexcept;
  folder_lock& operator=(folder_lock&& other) noexcept;

 private:
  int fd_ = -1;
};

/// @brief Writes `content` to `path` whole or not at all: a new temporary file of a random name
///        in the same folder, fsync, rename. Whatever is at `path` is replaced, a symbolic link
///        too: nothing is written through one.
/// @throws internal_error.
void write_file_durably(const std::filesystem::path& path, const std::string& content);

}  // namespace isorun::sweep
