// cross_entropy.h — CUDA vocab-parallel cross-entropy: pure functions on raw device buffers
// + shapes, launched on the caller's stream.
//
// Semantics are those of kernels/cpu/cross_entropy.h (the reference beside them): row-major
// buffers, ce_backward ASSIGNS dlogits. logits and dlogits are f32 or bf16 as their ElemType
// says; row statistics, target logits and losses are always f32. Every kernel computes in f32 and
// rounds to nearest even where it stores bf16.
//
// Each function returns the launch's cudaError_t (cudaGetLastError after the launch) for the
// caller to check; zero-sized calls launch nothing and return cudaSuccess.
//
// Thread-safety: functions touch only their arguments; the usual stream-ordering rules apply.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/elem_type.h"

namespace strata::kernels::cuda {

// The vocab-parallel cross-entropy steps of kernels/cpu/cross_entropy.h. logits (N, ld) of type
// logits_type, `valid` real columns; row stats (N) f32. weights (N) f32, optional (null: every
// row weighs 1), is the loss mask of ce_losses and ce_backward: row n's loss is w_n · loss_n and
// its dlogits row w_n · scale · (softmax − onehot), exactly 0 in both where w_n == 0 whatever
// the row's logits (NaN and inf included). Each row's kernel reads its one weight; a null
// `weights` runs the unweighted arithmetic unchanged.
// ce_row_stats: the shard's row max and Σ exp(logit − max) in one pass over the logits (an
// online max and sum); ce_rescale_sumexp: row_sumexp *= exp(local_max − row_max).
cudaError_t ce_row_stats(float* row_max, float* row_sumexp, const void* logits,
                         ElemType logits_type, int64_t N, int ld, int valid, cudaStream_t stream);
cudaError_t ce_rescale_sumexp(float* row_sumexp, const float* local_max, const float* row_max,
                              int64_t N, cudaStream_t stream);
cudaError_t ce_target_logit(float* target_logit, const void* logits, ElemType logits_type,
                            const int32_t* targets, int64_t N, int ld, int vocab_start, int valid,
                            cudaStream_t stream);
cudaError_t ce_losses(float* losses, const float* row_max, const float* row_sumexp,
                      const float* target_logit, const float* weights, int64_t N,
                      cudaStream_t stream);
// dlogits (N, ld) = w · scale · (softmax − onehot), 0 on padding columns. dlogits may be the
// logits buffer itself (same type): every element is read and then written by one thread.
cudaError_t ce_backward(void* dlogits, ElemType dlogits_type, const void* logits,
                        ElemType logits_type, const float* row_max, const float* row_sumexp,
                        const int32_t* targets, const float* weights, float scale, int64_t N,
                        int ld, int vocab_start, int valid, cudaStream_t stream);

}  // namespace strata::kernels::cuda
