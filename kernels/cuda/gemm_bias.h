// gemm_bias.h — the bias kernels of the GEMM family on CUDA, for the GEMMs whose
// cuBLASLt epilogue (kernels/cuda/gemm_lt.h) cannot take the bias add or the bias gradient: pure
// functions on raw device buffers + shapes, launched on the caller's stream.
//
// Semantics are those of matmul_forward's bias and matmul_backward's dbias in kernels/cpu/gemm.h
// (the reference beside them): row-major buffers, bias_grad ACCUMULATES (+=) into dbias. out,
// bias and dout are f32 or bf16 as their ElemType says; dbias is always f32. Every kernel computes
// in f32 and rounds to nearest even where it stores bf16.
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

// out (N, OC) += bias (OC) on every row: the bias add for GEMMs whose epilogue cannot take it.
cudaError_t add_bias(void* out, ElemType out_type, const void* bias, ElemType bias_type, int64_t N,
                     int OC, cudaStream_t stream);
// dbias (OC) += Σ_n dout (N, OC).
cudaError_t bias_grad(float* dbias, const void* dout, ElemType dout_type, int64_t N, int OC,
                      cudaStream_t stream);

}  // namespace strata::kernels::cuda
