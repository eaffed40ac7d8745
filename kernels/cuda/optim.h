// optim.h — multi-tensor optimizer kernels: one launch over a list of segments (parameter
// tensors or ranges of them) instead of one launch per tensor, which for a model of a few
// hundred small tensors (biases, LayerNorm weights) is most of the optimizer step's time.
//
// Segments are passed by value inside the kernel's parameters, at most kMaxSegmentsPerLaunch per
// launch; longer lists are split into several launches by these functions. Each segment is cut
// into chunks of kChunk elements, one block per chunk.
//
// Thread-safety: none needed (no state); calls are ordered by their stream.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/elem_type.h"

namespace strata::kernels::cuda {

// One contiguous range of f32 parameters with its f32 gradient and AdamW moments (n each).
struct AdamWSegment {
  float* param = nullptr;
  const float* grad = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  int64_t n = 0;
  bool decay = true;  // apply weight decay (false for biases and LayerNorm parameters, say)
};

struct AdamWHyper {
  float lr = 0.f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.f;
  int step = 1;            // 1-based, for the bias corrections
  float grad_scale = 1.f;  // each gradient times this as it is read (the clipping coefficient)
};

// One AdamW step on every segment, as kernels/cpu adamw_update: decoupled weight decay
// (param -= lr·wd·param, only where decay), bias-corrected moments.
cudaError_t adamw_multi_tensor(const AdamWSegment* segments, int count, const AdamWHyper& hyper,
                               cudaStream_t stream);

// One range of f32 or bf16 values whose squares are summed (a gradient, for its norm).
struct SumSquaresSegment {
  const void* x = nullptr;
  ElemType type = ElemType::kF32;
  int64_t n = 0;
};

// *out += Σ over all segments of Σ x², accumulated in double (out is one device double).
cudaError_t sum_squares_multi_tensor(double* out, const SumSquaresSegment* segments, int count,
                                     cudaStream_t stream);

}  // namespace strata::kernels::cuda
