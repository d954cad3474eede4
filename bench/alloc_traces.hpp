#pragma once
// Allocation traces for the replay benchmark: a simple log format and generators.
//
// Format, one event per line:  a ID SIZE STREAM   (allocate)   |   f ID   (free)
#include <cstdint>
#include <istream>
#include <ostream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace isorun::bench {

struct trace_event {
  bool alloc;
  std::uint64_t id;
  std::uint64_t size;
  std::uint64_t stream;
};
using trace = std::vector<trace_event>;

inline void write_trace(std::ostream& out, const trace& t) {
  for (const auto& e : t) {
    if (e.alloc) out << "a " << e.id << " " << e.size << " " << e.stream << "\n";
    else out << "f " << e.id << "\n";
  }
}

/// @brief A trace written by write_trace (or by hand).
/// @throws std::runtime_error naming the line of the first thing wrong with it: an unknown
///         operation, a malformed or zero size, an id allocated twice or freed while not live.
inline trace read_trace(std::istream& in) {
  trace t;
  std::vector<bool> live;
  std::string line;
  for (std::size_t n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    std::istringstream fields(line);
    std::string op, rest;
    trace_event e{false, 0, 0, 0};
    auto fail = [&](const std::string& why) {
      throw std::runtime_error("trace line " + std::to_string(n) + " (\"" + line + "\"): " + why +
                               "; expected \"a ID SIZE STREAM\" or \"f ID\"");
    };
    fields >> op;
    if (op == "a") {
      e.alloc = true;
      if (!(fields >> e.id >> e.size >> e.stream) || (fields >> rest)) fail("malformed allocation");
      if (e.size == 0) fail("zero-byte allocation");
    } else if (op == "f") {
      if (!(fields >> e.id) || (fields >> rest)) fail("malformed free");
    } else {
      fail("unknown operation \"" + op + "\"");
    }
    if (e.id > (std::uint64_t{1} << 32)) fail("id out of range");
    if (e.id >= live.size()) live.resize(e.id + 1, false);
    if (e.alloc == live[e.id]) fail(e.alloc ? "id is already live" : "id is not live");
    live[e.id] = e.alloc;
    t.push_back(e);
  }
  return t;
}

/// Largest sum of live requested bytes over the trace.
inline std::uint64_t peak_requested(const trace& t) {
  std::vector<std::uint64_t> size;
  std::uint64_t live = 0, peak = 0;
  for (const auto& e : t) {
    if (e.id >= size.size()) size.resize(e.id + 1);
    if (e.alloc) {
      size[e.id] = e.size;
      live += e.size;
      peak = std::max(peak, live);
    } else {
      live -= size[e.id];
    }
  }
  return peak;
}

class trace_builder {
 public:
  std::uint64_t alloc(std::uint64_t bytes, std::uint64_t stream = 0) {
    t_.push_back({true, next_, bytes, stream});
    return next_++;
  }
  void free(std::uint64_t id) { t_.push_back({false, id, 0, 0}); }
  trace take() { return std::move(t_); }

 private:
  trace t_;
  std::uint64_t next_ = 0;
};

/// Random sizes (log-uniform from 512 B to max), random frees, at most 64 live; `ops` events.
inline trace random_trace(std::size_t ops, std::uint64_t max, std::uint32_t seed) {
  std::mt19937_64 rng(seed);
  trace_builder b;
  std::vector<std::uint64_t> live;
  std::uniform_real_distribution<double> logsize(9.0, std::log2(double(max)));
  for (std::size_t i = 0; i < ops; ++i) {
    if (live.empty() || (live.size() < 64 && rng() % 2)) {
      live.push_back(b.alloc(static_cast<std::uint64_t>(std::exp2(logsize(rng)))));
    } else {
      std::size_t k = rng() % live.size();
      b.free(live[k]);
      live[k] = live.back();
      live.pop_back();
    }
  }
  for (auto id : live) b.free(id);
  return b.take();
}

/// The same size allocated and freed over and over, with a few long-lived neighbours.
inline trace churn_trace(std::size_t ops, std::uint64_t size) {
  trace_builder b;
  std::vector<std::uint64_t> keep;
  for (int i = 0; i < 8; ++i) keep.push_back(b.alloc(size));
  for (std::size_t i = 0; i < ops / 2; ++i) b.free(b.alloc(size));
  for (auto id : keep) b.free(id);
  return b.take();
}

/// One forward/backward per batch size N, N+1, ... as when searching the largest batch: every
/// step's activations are a little larger than the last step's cached blocks.
inline trace ramp_trace(int steps, std::uint64_t per_sample) {
  trace_builder b;
  auto weights = b.alloc(256ull << 20);
  for (int n = 8; n < 8 + steps; ++n) {
    std::vector<std::uint64_t> acts;
    for (int layer = 0; layer < 24; ++layer) acts.push_back(b.alloc(per_sample * static_cast<std::uint64_t>(n)));
    for (auto it = acts.rbegin(); it != acts.rend(); ++it) {
      auto grad = b.alloc(per_sample * static_cast<std::uint64_t>(n));
      b.free(*it);
      b.free(grad);
    }
  }
  b.free(weights);
  return b.take();
}

/// One fp32 training step (Adam) of a GPT-2-small-sized transformer: 12 layers, d=768, 12 heads,
/// vocabulary 50257, batch 4 x 512 tokens. Parameters, gradients and Adam moments are tensors
/// of the real layer shapes; forward saves what backward needs, temporaries are freed at once.
inline trace gpt2_step() {
  trace_builder b;
  const std::uint64_t B = 4, T = 512, d = 768, h = 12, V = 50257, L = 12, f4 = 4;
  std::vector<std::uint64_t> param_sizes = {V * d * f4, T * d * f4};
  for (std::uint64_t l = 0; l < L; ++l)
    for (auto n : {d * 3 * d, 3 * d, d * d, d, d * 4 * d, 4 * d, 4 * d * d, d, d, d, d, d})
      param_sizes.push_back(n * f4);
  std::vector<std::uint64_t> params;
  for (auto s : param_sizes) params.push_back(b.alloc(s));
  const std::uint64_t act = B * T * d * f4, att = B * h * T * T * f4;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> saved;  // (id, size)
  auto keep = [&](std::uint64_t size) { saved.emplace_back(b.alloc(size), size); };
  keep(act);  // embeddings
  for (std::uint64_t l = 0; l < L; ++l) {
    keep(act);                // ln1
    keep(3 * act);            // qkv
    keep(att);                // scores
    keep(att);                // softmax
    auto tmp = b.alloc(act);  // attention output before projection
    keep(act);                // projection
    b.free(tmp);
    keep(act);      // residual + ln2
    keep(4 * act);  // fc
    keep(4 * act);  // gelu
    keep(act);      // fc projection
  }
  auto logits = b.alloc(B * T * V * f4);
  auto dlogits = b.alloc(B * T * V * f4);
  b.free(logits);
  std::vector<std::uint64_t> grads;
  for (auto s : param_sizes) grads.push_back(b.alloc(s));
  b.free(dlogits);
  for (auto it = saved.rbegin(); it != saved.rend(); ++it) {
    auto g = b.alloc(it->second);  // gradient of the activation
    b.free(it->first);
    b.free(g);
  }
  std::vector<std::uint64_t> moments;  // Adam: m and v, created on the first step
  for (auto s : param_sizes) {
    moments.push_back(b.alloc(s));
    moments.push_back(b.alloc(s));
  }
  for (auto id : grads) b.free(id);
  for (auto id : moments) b.free(id);
  for (auto id : params) b.free(id);
  return b.take();
}

/// One fp32 training step of a ResNet-50-sized CNN, batch 32 at 224x224: stem, 3-4-6-3
/// bottlenecks (64/128/256/512 -> x4 channels), per conv its output, its batch-norm output and a
/// 32 MiB convolution workspace allocated and freed around it; backward in reverse.
inline trace resnet50_step() {
  trace_builder b;
  const std::uint64_t N = 32, f4 = 4;
  std::vector<std::uint64_t> params, grads, param_sizes;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> saved;
  auto conv = [&](std::uint64_t cin, std::uint64_t cout, std::uint64_t k, std::uint64_t hw) {
    param_sizes.push_back(cin * cout * k * k * f4);
    params.push_back(b.alloc(param_sizes.back()));
    auto ws = b.alloc(32ull << 20);
    const std::uint64_t out = N * cout * hw * hw * f4;
    saved.emplace_back(b.alloc(out), out);  // conv output
    b.free(ws);
    saved.emplace_back(b.alloc(out), out);  // batch-norm output (ReLU in place)
  };
  auto input = b.alloc(N * 3 * 224 * 224 * f4);
  conv(3, 64, 7, 112);
  std::uint64_t cin = 64;
  const std::uint64_t widths[] = {64, 128, 256, 512}, blocks[] = {3, 4, 6, 3}, sizes[] = {56, 28, 14, 7};
  for (int s = 0; s < 4; ++s)
    for (std::uint64_t i = 0; i < blocks[s]; ++i) {
      const std::uint64_t w = widths[s], hw = sizes[s];
      conv(cin, w, 1, hw);
      conv(w, w, 3, hw);
      conv(w, 4 * w, 1, hw);
      if (i == 0) conv(cin, 4 * w, 1, hw);  // downsample branch
      cin = 4 * w;
    }
  param_sizes.push_back(2048 * 1000 * f4);
  params.push_back(b.alloc(param_sizes.back()));
  auto logits = b.alloc(N * 1000 * f4);
  for (auto s : param_sizes) grads.push_back(b.alloc(s));
  for (auto it = saved.rbegin(); it != saved.rend(); ++it) {
    auto ws = b.alloc(32ull << 20);
    auto g = b.alloc(it->second);
    b.free(ws);
    b.free(it->first);
    b.free(g);
  }
  b.free(logits);
  b.free(input);
  for (auto g : grads) b.free(g);
  for (auto p : params) b.free(p);
  return b.take();
}

}  // namespace isorun::bench
