#include <cuda_runtime.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>

#include "digits_cuda.hpp"

namespace digits_gpu {
namespace {

constexpr int features = 64, classes = 10;

void check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(rc));
}

// Device memory from the worker's capped allocator.
struct buffer {
  isorun::alloc::caching_allocator& a;
  float* p = nullptr;
  std::size_t n = 0;
  buffer(isorun::alloc::caching_allocator& alloc, std::size_t count) : a{alloc}, n{count} {
    p = static_cast<float*>(a.allocate(count * sizeof(float)));
  }
  buffer(isorun::alloc::caching_allocator& alloc, const std::vector<float>& host) : buffer(alloc, host.size()) {
    check(cudaMemcpy(p, host.data(), n * sizeof(float), cudaMemcpyHostToDevice), "copy to device");
  }
  ~buffer() { a.deallocate(p); }
  buffer(const buffer&) = delete;
  buffer& operator=(const buffer&) = delete;
};

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
  const int n_train = static_cast<int>(p.y_train->size()), n_test = static_cast<int>(p.y_test->size());
  const int in2 = p.mlp ? p.hidden : features;
  auto& a = *p.allocator;
  buffer w1(a, p.mlp ? p.w1 : std::vector<float>(1)), b1(a, p.mlp ? p.b1 : std::vector<float>(1));
  buffer w2(a, p.w2), b2(a, p.b2);
  const std::size_t most = static_cast<std::size_t>(std::max(p.batch, std::max(n_train, n_test)));
  buffer bx(a, most * features);
  buffer h(a, most * static_cast<std::size_t>(std::max(p.hidden, 1)));
  buffer dh(a, static_cast<std::size_t>(p.batch) * static_cast<std::size_t>(std::max(p.hidden, 1)));
  buffer logits(a, most * classes);
  int* labels = nullptr;
  check(cudaMalloc(&labels, sizeof(int) * p.batch), "labels");  // tiny; outside the cap's bookkeeping

  std::mt19937& rng = *p.rng;
  if (p.mlp && p.hidden > 1024) throw std::runtime_error("the GPU path supports hidden <= 1024");
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
      check(cudaMemcpy(bx.p, hx.data(), hx.size() * sizeof(float), cudaMemcpyHostToDevice), "batch");
      check(cudaMemcpy(labels, hy.data(), hy.size() * sizeof(int), cudaMemcpyHostToDevice), "labels");
      const float* a = bx.p;
      if (p.mlp) {
        affine<<<rows, p.hidden>>>(bx.p, rows, features, w1.p, b1.p, p.hidden, h.p, true);
        a = h.p;
      }
      affine<<<rows, classes>>>(a, rows, in2, w2.p, b2.p, classes, logits.p, false);
      softmax_grad<<<(rows + 127) / 128, 128>>>(logits.p, rows, labels);
      const float scale = 1.0f / static_cast<float>(rows);
      if (p.mlp) hidden_grad<<<rows, p.hidden>>>(h.p, w2.p, logits.p, rows, p.hidden, dh.p);
      update<<<in2, classes>>>(w2.p, b2.p, a, in2, logits.p, classes, rows, p.lr, p.weight_decay, scale);
      if (p.mlp) update<<<features, p.hidden>>>(w1.p, b1.p, bx.p, features, dh.p, p.hidden, rows, p.lr, p.weight_decay, scale);
      check(cudaGetLastError(), "training kernels");
    }
  }
  auto infer = [&](const std::vector<float>& x, int n, std::vector<float>& out) {
    check(cudaMemcpy(bx.p, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice), "inputs");
    const float* a = bx.p;
    if (p.mlp) {
      affine<<<n, p.hidden>>>(bx.p, n, features, w1.p, b1.p, p.hidden, h.p, true);
      a = h.p;
    }
    affine<<<n, classes>>>(a, n, in2, w2.p, b2.p, classes, logits.p, false);
    out.resize(static_cast<std::size_t>(n) * classes);
    check(cudaMemcpy(out.data(), logits.p, out.size() * sizeof(float), cudaMemcpyDeviceToHost), "logits");
  };
  infer(*p.x_train, n_train, train_logits);
  infer(*p.x_test, n_test, test_logits);
  cudaFree(labels);
}

}  // namespace digits_gpu
