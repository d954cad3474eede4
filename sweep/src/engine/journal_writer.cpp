#include "isorun/sweep/journal_writer.hpp"

namespace isorun::sweep {

void result_files::write(const std::vector<trial_record>& batch) {
  for (const auto& rec : batch) write_file_durably(dir_ / (rec.id + ".json"), rec.to_line());
}

journal_writer::journal_writer(record_store& store, std::function<void(const trial_record&)> on_durable,
                               std::function<void(std::exception_ptr)> on_error)
    : store_{store}, on_durable_{std::move(on_durable)}, on_error_{std::move(on_error)}, thread_{[this] { loop(); }} {}

journal_writer::~journal_writer() { close(); }

void journal_writer::push(trial_record record) {
  std::lock_guard lock(mutex_);
  unwritten_.push_back(std::move(record));
  cv_.notify_one();
}

void journal_writer::close() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard lock(mutex_);
    done_ = true;
    cv_.notify_one();
  }
  thread_.join();
}

void journal_writer::loop() {
  std::unique_lock lk(mutex_);
  for (;;) {
    cv_.wait(lk, [&] { return !unwritten_.empty() || done_; });
    if (unwritten_.empty()) return;
    std::vector<trial_record> batch = std::move(unwritten_);
    unwritten_.clear();
    lk.unlock();
    if (!error_) {  // after a failed write nothing more is written: those trials rerun
      try {
        store_.write(batch);
      } catch (...) {
        error_ = std::current_exception();
      }
      if (error_) on_error_(error_);
      else
        for (const auto& rec : batch) on_durable_(rec);
    }
    lk.lock();
  }
}

}  // namespace isorun::sweep
