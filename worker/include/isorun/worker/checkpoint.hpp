#pragma once
/// @file checkpoint.hpp
/// A trial's checkpoints: the folder OUT/checkpoints/ID of a sweep, which outlives its attempts.
/// A checkpoint is written into a staging folder and committed whole: every file and folder in
/// it fsync'ed, then renamed to `step-NNNNNNNNNNNN` (a rename is atomic), then the parent
/// fsync'ed. Only committed folders are ever handed out, so a writer killed half-way leaves the
/// previous checkpoint as the latest. The latest `keep` are kept.
///
/// The same folder serves every kind of trial: a command writes into `$ISORUN_CHECKPOINT_DIR/tmp`
/// and prints `{"checkpoint": STEP}` (the sweep commits it), a task or a Python function commits
/// its own (this_worker().checkpoint(), isorun.checkpoint()); every attempt finds the latest in
/// `$ISORUN_RESUME_FROM`.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "isorun/export.hpp"

namespace isorun {

/// A committed checkpoint.
struct checkpoint_info {
  std::int64_t step = 0;
  std::filesystem::path path;  ///< its folder
};

/// The variables a trial's checkpoint folder is described by, in the trial's environment.
namespace checkpoint_env {
inline constexpr const char* dir = "ISORUN_CHECKPOINT_DIR";        ///< the trial's folder
inline constexpr const char* keep = "ISORUN_CHECKPOINT_KEEP";      ///< how many are kept
inline constexpr const char* signal = "ISORUN_CHECKPOINT_SIGNAL";  ///< the warning's number
inline constexpr const char* resume_from = "ISORUN_RESUME_FROM";   ///< the latest's folder, if any
inline constexpr const char* resume_step = "ISORUN_RESUME_STEP";   ///< and its step
}  // namespace checkpoint_env

class ISORUN_API checkpoint_folder {
 public:
  /// Where a command stages the checkpoint it is about to announce: `tmp`, or `tmp-STEP` for a
  /// command that may write its next checkpoint before isorun has moved this one away.
  static constexpr const char* command_staging = "tmp";

  /// @brief Where a command staged checkpoint `step`: `tmp-STEP` if it made that, else `tmp`.
  [[nodiscard]] std::filesystem::path command_staged(std::int64_t step) const;

  /// @brief The folder `dir` (created if missing, its parent too), keeping the latest `keep`.
  /// @throws std::invalid_argument for `keep` < 1; std::runtime_error naming the folder if it is
  ///         a symbolic link, not a folder, or not writable.
  checkpoint_folder(std::filesystem::path dir, int keep);

  [[nodiscard]] const std::filesystem::path& dir() const noexcept { return dir_; }
  [[nodiscard]] int keep() const noexcept { return keep_; }

  /// @brief The latest committed checkpoint, if any.
  [[nodiscard]] std::optional<checkpoint_info> latest() const;

  /// @brief The committed checkpoints, oldest first.
  [[nodiscard]] std::vector<checkpoint_info> committed() const;

  /// @brief Checks that checkpoint `step` could be committed now.
  /// @throws std::invalid_argument for a negative step, or one not after the latest committed.
  void check_step(std::int64_t step) const;

  /// @brief A new, empty staging folder for checkpoint `step` (not handed out until committed).
  [[nodiscard]] std::filesystem::path stage(std::int64_t step) const;

  /// @brief Commits `staged` (a folder inside dir()) as checkpoint `step`: fsyncs what it holds,
  ///        renames it, fsyncs the folder, and removes all but the latest keep().
  /// @throws std::invalid_argument for a step not after the latest committed one (steps only go
  ///         forward; `staged` is left as it is); std::runtime_error if a write or rename fails.
  checkpoint_info commit(const std::filesystem::path& staged, std::int64_t step);

  /// @brief Removes what writers that did not commit left (staging folders, a command's `tmp`
  ///        and `tmp-STEP`) and makes an empty `tmp`: for the supervisor, before an attempt
  ///        starts, and after it commits a command's `tmp`.
  void clear_staging() const;

 private:
  std::filesystem::path dir_;
  int keep_;
};

/// @brief The name of checkpoint `step`'s folder: `step-` and the step in at least 12 digits, so
///        that names of steps below 10^12 sort as steps do. Any step from 0 to INT64_MAX is read
///        back from its name (committed() orders by the step, not the name).
ISORUN_API std::string checkpoint_name(std::int64_t step);

}  // namespace isorun
