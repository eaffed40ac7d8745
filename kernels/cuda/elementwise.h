// elementwise.h — CUDA vector helpers: adds, scaling and sums, on raw device buffers,
// launched on the caller's stream.
//
// Semantics are those of kernels/cpu/elementwise.h (the reference beside them). Buffers are f32
// or bf16 as their ElemType says. Every kernel computes in f32 and rounds to nearest even where it
// stores bf16. The multi-tensor sum of squares of gradients is kernels/cuda/optim.h's.
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

// y (n) += x (n); out = a + b; y *= s.
cudaError_t add_inplace(void* y, ElemType y_type, const void* x, ElemType x_type, int64_t n,
                        cudaStream_t stream);
cudaError_t add(void* out, ElemType out_type, const void* a, ElemType a_type, const void* b,
                ElemType b_type, int64_t n, cudaStream_t stream);
cudaError_t scale_inplace(void* y, ElemType t, float s, int64_t n, cudaStream_t stream);
// *out += Σ x (Σ x² when `square`), accumulated in double.
cudaError_t sum(double* out, const void* x, ElemType t, int64_t n, bool square,
                cudaStream_t stream);

}  // namespace strata::kernels::cuda
