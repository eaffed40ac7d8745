// layernorm.cu — the kernels of layernorm.h.
//
// One warp per row (8 rows per 256-thread block), each lane taking groups of 8 columns,
// reductions by warp shuffles alone — a row of 768 or 2048 columns is too short to keep a whole
// block busy, and a warp needs no __syncthreads; the row is read from global memory once per pass
// (L1/L2 keep it between them). The backward's parameter gradients are column sums in a kernel
// of their own (norm_rows.cuh, shared with RMSNorm). Sums whose order differs from the CPU (warp
// reductions, atomics) match it to float rounding, not bit for bit.
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/layernorm.h"
#include "kernels/cuda/norm_rows.cuh"

namespace strata::kernels::cuda {
namespace {

template <class TA, class TW>
__global__ void __launch_bounds__(kNormRowWarps * 32)
    layernorm_forward_kernel(TA* out, float* mean, float* rstd, const TA* inp, const TW* w,
                             const TW* b, int64_t N, int C, float eps, bool vec) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * int64_t{kNormRowWarps} + threadIdx.x / 32;
  if (row >= N) return;         // the whole warp: none of its lanes shuffles below
  const TA* x = inp + row * C;  // (C)
  TA* y = out + row * C;        // (C)
  float v[kGroup];
  float s = 0.f;
  STRATA_FOR_EACH_ROW_GROUP(c, lane, C) {
    load_group(x + c, group_count(c, C), vec, v);  // a partial group's missing values are 0
    for (int e = 0; e < kGroup; ++e) s += v[e];
  }
  const float m = warp_sum(s) / C;
  // Two passes (mean, then squared deviations), as the CPU reference: E[x²] − E[x]² cancels.
  float q = 0.f;
  STRATA_FOR_EACH_ROW_GROUP(c, lane, C) {
    const int k = group_count(c, C);
    load_group(x + c, k, vec, v);
    for (int e = 0; e < kGroup; ++e)
      if (e < k) q += (v[e] - m) * (v[e] - m);
  }
  const float r = 1.f / sqrtf(warp_sum(q) / C + eps);
  STRATA_FOR_EACH_ROW_GROUP(c, lane, C) {
    const int k = group_count(c, C);
    float wv[kGroup], bv[kGroup];
    load_group(x + c, k, vec, v);
    load_group(w + c, k, vec, wv);
    load_group(b + c, k, vec, bv);
    for (int e = 0; e < kGroup; ++e) v[e] = (v[e] - m) * r * wv[e] + bv[e];
    store_group(y + c, k, vec, v);
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

// The input gradient, one warp per row: dx += rstd · (g − mean(g) − xhat · mean(g · xhat)),
// g = w · dy (dinp accumulates: it is the residual stream's gradient). The parameter gradients
// are norm_param_grad_kernel's (norm_rows.cuh).
template <class TA, class TW>
__global__ void __launch_bounds__(kNormRowWarps * 32)
    layernorm_backward_kernel(TA* dinp, const TA* dout, const TA* inp, const TW* w,
                              const float* mean, const float* rstd, int64_t N, int C, bool vec) {
  const int lane = threadIdx.x % 32;
  for (int64_t row = blockIdx.x * int64_t{kNormRowWarps} + threadIdx.x / 32; row < N;
       row += static_cast<int64_t>(gridDim.x) * kNormRowWarps) {
    const TA* x = inp + row * C;    // (C)
    const TA* dy = dout + row * C;  // (C)
    TA* dx = dinp + row * C;        // (C)
    const float m = mean[row], r = rstd[row];
    float xv[kGroup], dyv[kGroup], wv[kGroup];
    float g_sum = 0.f, gx_sum = 0.f;
    STRATA_FOR_EACH_ROW_GROUP(c, lane, C) {
      const int k = group_count(c, C);
      load_group(x + c, k, vec, xv);
      load_group(dy + c, k, vec, dyv);
      load_group(w + c, k, vec, wv);
      for (int e = 0; e < kGroup; ++e) {  // a partial group's missing w and dy are 0: g = 0
        const float g = wv[e] * dyv[e];
        g_sum += g;
        gx_sum += g * (xv[e] - m) * r;
      }
    }
    const float g_mean = warp_sum(g_sum) / C;
    const float gx_mean = warp_sum(gx_sum) / C;
    STRATA_FOR_EACH_ROW_GROUP(c, lane, C) {
      const int k = group_count(c, C);
      float dxv[kGroup];
      load_group(x + c, k, vec, xv);
      load_group(dy + c, k, vec, dyv);
      load_group(w + c, k, vec, wv);
      load_group(dx + c, k, vec, dxv);
      for (int e = 0; e < kGroup; ++e)
        dxv[e] += (wv[e] * dyv[e] - g_mean - (xv[e] - m) * r * gx_mean) * r;
      store_group(dx + c, k, vec, dxv);
    }
  }
}

}  // namespace

cudaError_t layernorm_forward(void* out, float* mean, float* rstd, const void* inp, ElemType act,
                              const void* weight, const void* bias, ElemType w_type, int64_t N,
                              int C, float eps, cudaStream_t stream) {
  if (N == 0) return cudaSuccess;
  return dispatch(act, [&](auto ta) {
    return dispatch(w_type, [&](auto tw) {
      using TA = typename decltype(ta)::type;
      using TW = typename decltype(tw)::type;
      const bool vec = vec_aligned(out) && vec_aligned(inp) && vec_aligned(weight) &&
                       vec_aligned(bias) && rows_vec_aligned(C, sizeof(TA));
      launch(layernorm_forward_kernel<TA, TW>, grid_for(N, kNormRowWarps), kNormRowWarps * 32, 0,
             stream, static_cast<TA*>(out), mean, rstd, static_cast<const TA*>(inp),
             static_cast<const TW*>(weight), static_cast<const TW*>(bias), N, C, eps, vec);
      return cudaGetLastError();
    });
  });
}

cudaError_t layernorm_backward(void* dinp, float* dweight, float* dbias, const void* dout,
                               const void* inp, ElemType act, const void* weight, ElemType w_type,
                               const float* mean, const float* rstd, int64_t N, int C,
                               cudaStream_t stream) {
  if (N == 0) return cudaSuccess;
  return dispatch(act, [&](auto ta) {
    // TA is named here, not in the inner lambda: nvcc's launch stub for a kernel template taken
    // by address cannot name a type alias of an enclosing lambda's parameter.
    using TA = typename decltype(ta)::type;
    return dispatch(w_type, [&](auto tw) {
      using TW = typename decltype(tw)::type;
      const bool vec = vec_aligned(dinp) && vec_aligned(dout) && vec_aligned(inp) &&
                       vec_aligned(weight) && rows_vec_aligned(C, sizeof(TA));
      launch(layernorm_backward_kernel<TA, TW>, grid_for(N, kNormRowWarps), kNormRowWarps * 32, 0,
             stream, static_cast<TA*>(dinp), static_cast<const TA*>(dout),
             static_cast<const TA*>(inp), static_cast<const TW*>(weight), mean, rstd, N, C, vec);
      if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
      launch_norm_param_grad<true>(dweight, dbias, static_cast<const TA*>(dout),
                                   static_cast<const TA*>(inp), mean, rstd, N, C, vec, stream);
      return cudaGetLastError();
    });
  });
}

}  // namespace strata::kernels::cuda
