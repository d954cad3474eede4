#include "isorun/runner/gpu_packer.hpp"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

namespace isorun::runner {

gpu_packer::gpu_packer(const std::vector<slot>& slots, const std::map<int, std::uint64_t>& memory) {
  for (const auto& s : slots) {
    if (s.gpus.size() != 1) continue;
    const gpu_info& g = s.gpus.front();
    auto at = std::find_if(gpus_.begin(), gpus_.end(), [&](const gpu_info& known) { return known.index == g.index; });
    if (at == gpus_.end()) {
      gpus_.push_back(g);
      free_.push_back(1);
      const auto bytes = memory.find(g.index);
      memory_.push_back(bytes == memory.end() ? std::nullopt : std::optional<std::uint64_t>(bytes->second));
    } else {
      ++free_[static_cast<std::size_t>(at - gpus_.begin())];
    }
  }
  free_memory_ = memory_;
}

bool gpu_packer::could_hold(std::size_t g, std::uint64_t bytes) const { return !memory_[g] || *memory_[g] >= bytes; }

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
      if (!reserved[g] && free_[g] > 0 && (!free_memory_[g] || *free_memory_[g] >= t.bytes)) usable.push_back(g);
    if (usable.size() >= t.k) {
      usable.resize(t.k);
      for (std::size_t g : usable) {
        --free_[g];
        if (free_memory_[g]) *free_memory_[g] -= t.bytes;
      }
      std::sort(usable.begin(), usable.end(),
                [&](std::size_t a, std::size_t b) { return gpus_[a].index < gpus_[b].index; });
      t.granted = std::move(usable);
      it = waiting_.erase(it);
      continue;
    }
    // Not yet: the k GPUs it is nearest to (of those that could ever hold its bytes) are held
    // for it. Every such GPU with a free place is among them (fewer than k have one), so none of
    // those places goes to a later request, and a held GPU only drains until the job fits.
    std::size_t held = 0;
    for (std::size_t g : order)
      if (held < t.k && !reserved[g] && could_hold(g, t.bytes)) {
        reserved[g] = 1;
        ++held;
      }
    ++it;
  }
  changed_.notify_all();
}

std::optional<std::vector<gpu_info>> gpu_packer::acquire(std::size_t k, std::uint64_t bytes) {
  std::size_t could = 0;
  for (std::size_t g = 0; g < gpus_.size(); ++g) could += could_hold(g, bytes);
  if (k == 0 || k > could)
    throw std::invalid_argument(
        "a job asks for " + std::to_string(k) + " GPUs" +
        (could < gpus_.size() ? " with " + std::to_string(bytes) + " bytes each" : std::string()) + "; there are " +
        std::to_string(could));
  std::unique_lock lock(mutex_);
  if (closed_) return std::nullopt;
  ticket t{.k = k, .bytes = bytes, .granted = {}};
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

void gpu_packer::release(const std::vector<gpu_info>& taken, std::uint64_t bytes) {
  std::lock_guard lock(mutex_);
  for (const auto& g : taken)
    for (std::size_t i = 0; i < gpus_.size(); ++i)
      if (gpus_[i].index == g.index) {
        ++free_[i];
        if (free_memory_[i]) *free_memory_[i] += bytes;
      }
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
