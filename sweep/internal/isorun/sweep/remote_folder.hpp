#pragma once
/// @file remote_folder.hpp
/// The folder a sweep's submitter shares with the machines that run its trials elsewhere
/// (OUT/slurm for the Slurm backend; a second cluster backend would use OUT/<its name> the same
/// way), on a file system both see. Both halves of its protocol live here:
///
///   results/ID.json     a node's final record of trial ID (written whole: temp file, rename)
///   reports/ID.jsonl    a node's reports of trial ID as it runs, one {"step", "metrics"} line
///                       each, and a {"checkpoint": STEP} line as each checkpoint is committed,
///                       appended a line at a time (one write, the file opened each time, so
///                       that another node sees whole lines)
///   stop/ID             the submitter's verdict: stop trial ID alone (early stopping)
///   errors/JOB_TASK.json the failure record of a node's isorun that refused its trials
///
/// Every file is opened by name inside the folder, never through a link, only if it is a
/// regular file, and read with bounds (folder.hpp): nodes and anyone of the same user can write
/// here, and what they write can make a sweep's results wrong, never make isorun hang, crash or
/// write elsewhere.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "isorun/sweep/journal.hpp"
#include "isorun/sweep/journal_writer.hpp"

namespace isorun::sweep {

class remote_folder {
 public:
  /// @param out the sweep's output folder; @param name the backend's subfolder in it ("slurm").
  remote_folder(std::filesystem::path out, std::string name);

  [[nodiscard]] const std::filesystem::path& dir() const noexcept { return dir_; }

  // --- The submitter's half.

  /// @brief Creates the folder and its subfolders (before any node starts).
  void create() const;
  /// @brief A new attempt of trial `id` starts: no record, verdict or reports of an earlier one stay.
  void start_afresh(const std::string& id) const;
  /// @brief Stops trial `id` alone: an empty file the node looks for, created, never truncated
  ///        nor written through a link. @throws usage_error if a link or another kind of file is there.
  void stop(const std::string& id) const;
  /// What one look at a trial's reports found.
  struct reports_read {
    std::vector<std::pair<std::int64_t, nlohmann::json>> reports;
    std::vector<std::int64_t> checkpoints;  ///< the steps of the checkpoints committed, in order
    /// Why bytes were skipped (a line longer than any report, report_lines::max_line), for a
    /// warning; "" if none were.
    std::string skipped;
  };
  /// @brief Trial `id`'s reports and checkpoints appended since byte `offset`, which moves past the whole lines
  ///        read (a line still being written waits for the next look; one that is not a report
  ///        is passed over), and past the bytes skipped of a line longer than a report can be,
  ///        its newline or not. Reads at most max_report_look bytes a look.
  /// @throws usage_error if a link or a FIFO is there.
  reports_read reports_since(const std::string& id, std::uint64_t& offset) const;
  /// The bytes one look reads at most: a file that grows without end (or a sparse one) costs each
  /// look that much, and the rest waits for the next. Room for several whole reports of the
  /// largest size, so that each look ends at least one line.
  static constexpr std::size_t max_report_look = std::size_t{4} << 20;
  /// A record found in results/, by its file's name.
  struct found_record {
    std::string file;
    trial_record record;
  };
  /// @brief The records in results/ (files still being written are not listed); a file there
  ///        that is not a record (nor a regular file) is removed. @throws usage_error if results/ is a link.
  std::vector<found_record> records() const;
  /// @brief Removes the record file `file` of results/ (it is durable in the journal, or not wanted).
  void remove_record(const std::string& file) const;
  /// @brief The failure record a node's isorun writes for array task `task` of `job`: in
  ///        errors(), named JOB_TASK.json (a batch script names it from Slurm's variables).
  [[nodiscard]] std::filesystem::path error_record(const std::string& job, std::size_t task) const;
  [[nodiscard]] std::filesystem::path errors() const { return dir_ / "errors"; }

  // --- A node's half.

  /// @brief Appends a report of trial `id` for the submitter.
  void report(const std::string& id, std::int64_t step, const nlohmann::json& metrics) const;
  /// @brief Appends that trial `id` committed its checkpoint `step` (for the trackers).
  void checkpoint(const std::string& id, std::int64_t step) const;
  /// @brief Whether the submitter has stopped trial `id`.
  [[nodiscard]] bool stop_requested(const std::string& id) const;
  /// @brief Whether trial `id`'s record is waiting in results/ for the submitter.
  [[nodiscard]] bool has_record(const std::string& id) const;
  /// @brief Where a node's records go: results/ID.json, each written whole.
  [[nodiscard]] std::unique_ptr<record_store> records_store() const;

 private:
  void append_report_line(const std::string& id, const std::string& line) const;
  std::filesystem::path out_, dir_;
  std::string name_;
};

}  // namespace isorun::sweep
