// swiglu.h — CUDA SwiGLU (the gated MLP activation of Llama-family models): pure functions on
// raw device buffers + shapes, launched on the caller's stream.
//
// Semantics are those of kernels/cpu/swiglu.h (the reference beside them) and
// runtime/backend/backend.h: gate_up (N, 2F) holds per row [gate (F) | up (F)]; out (N, F) =
// silu(gate) · up with silu(g) = g · sigmoid(g). swiglu_backward ASSIGNS dgate_up (N, 2F) (one
// producer: never read):
//   dgate = dout · up · σ(g) · (1 + g · (1 − σ(g))),   dup = dout · silu(g).
// Every buffer is f32 or bf16 as t says; computed in f32, each result rounded once at the store.
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

cudaError_t swiglu_forward(void* out, const void* gate_up, ElemType t, int64_t N, int F,
                           cudaStream_t stream);
cudaError_t swiglu_backward(void* dgate_up, const void* dout, const void* gate_up, ElemType t,
                            int64_t N, int F, cudaStream_t stream);

}  // namespace strata::kernels::cuda
