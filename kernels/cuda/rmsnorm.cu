// rmsnorm.cu — the kernels of rmsnorm.h, laid out as layernorm.cu's (norm_rows.cuh: one warp per
// row, 8 rows per 256-thread block, each lane taking groups of 8 columns moved as 16-byte vectors
// where the rows allow, reductions by warp shuffles; the weight gradient a column sum in the
// kernel LayerNorm's parameter gradients use, registers then one atomic per column and block). Sums
// whose order differs from the CPU (warp reductions, atomics) match it to float rounding, not bit
// for bit.
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/norm_rows.cuh"
#include "kernels/cuda/rmsnorm.h"

namespace strata::kernels::cuda {
namespace {

template <class TA, class TW>
__global__ void __launch_bounds__(kNormRowWarps * 32)
    rmsnorm_forward_kernel(TA* out, float* rstd, const TA* inp, const TW* w, float eps, int64_t N,
                           int C, bool vec) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * int64_t{kNormRowWarps} + threadIdx.x / 32;
  if (row >= N) return;         // the whole warp: none of its lanes shuffles below
  const TA* x = inp + row * C;  // (C)
  TA* y = out + row * C;        // (C)
  float v[kGroup];
  float q = 0.f;
  STRATA_FOR_EACH_ROW_GROUP(c, lane, C) {
    load_group(x + c, group_count(c, C), vec, v);  // a partial group's missing values are 0
    for (int e = 0; e < kGroup; ++e) q += v[e] * v[e];
  }
  const float r = 1.f / sqrtf(warp_sum(q) / C + eps);
  STRATA_FOR_EACH_ROW_GROUP(c, lane, C) {
    const int k = group_count(c, C);
    float wv[kGroup];
    load_group(x + c, k, vec, v);
    load_group(w + c, k, vec, wv);
    for (int e = 0; e < kGroup; ++e) v[e] = v[e] * r * wv[e];
    store_group(y + c, k, vec, v);
  }
  if (lane == 0) rstd[row] = r;
}

// The input gradient, one warp per row: dx += rstd · (g − xhat · mean(g · xhat)), g = w · dy,
// xhat = x · rstd (LayerNorm's without the mean terms). The weight gradient is
// norm_param_grad_kernel's (norm_rows.cuh).
template <class TA, class TW>
__global__ void __launch_bounds__(kNormRowWarps * 32)
    rmsnorm_backward_kernel(TA* dinp, const TA* dout, const TA* inp, const TW* w, const float* rstd,
                            int64_t N, int C, bool vec) {
  const int lane = threadIdx.x % 32;
  for (int64_t row = blockIdx.x * int64_t{kNormRowWarps} + threadIdx.x / 32; row < N;
       row += static_cast<int64_t>(gridDim.x) * kNormRowWarps) {
    const TA* x = inp + row * C;    // (C)
    const TA* dy = dout + row * C;  // (C)
    TA* dx = dinp + row * C;        // (C)
    const float r = rstd[row];
    float xv[kGroup], dyv[kGroup], wv[kGroup];
    float gx_sum = 0.f;
    STRATA_FOR_EACH_ROW_GROUP(c, lane, C) {
      const int k = group_count(c, C);
      load_group(x + c, k, vec, xv);
      load_group(dy + c, k, vec, dyv);
      load_group(w + c, k, vec, wv);
      for (int e = 0; e < kGroup; ++e) gx_sum += wv[e] * dyv[e] * xv[e] * r;  // missing: 0
    }
    const float gx_mean = warp_sum(gx_sum) / C;
    STRATA_FOR_EACH_ROW_GROUP(c, lane, C) {
      const int k = group_count(c, C);
      float dxv[kGroup];
      load_group(x + c, k, vec, xv);
      load_group(dy + c, k, vec, dyv);
      load_group(w + c, k, vec, wv);
      load_group(dx + c, k, vec, dxv);
      for (int e = 0; e < kGroup; ++e) dxv[e] += (wv[e] * dyv[e] - xv[e] * r * gx_mean) * r;
      store_group(dx + c, k, vec, dxv);
    }
  }
}

}  // namespace

cudaError_t rmsnorm_forward(void* out, float* rstd, const void* inp, ElemType act,
                            const void* weight, ElemType w_type, float eps, int64_t N, int C,
                            cudaStream_t stream) {
  if (N == 0) return cudaSuccess;
  return dispatch(act, [&](auto ta) {
    using TA = typename decltype(ta)::type;  // named outside the inner lambda, as layernorm.cu
    return dispatch(w_type, [&](auto tw) {
      using TW = typename decltype(tw)::type;
      const bool vec = vec_aligned(out) && vec_aligned(inp) && vec_aligned(weight) &&
                       rows_vec_aligned(C, sizeof(TA));
      launch(rmsnorm_forward_kernel<TA, TW>, grid_for(N, kNormRowWarps), kNormRowWarps * 32, 0,
             stream, static_cast<TA*>(out), rstd, static_cast<const TA*>(inp),
             static_cast<const TW*>(weight), eps, N, C, vec);
      return cudaGetLastError();
    });
  });
}

cudaError_t rmsnorm_backward(void* dinp, float* dweight, const void* dout, const void* inp,
                             ElemType act, const void* weight, ElemType w_type, const float* rstd,
                             int64_t N, int C, cudaStream_t stream) {
  if (N == 0) return cudaSuccess;
  return dispatch(act, [&](auto ta) {
    using TA = typename decltype(ta)::type;
    return dispatch(w_type, [&](auto tw) {
      using TW = typename decltype(tw)::type;
      const bool vec = vec_aligned(dinp) && vec_aligned(dout) && vec_aligned(inp) &&
                       vec_aligned(weight) && rows_vec_aligned(C, sizeof(TA));
      launch(rmsnorm_backward_kernel<TA, TW>, grid_for(N, kNormRowWarps), kNormRowWarps * 32, 0,
             stream, static_cast<TA*>(dinp), static_cast<const TA*>(dout),
             static_cast<const TA*>(inp), static_cast<const TW*>(weight), rstd, N, C, vec);
      if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
      launch_norm_param_grad<false>(dweight, nullptr, static_cast<const TA*>(dout),
                                    static_cast<const TA*>(inp), nullptr, rstd, N, C, vec, stream);
      return cudaGetLastError();
    });
  });
}

}  // namespace strata::kernels::cuda
