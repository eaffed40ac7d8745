// embedding.h — CUDA vocab-parallel token and position embedding: pure functions on raw
// device buffers + shapes, launched on the caller's stream.
//
// Semantics are those of kernels/cpu/embedding.h (the reference beside them): row-major buffers,
// embedding_backward ACCUMULATES (+=) into dwte and dwpe. out, wte, wpe and dout are f32 or bf16
// as their ElemType says; the parameter gradients dwte/dwpe are always f32. Every kernel computes
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

// out (B, S, C) = wte[token - vocab_start] (0 outside the shard) + wpe[s]; wte (V_local, C) and
// wpe (S_max, C) share w_type; wpe may be null.
cudaError_t embedding_forward(void* out, ElemType out_type, const int32_t* tokens, const void* wte,
                              const void* wpe, ElemType w_type, int B, int S, int C,
                              int vocab_start, int V_local, cudaStream_t stream);
// dwte += scatter of dout by token (own shard only); dwpe (S, C) += Σ_b dout; dwpe may be null.
cudaError_t embedding_backward(float* dwte, float* dwpe, const void* dout, ElemType dout_type,
                               const int32_t* tokens, int B, int S, int C, int vocab_start,
                               int V_local, cudaStream_t stream);

}  // namespace strata::kernels::cuda
