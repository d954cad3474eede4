#include <cuda_runtime.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>

#include "digits_cuda.hpp"
#include "isorun/alloc/device_buffer.hpp"

namespace digits_gpu {
namespace {

constexpr int features = 64, classes = 10;

void check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(rc));
}

__global__ void affine(const float* x, int rows, int in, const float* w, const float* b, int out, float* y, bool relu) {
  const int r = blockIdx.x, o = threadIdx.x;
  if (r >= rows || o >= out) return;
  float s = b[o];
  for (int i = 0; i < in; ++i) s += x[r * in + i] * w[i * out + o];
  y[r * out + o] = relu ? fmaxf(s, 0.0f) : s;
}

// Softmax cross-entropy gradient (dL/dlogits, unscaled), in place.
__global__ void softmax_grad(float* p, int rows, const int* labels) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  float* pr = p + r * classes;
  float m = pr[0];
  for (int c = 1; c < classes; ++c) m = fmaxf(m, pr[c]);
  float sum = 0;
  for (int c = 0; c < classes; ++c) sum += pr[c] = expf(pr[c] - m);
  for (int c = 0; c < classes; ++c) pr[c] /= sum;
  pr[labels[r]] -= 1.0f;
}

__global__ void hidden_grad(const float* h, const float* w2, const float* g, int rows, int hidden, float* dh) {
  const int r = blockIdx.x, i = threadIdx.x;
  if (r >= rows || i >= hidden) return;
  float s = 0;
  if (h[r * hidden + i] > 0.0f)
    for (int c = 0; c < classes; ++c) s += w2[i * classes + c] * g[r * classes + c];
  dh[r * hidden + i] = s;
}

__global__ void update(float* w, float* b, const float* input, int in, const float* grad, int out, int rows, float lr,
                       float wd, float scale) {
  const int i = blockIdx.x, o = threadIdx.x;
  if (i >= in || o >= out) return;
  float acc = 0;
  for (int r = 0; r < rows; ++r) acc += input[r * in + i] * grad[r * out + o];
  w[i * out + o] = w[i * out + o] * (1.0f - lr * wd) - lr * scale * acc;
  if (i == 0) {
    float gb = 0;
    for (int r = 0; r < rows; ++r) gb += grad[r * out + o];
    b[o] -= lr * scale * gb;
  }
}

}  // namespace

void train(const problem& p, std::vector<float>& train_logits, std::vector<float>& test_logits) {
  using isorun::alloc::device_buffer;
  const int n_train = static_cast<int>(p.y_train->size()), n_test = static_cast<int>(p.y_test->size());
  const int in2 = p.mlp ? p.hidden : features;
  if (p.mlp && p.hidden > 1024) throw std::runtime_error("the GPU path supports hidden <= 1024");
  auto& a = *p.allocator;
  const std::size_t most = static_cast<std::size_t>(std::max(p.batch, std::max(n_train, n_test)));
  const std::size_t width = static_cast<std::size_t>(std::max(p.hidden, 1));
  device_buffer bx(a, most * features * sizeof(float));
  device_buffer h(a, most * width * sizeof(float));
  device_buffer dh(a, static_cast<std::size_t>(p.batch) * width * sizeof(float));
  device_buffer logits(a, most * classes * sizeof(float));
  device_buffer labels(a, static_cast<std::size_t>(p.batch) * sizeof(int));
  float* w1 = p.w1;
  float* b1 = p.b1;
  float* w2 = p.w2;
  float* b2 = p.b2;

  std::mt19937& rng = *p.rng;
  std::vector<int> idx(n_train);
  std::iota(idx.begin(), idx.end(), 0);
  std::vector<float> hx;
  std::vector<int> hy;
  for (int e = 0; e < p.epochs; ++e) {
    std::shuffle(idx.begin(), idx.end(), rng);
    for (int s = 0; s < n_train; s += p.batch) {
      const int rows = std::min(p.batch, n_train - s);
      hx.clear();
      hy.clear();
      for (int r = 0; r < rows; ++r) {
        const int k = idx[s + r];
        hx.insert(hx.end(), p.x_train->begin() + k * features, p.x_train->begin() + (k + 1) * features);
        hy.push_back((*p.y_train)[k]);
      }
      bx.copy_from_host(hx.data(), hx.size() * sizeof(float));
      labels.copy_from_host(hy.data(), hy.size() * sizeof(int));
      const float* in = bx.as<float>();
      if (p.mlp) {
        affine<<<rows, p.hidden>>>(bx.as<float>(), rows, features, w1, b1, p.hidden, h.as<float>(), true);
        in = h.as<float>();
      }
      affine<<<rows, classes>>>(in, rows, in2, w2, b2, classes, logits.as<float>(), false);
      softmax_grad<<<(rows + 127) / 128, 128>>>(logits.as<float>(), rows, labels.as<int>());
      const float scale = 1.0f / static_cast<float>(rows);
      if (p.mlp) hidden_grad<<<rows, p.hidden>>>(h.as<float>(), w2, logits.as<float>(), rows, p.hidden, dh.as<float>());
      update<<<in2, classes>>>(w2, b2, in, in2, logits.as<float>(), classes, rows, p.lr, p.weight_decay, scale);
      if (p.mlp)
        update<<<features, p.hidden>>>(w1, b1, bx.as<float>(), features, dh.as<float>(), p.hidden, rows, p.lr,
                                       p.weight_decay, scale);
      check(cudaGetLastError(), "training kernels");
    }
  }
  auto infer = [&](const std::vector<float>& x, int n, std::vector<float>& out) {
    bx.copy_from_host(x.data(), x.size() * sizeof(float));
    const float* in = bx.as<float>();
    if (p.mlp) {
      affine<<<n, p.hidden>>>(bx.as<float>(), n, features, w1, b1, p.hidden, h.as<float>(), true);
      in = h.as<float>();
    }
    affine<<<n, classes>>>(in, n, in2, w2, b2, classes, logits.as<float>(), false);
    check(cudaGetLastError(), "inference kernels");
    out.resize(static_cast<std::size_t>(n) * classes);
    logits.copy_to_host(out.data(), out.size() * sizeof(float));
  };
  infer(*p.x_train, n_train, train_logits);
  infer(*p.x_test, n_test, test_logits);
}

}  // namespace digits_gpu
