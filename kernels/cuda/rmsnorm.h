// rmsnorm.h — CUDA RMSNorm: pure functions on raw device buffers + shapes, launched on the
// caller's stream.
//
// Semantics are those of kernels/cpu/rmsnorm.h (the reference beside them) and
// runtime/backend/backend.h: out = x · rstd · w with rstd = 1/√(mean(x²) + eps) over each row;
// rmsnorm_backward ACCUMULATES
// (+=) into dinp (the residual stream's gradient) and dweight, as layernorm_backward does.
// Activations (inp, out, dinp, dout) and the weight are f32 or bf16 as their ElemType says; rstd
// and dweight are always f32. Every kernel computes in f32 and rounds to nearest even where it
// stores bf16.
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

}  // namespace strata::kernels::cuda
