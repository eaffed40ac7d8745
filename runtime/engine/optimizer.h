// optimizer.h — AdamW over segments of a flat parameter buffer, the learning-rate schedule and
// gradient clipping.
//
// AdamW (Loshchilov & Hutter): decoupled weight decay, bias-corrected moments, fp32 state.
// Weight decay applies only to segments marked decay (weight matrices and embeddings, not biases
// or LayerNorm parameters), as Megatron-LM and nanoGPT do. Clipping scales gradients by
// min(1, max_norm / (norm + 1e-6)), the formula of Megatron-LM and torch.nn.utils.
//
// The optimizer state is compact: it covers only the segments given, so with the distributed
// optimizer (ZeRO-1) each data-parallel rank keeps the state of its own shard only.
//
// Thread-safety: one optimizer per rank, driven from the training thread.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/backend/backend.h"
#include "runtime/base/config.h"

namespace strata {

// Learning rate at 1-based iteration `it`: linear warmup to lr over warmup_iters, then
// cosine/linear decay to min_lr at decay_iters (default: total iterations), min_lr after.
double learning_rate(const OptimizerConfig& o, int total_iterations, int it);

// A run of parameters updated together: params[param_offset, +numel) with the gradient and the
// optimizer state at [state_offset, +numel) of the compact gradient buffer and state.
struct OptSegment {
  int64_t param_offset = 0;
  int64_t state_offset = 0;
  int64_t numel = 0;
  bool decay = false;
};

class AdamW {
 public:
  // State for Σ numel of `segments` (allocated as optimizer memory, zeroed).
  AdamW(Backend& backend, const OptimizerConfig& cfg, std::vector<OptSegment> segments);
  AdamW(const AdamW&) = delete;
  AdamW& operator=(const AdamW&) = delete;

  // One update at learning rate lr; grads is the compact gradient buffer (state layout), read
  // times grad_scale (the clipping coefficient) and left unchanged.
  void step(Tensor& params, const Tensor& grads, double lr, double grad_scale = 1.0);
  int steps_taken() const { return step_; }
  // Resuming from a checkpoint: the bias corrections continue from the saved step count.
  void set_steps_taken(int n) { step_ = n; }

  Tensor& m() { return m_; }  // first moment, state layout
  Tensor& v() { return v_; }  // second moment, state layout

 private:
  Backend& be_;
  OptimizerConfig cfg_;
  std::vector<OptSegment> segments_;
  Tensor m_, v_;
  int step_ = 0;
};

// The clipping coefficient for a global gradient norm: min(1, max_norm / (norm + 1e-6));
// 1 when max_norm is 0 (clipping off).
double clip_coefficient(double norm, double max_norm);

}  // namespace strata
