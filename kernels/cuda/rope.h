// rope.h — CUDA rotary position embeddings (RoPE): pure functions on raw device buffers + shapes,
// launched on the caller's stream.
//
// Semantics are those of kernels/cpu/rope.h (the reference beside them) and
// runtime/backend/backend.h: in place on the query and key heads of qkv (B, S, NH + 2·KVH, HS) (the
// first NH + KVH heads of each token; the KVH value heads are left as they are). Position s rotates
// each pair (x[i], x[i + HS/2]), i < HS/2 (Hugging Face's rotate_half) by the angle whose cosine
// and sine are cos_sin[s][i] and cos_sin[s][HS/2 + i]:
//   x[i] ← x[i]·cos − x[i+HS/2]·sin,   x[i+HS/2] ← x[i+HS/2]·cos + x[i]·sin.
// rope_backward applies the inverse rotation (the transpose) to the gradient dqkv, in place.
// qkv is f32 or bf16 as t says; cos_sin (S_max ≥ S, HS) is f32. Computed in f32, each element
// rounded once where it is stored back.
//
// HS must be even: an odd head size returns cudaErrorInvalidValue before launching anything, as
// do negative sizes or KVH < 1. Each function returns the launch's cudaError_t; zero-sized calls
// launch nothing and return cudaSuccess.
//
// Thread-safety: functions touch only their arguments; the usual stream-ordering rules apply.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/cuda/elem_type.h"

namespace strata::kernels::cuda {

cudaError_t rope_forward(void* qkv, ElemType t, const float* cos_sin, int B, int S, int NH, int KVH,
                         int HS, cudaStream_t stream);
cudaError_t rope_backward(void* dqkv, ElemType t, const float* cos_sin, int B, int S, int NH,
                          int KVH, int HS, cudaStream_t stream);

}  // namespace strata::kernels::cuda
