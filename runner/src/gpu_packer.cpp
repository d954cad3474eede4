#include "isorun/runner/gpu_packer.hpp"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

namespace isorun::runner {

gpu_packer::gpu_packer(const std::vector<slot>& slots) {
  for (const auto& s : slots) {
    if (s.gpus.size() != 1) continue;
    const gpu_info& g = s.gpus.front();
    auto at = std::find_if(gpus_.begin(), gpus_.end(), [&](const gpu_info& known) { return known.index == g.index; });
    if (at == gpus_.end()) {
      gpus_.push_back(g);
      free_.push_back(1);
    } else {
      ++free_[static_cast<std::size_t>(at - gpus_.begin())];
    }
  }
}

void gpu_packer::schedule() {
  std::vector<char> reserved(gpus_.size(), 0);
  // GPUs by how soon they can serve: free places first, then the most free, then index order.
  std::vector<std::size_t> order(gpus_.size());
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    ticket& t = **it;
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return free_[a] > free_[b]; });
    std::vector<std::size_t> usable;
    for (std::size_t g : order)
      if (!reserved[g] && free_[g] > 0) usable.push_back(g);
    if (usable.size() >= t.k) {
      usable.resize(t.k);
      for (std::size_t g : usable) --free_[g];
      std::sort(usable.begin(), usable.end(), [&](std::size_t a, std::size_t b) { return gpus_[a].index < gpus_[b].index; });
      t.granted = std::move(usable);
      it = waiting_.erase(it);
      continue;
    }
    // Not yet: the k GPUs it is nearest to are held for it. Every GPU with a free place is among
    // them (fewer than k have one), so none of those places goes to a later request.
    std::size_t held = 0;
    for (std::size_t g : order)
      if (held < t.k && !reserved[g]) {
        reserved[g] = 1;
        ++held;
      }
    ++it;
  }
  changed_.notify_all();
}

std::optional<std::vector<gpu_info>> gpu_packer::acquire(std::size_t k) {
  if (k == 0 || k > gpus_.size())
    throw std::invalid_argument("a job asks for " + std::to_string(k) + " GPUs; there are " + std::to_string(gpus_.size()));
  std::unique_lock lock(mutex_);
  if (closed_) return std::nullopt;
  ticket t{.k = k, .granted = {}};
  waiting_.push_back(&t);
  schedule();
  changed_.wait(lock, [&] { return !t.granted.empty() || closed_; });
  if (t.granted.empty()) {
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), &t));
    schedule();  // (others may have been held back for it)
    return std::nullopt;
  }
  std::vector<gpu_info> out;
  for (std::size_t g : t.granted) out.push_back(gpus_[g]);
  return out;
}

void gpu_packer::release(const std::vector<gpu_info>& taken) {
  std::lock_guard lock(mutex_);
  for (const auto& g : taken)
    for (std::size_t i = 0; i < gpus_.size(); ++i)
      if (gpus_[i].index == g.index) ++free_[i];
  schedule();
}

std::size_t gpu_packer::waiting() {
  std::lock_guard lock(mutex_);
  return waiting_.size();
}

void gpu_packer::close() {
  std::lock_guard lock(mutex_);
  closed_ = true;
  changed_.notify_all();
}

}  // namespace isorun::runner
