#pragma once
/// @file trial_source.hpp
/// Where a sweep's trials come from. The scheduler asks its source for the next trial whenever
/// a lane is free, and tells it every trial's final record; a resumed sweep first tells it every
/// record the journal holds, in journal order, so that a source that decides from results
/// (a model-based sampler, population-based training, Hyperband's brackets) is back where it
/// was. A trial's identity (its id, its parameters) is given when the source creates it and is
/// journaled with its record. Today's grid, zip and random draws are one `list_source`.

#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "isorun/sweep/journal.hpp"

namespace isorun::sweep {

/// A trial as its source creates it.
// NOLINTNEXTLINE(bugprone-exception-escape): its moves are std::string's and nlohmann::json's, which do not throw
struct new_trial {
  /// Unique in the sweep, and the same for the same trial in every run of it (a resumed run's
  /// source gives its trials the numbers it gave them before): the spec's own trials are their
  /// places in its list; a source's others come after them.
  std::size_t index = 0;
  std::string id;         ///< trial_id(subject, params)
  nlohmann::json params;  ///< the trial's parameters
  /// Where it came from, journaled with its record where not null (population-based
  /// training's lineage: {"parent", "replaces", "step", "generation"}).
  nlohmann::json origin = nullptr;
};

/// Called by the scheduler only, one call at a time, under its lock: a source needs no lock of
/// its own, and must not block. A source that makes its trials elsewhere (a searcher program,
/// on a thread of its own) says so with busy(), and calls the wake it was given once one is
/// ready.
class trial_source {
 public:
  virtual ~trial_source() = default;

  /// @brief The next trial to start, or nullopt: none now (more may come once a running trial
  ///        ends), or none ever again (exhausted()).
  virtual std::optional<new_trial> next() = 0;

  /// @brief Whether the source will give no more trials whatever it is told. With nothing
  ///        running and next() giving none, the sweep ends either way.
  [[nodiscard]] virtual bool exhausted() const = 0;

  /// @brief A trial's final record: its result, or how it failed, or that early stopping
  ///        pruned it; in a resumed sweep, every journaled record first, in journal order.
  virtual void tell(const trial_record& record) = 0;
  /// @brief Whether the source is still at work without being told anything more (a searcher
  ///        thinking, or still hearing a result): the sweep waits for it, even with nothing
  ///        running, unless it is stopping.
  [[nodiscard]] virtual bool busy() const { return false; }
  /// @brief What to call (from any thread, holding no lock of the source's) once the source has
  ///        a trial ready, is done being busy, or failed: the scheduler asks it again. Given once,
  ///        before the first next().
  virtual void on_ready(const std::function<void()>& /*wake*/) {}
};

/// The spec's trials still to run (grid, zip and random draws, expanded), in order: it gives
/// each once and learns nothing from results.
class list_source final : public trial_source {
 public:
  explicit list_source(std::vector<new_trial> trials) : trials_(trials.begin(), trials.end()) {}
  std::optional<new_trial> next() override {
    if (trials_.empty()) return std::nullopt;
    new_trial t = std::move(trials_.front());
    trials_.pop_front();
    return t;
  }
  [[nodiscard]] bool exhausted() const override { return trials_.empty(); }
  void tell(const trial_record& /*record*/) override {}
  [[nodiscard]] std::size_t size() const noexcept { return trials_.size(); }

 private:
  std::deque<new_trial> trials_;
};

}  // namespace isorun::sweep
