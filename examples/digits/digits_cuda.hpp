#pragma once
// The digits classifier's GPU path: the same model, batches and update rule as the host path,
// with CUDA kernels; all device memory comes from the worker's capped allocator.
#include <random>
#include <string>
#include <vector>

#include "isorun/alloc/caching_allocator.hpp"

namespace digits_gpu {

struct problem {
  const std::vector<float>* x_train;  // n x 64
  const std::vector<int>* y_train;
  const std::vector<float>* x_test;
  const std::vector<int>* y_test;
  bool mlp;
  int hidden;
  float lr, weight_decay;
  int epochs, batch;
  std::mt19937* rng;                            // the CPU path's generator, after initialization: same batches
  isorun::alloc::caching_allocator* allocator;  // the worker's (CUDA backend), for scratch buffers
  // The model's parameters in device memory, initialized as on the host path; trained in place.
  // w1 and b1 are null for softmax regression.
  float *w1, *b1, *w2, *b2;
};

/// @brief Trains on the worker's GPU and returns the test logits (n_test x 10) and the train
///        logits (n_train x 10), for the caller to score with the host path's code.
/// @throws std::runtime_error on a CUDA error.
void train(const problem& p, std::vector<float>& train_logits, std::vector<float>& test_logits);

}  // namespace digits_gpu
