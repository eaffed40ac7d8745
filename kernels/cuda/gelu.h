// gelu.h — CUDA activations: GELU (tanh and exact erf forms) and tanh, pure functions on raw
// device buffers, launched on the caller's stream.
//
// Semantics are those of kernels/cpu/gelu.h (the reference beside them). Every buffer is f32 or
// bf16 as t says. Every kernel computes in f32 and rounds to nearest even where it stores bf16.
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

// GELU, tanh approximation; all buffers of type t. gelu_backward: dinp = gelu'(inp) · dout
// (assigned: dinp is never read).
cudaError_t gelu_forward(void* out, const void* inp, ElemType t, int64_t n, cudaStream_t stream);
cudaError_t gelu_backward(void* dinp, const void* inp, const void* dout, ElemType t, int64_t n,
                          cudaStream_t stream);
// GELU, exact: 0.5x(1 + erf(x/√2)) (BERT's); the backward (Φ(x) + x·φ(x)) · dout, assigned.
cudaError_t gelu_erf_forward(void* out, const void* inp, ElemType t, int64_t n,
                             cudaStream_t stream);
cudaError_t gelu_erf_backward(void* dinp, const void* inp, const void* dout, ElemType t, int64_t n,
                              cudaStream_t stream);
// out = tanh(inp); dinp = (1 − out²) · dout (from the forward's output, assigned).
cudaError_t tanh_forward(void* out, const void* inp, ElemType t, int64_t n, cudaStream_t stream);
cudaError_t tanh_backward(void* dinp, const void* out, const void* dout, ElemType t, int64_t n,
                          cudaStream_t stream);

}  // namespace strata::kernels::cuda
