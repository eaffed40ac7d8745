// swiglu.cu — the kernels of swiglu.h: one thread per group of kGroup = 8 columns of a row of
// out (and the matching gate and up columns), moved as 16-byte vectors where every row start is
// 16-byte aligned (F a multiple of 8 in bf16, of 4 in f32 — Llama's widths are), element by
// element otherwise; a grid-stride loop over the groups so any N·F works.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/map.cuh"
#include "kernels/cuda/swiglu.h"

namespace strata::kernels::cuda {
namespace {

// σ(g) = 1 / (1 + e^(−g)): e^(−g) overflows to inf for g < −88, giving σ = 0 and silu = −0,
// the limits, with no NaN.
__device__ __forceinline__ float sigmoid(float g) {
  return 1.f / (1.f + expf(-g));
}

template <class T>
__global__ void swiglu_forward_kernel(T* out, const T* gate_up, int64_t N, int F, bool vec) {
  const int64_t groups_per_row = (F + kGroup - 1) / kGroup;
  STRATA_FOR_EACH(i, N * groups_per_row) {
    const int64_t n = i / groups_per_row;
    const int f = static_cast<int>(i % groups_per_row) * kGroup;
    const int k = group_count(f, F);
    const T* row = gate_up + n * 2 * F;  // (2F): [gate | up]
    float g[kGroup], u[kGroup];
    load_group(row + f, k, vec, g);
    load_group(row + F + f, k, vec, u);
    for (int e = 0; e < kGroup; ++e) g[e] = g[e] * sigmoid(g[e]) * u[e];
    store_group(out + n * F + f, k, vec, g);
  }
}

template <class T>
__global__ void swiglu_backward_kernel(T* dgate_up, const T* dout, const T* gate_up, int64_t N,
                                       int F, bool vec) {
  const int64_t groups_per_row = (F + kGroup - 1) / kGroup;
  STRATA_FOR_EACH(i, N * groups_per_row) {
    const int64_t n = i / groups_per_row;
    const int f = static_cast<int>(i % groups_per_row) * kGroup;
    const int k = group_count(f, F);
    const T* row = gate_up + n * 2 * F;  // (2F): [gate | up]
    T* drow = dgate_up + n * 2 * F;      // (2F): [dgate | dup]
    float g[kGroup], u[kGroup], dy[kGroup];
    load_group(row + f, k, vec, g);
    load_group(row + F + f, k, vec, u);
    load_group(dout + n * F + f, k, vec, dy);
    for (int e = 0; e < kGroup; ++e) {
      const float s = sigmoid(g[e]);
      const float silu = g[e] * s;
      g[e] = dy[e] * u[e] * s * (1.f + g[e] * (1.f - s));  // dgate
      u[e] = dy[e] * silu;                                 // dup
    }
    store_group(drow + f, k, vec, g);
    store_group(drow + F + f, k, vec, u);
  }
}

unsigned grid(int64_t N, int F) {
  return elementwise_grid(N * ((F + kGroup - 1) / kGroup));
}

}  // namespace

cudaError_t swiglu_forward(void* out, const void* gate_up, ElemType t, int64_t N, int F,
                           cudaStream_t stream) {
  if (N == 0 || F == 0) return cudaSuccess;
  return dispatch(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const bool vec = vec_aligned(out) && vec_aligned(gate_up) && rows_vec_aligned(F, sizeof(T));
    launch(swiglu_forward_kernel<T>, grid(N, F), kThreads, 0, stream, static_cast<T*>(out),
           static_cast<const T*>(gate_up), N, F, vec);
    return cudaGetLastError();
  });
}

cudaError_t swiglu_backward(void* dgate_up, const void* dout, const void* gate_up, ElemType t,
                            int64_t N, int F, cudaStream_t stream) {
  if (N == 0 || F == 0) return cudaSuccess;
  return dispatch(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const bool vec = vec_aligned(dgate_up) && vec_aligned(dout) && vec_aligned(gate_up) &&
                     rows_vec_aligned(F, sizeof(T));
    launch(swiglu_backward_kernel<T>, grid(N, F), kThreads, 0, stream, static_cast<T*>(dgate_up),
           static_cast<const T*>(dout), static_cast<const T*>(gate_up), N, F, vec);
    return cudaGetLastError();
  });
}

}  // namespace strata::kernels::cuda
