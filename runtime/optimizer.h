// optimizer.h — AdamW over a flat parameter buffer, the learning-rate schedule and gradient
// clipping.
//
// AdamW (Loshchilov & Hutter): decoupled weight decay, bias-corrected moments, fp32 state.
// Weight decay applies only to the ranges marked decay (weight matrices and embeddings, not
// biases or LayerNorm parameters), as Megatron-LM and nanoGPT do. Clipping scales gradients by
// min(1, max_norm / (norm + 1e-6)), the formula of Megatron-LM and torch.nn.utils.
//
// Thread-safety: one optimizer per rank, driven from the training thread.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/backend.h"
#include "runtime/config.h"

namespace strata {

// Learning rate at 1-based iteration `it`: linear warmup to lr over warmup_iters, then
// cosine/linear decay to min_lr at decay_iters (default: total iterations), min_lr after.
double learning_rate(const OptimizerConfig& o, int total_iterations, int it);

// A contiguous range [offset, offset + numel) of the flat buffers sharing one decay setting.
struct ParamRange {
  int64_t offset = 0;
  int64_t numel = 0;
  bool decay = false;
};

class AdamW {
 public:
  // ranges cover the flat buffers of `numel` elements; state is allocated as optimizer memory.
  AdamW(Backend& backend, const OptimizerConfig& cfg, std::vector<ParamRange> ranges,
        int64_t numel);
  AdamW(const AdamW&) = delete;
  AdamW& operator=(const AdamW&) = delete;

  // One update at learning rate lr; increments the step count.
  void step(Tensor& params, const Tensor& grads, double lr);
  int steps_taken() const { return step_; }

  Tensor& m() { return m_; }  // (numel) first moment
  Tensor& v() { return v_; }  // (numel) second moment

 private:
  Backend& be_;
  OptimizerConfig cfg_;
  std::vector<ParamRange> ranges_;
  Tensor m_, v_;
  int step_ = 0;
};

// The clipping coefficient for a global gradient norm: min(1, max_norm / (norm + 1e-6));
// 1 when max_norm is 0 (clipping off).
double clip_coefficient(double norm, double max_norm);

}  // namespace strata
