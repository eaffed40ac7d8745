// layernorm.h — CUDA LayerNorm: pure functions on raw device buffers + shapes, launched on
// the caller's stream.
//
// Semantics are those of kernels/cpu/layernorm.h (the reference beside them): row-major buffers,
// layernorm_backward ACCUMULATES (+=) into dinp, dweight and dbias. Activations (inp, out, dinp,
// dout) and weights are f32 or bf16 as their ElemType says; the statistics mean/rstd and the
// parameter gradients dweight/dbias are always f32. Every kernel computes in f32 and rounds to
// nearest even where it stores bf16.
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

// LayerNorm over the last dimension, eps added to the variance (GPT-2's 1e-5, BERT's 1e-12).
// inp, out (N, C) of type act; weight, bias (C) of type w_type; mean, rstd (N).
cudaError_t layernorm_forward(void* out, float* mean, float* rstd, const void* inp, ElemType act,
                              const void* weight, const void* bias, ElemType w_type, int64_t N,
                              int C, float eps, cudaStream_t stream);
// dinp (N, C) +=, dweight (C) +=, dbias (C) +=. dinp, dout, inp of type act; weight of w_type.
cudaError_t layernorm_backward(void* dinp, float* dweight, float* dbias, const void* dout,
                               const void* inp, ElemType act, const void* weight, ElemType w_type,
                               const float* mean, const float* rstd, int64_t N, int C,
                               cudaStream_t stream);

}  // namespace strata::kernels::cuda
