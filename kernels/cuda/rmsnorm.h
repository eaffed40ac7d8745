// rmsnorm.h — CUDA RMSNorm, over the last dimension and over each query and key head of the
// attention's q/k/v (Qwen3's q_norm and k_norm): pure functions on raw device buffers + shapes,
// launched on the caller's stream.
//
// Semantics are those of kernels/cpu/rmsnorm.h (the reference beside them) and
// runtime/backend/backend.h: out = x · rstd · w with rstd = 1/√(mean(x²) + eps) over each row (or
// head); rmsnorm_backward ACCUMULATES (+=) into dinp (the residual stream's gradient) and dweight,
// as layernorm_backward does; qk_rmsnorm_backward accumulates into its weight gradients and
// ASSIGNS its input gradient, in place over the incoming one.
// Activations (inp, out, dinp, dout, qkv, dqkv, x) and the weights are f32 or bf16 as their
// ElemType says; rstd and the weight gradients are always f32. Every kernel computes in f32 and
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

// RMSNorm over the last dimension. inp, out (N, C) of type act; weight (C) of type w_type;
// rstd (N).
cudaError_t rmsnorm_forward(void* out, float* rstd, const void* inp, ElemType act,
                            const void* weight, ElemType w_type, float eps, int64_t N, int C,
                            cudaStream_t stream);
// dinp (N, C) +=, dweight (C) +=. dinp, dout, inp of type act; weight of w_type; rstd (N) the
// forward's.
cudaError_t rmsnorm_backward(void* dinp, float* dweight, const void* dout, const void* inp,
                             ElemType act, const void* weight, ElemType w_type, const float* rstd,
                             int64_t N, int C, cudaStream_t stream);

// Per-head RMSNorm, in place on qkv (N, NH + 2·KVH, HS) of type act, N positions in the attention
// layout (per position NH query heads, then KVH key heads, then KVH value heads): each query head
// normalised with q_weight (HS), each key head with k_weight (HS), both of type w_type; the value
// heads are left untouched. rstd (N, NH + KVH): per position its query heads' then its key heads'.
// Negative sizes or KVH < 1 return cudaErrorInvalidValue before launching anything.
cudaError_t qk_rmsnorm_forward(void* qkv, ElemType act, float* rstd, const void* q_weight,
                               const void* k_weight, ElemType w_type, float eps, int64_t N, int NH,
                               int KVH, int HS, cudaStream_t stream);
// Its backward, in place on dqkv (N, NH + 2·KVH, HS) of type act: the gradient of the normalised
// q/k/v on entry, that of the pre-norm x (same layout and type; value heads not read) in its query
// and key heads on return; value heads untouched. dq_weight, dk_weight (HS) +=. rstd the
// forward's. The weight gradients are summed (in a kernel of their own, on the stream) before the
// incoming gradient is overwritten.
cudaError_t qk_rmsnorm_backward(void* dqkv, float* dq_weight, float* dk_weight, const void* x,
                                ElemType act, const void* q_weight, const void* k_weight,
                                ElemType w_type, const float* rstd, int64_t N, int NH, int KVH,
                                int HS, cudaStream_t stream);

}  // namespace strata::kernels::cuda
