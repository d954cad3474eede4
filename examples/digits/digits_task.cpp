// A real task: train a classifier on the UCI handwritten digits (1797 8x8 images, shipped in
// examples/data/digits.csv.gz) and report held-out accuracy. Softmax regression or a
// one-hidden-layer MLP (ReLU), minibatch SGD with L2 weight decay, a fixed 80/20 split.
//   isorun --cpu digits model=mlp lr=0.1 hidden=64 epochs=30
//
// Where the memory lives, as in any GPU program: host data (the dataset, the batches, the host
// path's working copy of the model) in ordinary host memory; the model's parameters on the
// worker's device, in buffers from its capped allocator, so --mem-limit applies to them and the
// result reports the peak. On a real GPU (device_kind::cuda) the model trains there with CUDA
// kernels; elsewhere (a CPU worker, or a simulated GPU whose memory the host cannot touch) it
// trains on the host and checkpoints its parameters to the device after every epoch, and the
// final scores are computed from the device copy.
#include <dlfcn.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "isorun/alloc/device_buffer.hpp"
#include "isorun/isorun.hpp"

#ifdef ISORUN_DIGITS_CUDA
#include "digits_cuda.hpp"
#endif

namespace {

struct digits_params {
  std::string model = "mlp";  // mlp | softmax
  double lr = 0.1;
  int hidden = 64;
  int epochs = 30;
  double weight_decay = 1e-4;
  int batch = 32;
  int seed = 0;
  std::string data;  // path to digits.csv.gz; empty = the copy shipped with isorun

  template <class A>
  void serialize(A& ar) {
    ar(CEREAL_NVP(model), CEREAL_NVP(lr), CEREAL_NVP(hidden), CEREAL_NVP(epochs), CEREAL_NVP(weight_decay),
       CEREAL_NVP(batch), CEREAL_NVP(seed), CEREAL_NVP(data));
  }
};

struct digits_result {
  double accuracy = 0;
  double test_loss = 0;
  double train_loss = 0;
  int train_size = 0;
  int test_size = 0;
  std::string device;
  double seconds = 0;

  template <class A>
  void serialize(A& ar) {
    ar(CEREAL_NVP(accuracy), CEREAL_NVP(test_loss), CEREAL_NVP(train_loss), CEREAL_NVP(train_size),
       CEREAL_NVP(test_size), CEREAL_NVP(device), CEREAL_NVP(seconds));
  }
};

using fvec = std::vector<float>;
using isorun::alloc::device_buffer;
constexpr int features = 64, classes = 10;

std::string default_data_path() {
  if (const char* env = std::getenv("ISORUN_DIGITS_CSV")) return env;
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&default_data_path), &info) && info.dli_fname) {
    // <libdir>/isorun/tasks/digits.so -> <datadir>/isorun/digits.csv.gz, as installed
    auto p = std::filesystem::path(info.dli_fname).parent_path() / ISORUN_DIGITS_DATA_FROM_TASKS / "digits.csv.gz";
    if (std::filesystem::exists(p)) return p.lexically_normal().string();
  }
  return ISORUN_DIGITS_SOURCE;  // the source tree's copy
}

struct dataset {
  std::vector<float> x;  // n x 64, scaled to [0, 1]
  std::vector<int> y;
  int n = 0;
};

dataset load(const std::string& path) {
  gzFile f = ::gzopen(path.c_str(), "rb");
  if (!f) throw std::runtime_error("cannot open digits data " + path);
  dataset d;
  char line[1024];
  while (::gzgets(f, line, sizeof line)) {
    std::vector<float> row;
    char* p = line;
    for (int i = 0; i <= features; ++i) {
      char* end = nullptr;
      double v = std::strtod(p, &end);
      if (end == p) throw std::runtime_error("malformed row " + std::to_string(d.n + 1) + " in " + path);
      row.push_back(static_cast<float>(v));
      p = *end == ',' ? end + 1 : end;
    }
    for (int i = 0; i < features; ++i) d.x.push_back(row[i] / 16.0f);
    d.y.push_back(static_cast<int>(row[features]));
    ++d.n;
  }
  ::gzclose(f);
  if (d.n == 0) throw std::runtime_error("no rows in " + path);
  return d;
}

// y = x W + b for a batch; W is in x out, row-major.
void affine(const float* x, int rows, int in, const fvec& w, const fvec& b, int out, float* y) {
  for (int r = 0; r < rows; ++r) {
    float* yr = y + r * out;
    for (int o = 0; o < out; ++o) yr[o] = b[o];
    const float* xr = x + r * in;
    for (int i = 0; i < in; ++i) {
      const float xi = xr[i];
      if (xi == 0.0f) continue;
      const float* wi = &w[static_cast<std::size_t>(i) * out];
      for (int o = 0; o < out; ++o) yr[o] += xi * wi[o];
    }
  }
}

// Softmax in place; returns summed cross-entropy against labels and turns `p` into dL/dlogits.
double softmax_xent(float* p, int rows, const int* labels, bool gradient) {
  double loss = 0;
  for (int r = 0; r < rows; ++r) {
    float* pr = p + r * classes;
    const float m = *std::max_element(pr, pr + classes);
    float sum = 0;
    for (int c = 0; c < classes; ++c) sum += pr[c] = std::exp(pr[c] - m);
    for (int c = 0; c < classes; ++c) pr[c] /= sum;
    loss -= std::log(std::max(pr[labels[r]], 1e-12f));
    if (gradient) pr[labels[r]] -= 1.0f;
  }
  return loss;
}

struct model {
  bool mlp;
  int hidden;
  fvec w1, b1, w2, b2;  // mlp: 64->h->10; softmax: w2/b2 only (64->10)

  model(bool use_mlp, int h, std::mt19937& rng) : mlp{use_mlp}, hidden{h} {
    auto init = [&](fvec& w, int in, int out) {
      std::normal_distribution<float> n(0.0f, std::sqrt(2.0f / static_cast<float>(in)));
      w.resize(static_cast<std::size_t>(in) * out);
      for (auto& v : w) v = n(rng);
    };
    if (mlp) {
      init(w1, features, hidden);
      b1.assign(hidden, 0.0f);
      init(w2, hidden, classes);
    } else {
      init(w2, features, classes);
    }
    b2.assign(classes, 0.0f);
  }

  int in2() const { return mlp ? hidden : features; }

  // Forward for a batch; fills h (post-ReLU) and logits.
  void forward(const float* x, int rows, std::vector<float>& h, std::vector<float>& logits) const {
    logits.resize(static_cast<std::size_t>(rows) * classes);
    if (mlp) {
      h.resize(static_cast<std::size_t>(rows) * hidden);
      affine(x, rows, features, w1, b1, hidden, h.data());
      for (auto& v : h) v = std::max(v, 0.0f);
      affine(h.data(), rows, hidden, w2, b2, classes, logits.data());
    } else {
      affine(x, rows, features, w2, b2, classes, logits.data());
    }
  }

  void sgd_step(const float* x, const int* y, int rows, float lr, float wd, std::vector<float>& h,
                std::vector<float>& logits) {
    forward(x, rows, h, logits);
    softmax_xent(logits.data(), rows, y, true);
    const float scale = 1.0f / static_cast<float>(rows);
    const float* a = mlp ? h.data() : x;
    const int in = in2();
    std::vector<float> dh;
    if (mlp) dh.assign(static_cast<std::size_t>(rows) * hidden, 0.0f);
    for (int r = 0; r < rows; ++r) {
      const float* g = &logits[static_cast<std::size_t>(r) * classes];
      if (mlp)
        for (int i = 0; i < hidden; ++i) {
          if (h[static_cast<std::size_t>(r) * hidden + i] <= 0.0f) continue;
          float s = 0;
          for (int c = 0; c < classes; ++c) s += w2[static_cast<std::size_t>(i) * classes + c] * g[c];
          dh[static_cast<std::size_t>(r) * hidden + i] = s;
        }
    }
    auto update = [&](fvec& w, fvec& b, const float* input, int n_in, const float* grad, int n_out) {
      for (auto& v : w) v *= 1.0f - lr * wd;
      for (int r = 0; r < rows; ++r) {
        const float* gr = grad + static_cast<std::size_t>(r) * n_out;
        const float* ir = input + static_cast<std::size_t>(r) * n_in;
        for (int i = 0; i < n_in; ++i) {
          const float xi = ir[i] * lr * scale;
          if (xi == 0.0f) continue;
          float* wi = &w[static_cast<std::size_t>(i) * n_out];
          for (int o = 0; o < n_out; ++o) wi[o] -= xi * gr[o];
        }
        for (int o = 0; o < n_out; ++o) b[o] -= lr * scale * gr[o];
      }
    };
    update(w2, b2, a, in, logits.data(), classes);
    if (mlp) update(w1, b1, x, features, dh.data(), hidden);
  }
};

// The model's parameters on the worker's device, in buffers from its capped allocator. Host
// code never touches them directly: it copies in and out, as it would with a GPU.
struct device_model {
  device_buffer w1, b1, w2, b2;

  device_model(const model& m, isorun::alloc::caching_allocator& a) {
    auto put = [&](device_buffer& d, const fvec& host) {
      if (!host.empty()) d = device_buffer::from_host(a, host.data(), host.size() * sizeof(float));
    };
    put(w1, m.w1);
    put(b1, m.b1);
    put(w2, m.w2);
    put(b2, m.b2);
  }

  void store(const model& m) {
    for (auto [d, host] : {std::pair{&w1, &m.w1}, {&b1, &m.b1}, {&w2, &m.w2}, {&b2, &m.b2}})
      if (!host->empty()) d->copy_from_host(host->data(), host->size() * sizeof(float));
  }

  void load(model& m) const {
    for (auto [d, host] : {std::pair{&w1, &m.w1}, {&b1, &m.b1}, {&w2, &m.w2}, {&b2, &m.b2}})
      if (!host->empty()) d->copy_to_host(host->data(), host->size() * sizeof(float));
  }
};

digits_result digits(const digits_params& p) {
  const auto t0 = std::chrono::steady_clock::now();
  if (p.model != "mlp" && p.model != "softmax")
    throw std::invalid_argument("model must be mlp or softmax, not " + p.model);
  if (p.lr <= 0 || p.epochs < 1 || p.batch < 1 || p.hidden < 1)
    throw std::invalid_argument("lr, epochs, batch and hidden must be positive");
  const dataset d = load(p.data.empty() ? default_data_path() : p.data);

  // The split is fixed (its own seed), so trials differ only by their parameters.
  std::vector<int> order(d.n);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(1234));
  const int n_test = d.n / 5, n_train = d.n - n_test;
  auto gather = [&](int from, int count, std::vector<float>& x, std::vector<int>& y) {
    for (int i = from; i < from + count; ++i) {
      x.insert(x.end(), d.x.begin() + order[i] * features, d.x.begin() + (order[i] + 1) * features);
      y.push_back(d.y[order[i]]);
    }
  };
  std::vector<float> xtr, xte;
  std::vector<int> ytr, yte;
  gather(0, n_train, xtr, ytr);
  gather(n_train, n_test, xte, yte);

  std::mt19937 rng(static_cast<unsigned>(p.seed));
  model m(p.model == "mlp", p.hidden, rng);
  auto& worker = isorun::this_worker();
  device_model on_device(m, worker.allocator());
  digits_result r;
  auto score = [&](std::vector<float>& logits, const std::vector<int>& y, int n, double& loss) {
    int correct = 0;
    for (int i = 0; i < n; ++i) {
      const float* l = &logits[static_cast<std::size_t>(i) * classes];
      correct += static_cast<int>(std::max_element(l, l + classes) - l) == y[i];
    }
    loss = softmax_xent(logits.data(), n, y.data(), false) / n;
    return static_cast<double>(correct) / n;
  };
  std::vector<float> train_logits, test_logits;
#ifdef ISORUN_DIGITS_CUDA
  if (worker.kind() == isorun::device_kind::cuda) {
    digits_gpu::problem gp{&xtr,
                           &ytr,
                           &xte,
                           &yte,
                           m.mlp,
                           p.hidden,
                           static_cast<float>(p.lr),
                           static_cast<float>(p.weight_decay),
                           p.epochs,
                           p.batch,
                           &rng,
                           &worker.allocator(),
                           on_device.w1.as<float>(),
                           on_device.b1.as<float>(),
                           on_device.w2.as<float>(),
                           on_device.b2.as<float>()};
    digits_gpu::train(gp, train_logits, test_logits);
  } else
#endif
  {
    std::vector<int> idx(n_train);
    std::iota(idx.begin(), idx.end(), 0);
    std::vector<float> bx, h, logits;
    std::vector<int> by;
    for (int e = 0; e < p.epochs; ++e) {
      std::shuffle(idx.begin(), idx.end(), rng);
      for (int s = 0; s < n_train; s += p.batch) {
        const int rows = std::min(p.batch, n_train - s);
        bx.clear();
        by.clear();
        for (int k = 0; k < rows; ++k) {
          const int j = idx[s + k];
          bx.insert(bx.end(), xtr.begin() + j * features, xtr.begin() + (j + 1) * features);
          by.push_back(ytr[j]);
        }
        m.sgd_step(bx.data(), by.data(), rows, static_cast<float>(p.lr), static_cast<float>(p.weight_decay), h, logits);
      }
      on_device.store(m);  // checkpoint
    }
    model trained = m;
    on_device.load(trained);  // scores come from the device copy
    trained.forward(xtr.data(), n_train, h, train_logits);
    trained.forward(xte.data(), n_test, h, test_logits);
  }
  score(train_logits, ytr, n_train, r.train_loss);
  r.accuracy = score(test_logits, yte, n_test, r.test_loss);
  r.device = worker.kind() == isorun::device_kind::cpu
                 ? "cpu"
                 : std::string(to_string(worker.kind())) + ":" + worker.device_uuid();
  r.train_size = n_train;
  r.test_size = n_test;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace

ISORUN_TASK(digits);
