#pragma once
/// @file journal_writer.hpp
/// The one writer of a sweep's final records, on a thread of its own: the trials that end hand
/// their records over and take their next trial at once; the writer makes each batch durable
/// with one fsync (a group commit). A trial counts as done only once its record is durable.

#include <condition_variable>
#include <exception>
#include <filesystem>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "isorun/sweep/journal.hpp"
#include "isorun/sweep/report_log.hpp"

namespace isorun::sweep {

/// Where durable records go.
class record_store {
 public:
  virtual ~record_store() = default;
  /// @brief Makes `batch` durable. @throws on failure (nothing of it then counts).
  virtual void write(const std::vector<trial_record>& batch) = 0;
};

/// The sweep's journal (OUT/results.jsonl). With `reports`, the reports appended so far are made
/// durable before each batch: a record is never durable before the reports that came before it
/// (a pruned trial's verdict is replayed from them on resume).
class journal_store final : public record_store {
 public:
  explicit journal_store(journal& j, report_log* reports = nullptr) : journal_{j}, reports_{reports} {}
  void write(const std::vector<trial_record>& batch) override {
    if (reports_) reports_->sync();
    journal_.append(batch);
  }

 private:
  journal& journal_;
  report_log* reports_;
};

/// A Slurm array task's records, each a file OUT/slurm/results/ID.json (written whole, then
/// renamed) for the submitter to journal.
class result_files final : public record_store {
 public:
  explicit result_files(std::filesystem::path dir) : dir_{std::move(dir)} {}
  void write(const std::vector<trial_record>& batch) override;

 private:
  std::filesystem::path dir_;
};

class journal_writer {
 public:
  /// @brief Starts the writer. `on_durable` is called (on its thread) for each record once it
  ///        is durable; `on_error` once, if a write fails: nothing more is written after that
  ///        (those trials run again when the sweep is resumed).
  journal_writer(record_store& store, std::function<void(const trial_record&)> on_durable,
                 std::function<void(std::exception_ptr)> on_error);
  /// Closes it (close()).
  ~journal_writer();
  journal_writer(const journal_writer&) = delete;
  journal_writer& operator=(const journal_writer&) = delete;

  /// @brief Hands a final record over; it is written with the next batch.
  void push(trial_record record);

  /// @brief Writes what was handed over and ends the thread.
  void close();

  /// @brief The failed write's error, or null. Read after close().
  [[nodiscard]] std::exception_ptr error() const noexcept { return error_; }

 private:
  void loop();

  record_store& store_;
  std::function<void(const trial_record&)> on_durable_;
  std::function<void(std::exception_ptr)> on_error_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<trial_record> unwritten_;
  bool done_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace isorun::sweep
