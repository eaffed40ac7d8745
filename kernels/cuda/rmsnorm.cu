// rmsnorm.cu — the kernels of rmsnorm.h, laid out as layernorm.cu's (one warp per row, 8 rows
// per 256-thread block, each lane taking groups of 8 columns moved as 16-byte vectors where the
// rows allow, reductions by warp shuffles; the weight gradient a column sum in a kernel of its
// own, registers then one atomic per column and block). Sums whose order differs from the CPU
// (warp reductions, atomics) match it to float rounding, not bit for bit.
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/rmsnorm.h"

namespace strata::kernels::cuda {
namespace {

constexpr int kRowWarps = 8;              // one warp per row, 8 rows per block
constexpr int64_t kGradGridTarget = 264;  // weight gradient: blocks in all (2 per SM of 132)
constexpr int kColumns = kGroup * 32;     // weight gradient: columns per block

// One warp per row: lane l takes the groups of columns starting at 8l, 8l + 256, ...
#define STRATA_FOR_EACH_ROW_GROUP(c, lane, C) \
  for (int c = kGroup * (lane); c < (C); c += kGroup * 32)

template <class TA, class TW>
__global__ void __launch_bounds__(kRowWarps * 32)
    rmsnorm_forward_kernel(TA* out, float* rstd, const TA* inp, const TW* w, float eps, int64_t N,
                           int C, bool vec) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * int64_t{kRowWarps} + threadIdx.x / 32;
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
// rmsnorm_weight_grad_kernel's.
template <class TA, class TW>
__global__ void __launch_bounds__(kRowWarps * 32)
    rmsnorm_backward_kernel(TA* dinp, const TA* dout, const TA* inp, const TW* w, const float* rstd,
                            int64_t N, int C, bool vec) {
  const int lane = threadIdx.x % 32;
  for (int64_t row = blockIdx.x * int64_t{kRowWarps} + threadIdx.x / 32; row < N;
       row += static_cast<int64_t>(gridDim.x) * kRowWarps) {
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

// dweight += Σ_rows xhat · dy: a block covers kColumns columns (each lane one group) and its
// warps take rows kRowWarps · gridDim.y apart, summing in registers; the warps' sums meet in
// shared memory and each column adds its block's sum with one atomic.
template <class TA>
__global__ void __launch_bounds__(kRowWarps * 32)
    rmsnorm_weight_grad_kernel(float* dweight, const TA* dout, const TA* inp, const float* rstd,
                               int64_t N, int C, bool vec) {
  __shared__ float part[kRowWarps][kColumns];  // [warp][column of the tile]
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int c = blockIdx.x * kColumns + lane * kGroup;  // this lane's group
  const int k = c < C ? group_count(c, C) : 0;
  float dw[kGroup] = {};
  if (k > 0) {
    for (int64_t row = blockIdx.y * int64_t{kRowWarps} + warp; row < N;
         row += static_cast<int64_t>(gridDim.y) * kRowWarps) {
      float xv[kGroup], dyv[kGroup];
      load_group(inp + row * C + c, k, vec, xv);
      load_group(dout + row * C + c, k, vec, dyv);
      const float r = rstd[row];
      for (int e = 0; e < kGroup; ++e) dw[e] += xv[e] * r * dyv[e];
    }
  }
  for (int e = 0; e < kGroup; ++e) part[warp][lane * kGroup + e] = dw[e];
  __syncthreads();
  for (int col = threadIdx.x; col < kColumns; col += blockDim.x) {
    const int gc = blockIdx.x * kColumns + col;
    if (gc >= C) continue;
    float sum = 0.f;
    for (int w2 = 0; w2 < kRowWarps; ++w2) sum += part[w2][col];
    atomicAdd(&dweight[gc], sum);
  }
}

#undef STRATA_FOR_EACH_ROW_GROUP

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
      launch(rmsnorm_forward_kernel<TA, TW>, grid_for(N, kRowWarps), kRowWarps * 32, 0, stream,
             static_cast<TA*>(out), rstd, static_cast<const TA*>(inp),
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
      launch(rmsnorm_backward_kernel<TA, TW>, grid_for(N, kRowWarps), kRowWarps * 32, 0, stream,
             static_cast<TA*>(dinp), static_cast<const TA*>(dout), static_cast<const TA*>(inp),
             static_cast<const TW*>(weight), rstd, N, C, vec);
      if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
      const unsigned tiles = static_cast<unsigned>((C + kColumns - 1) / kColumns);
      const unsigned slices = static_cast<unsigned>(
          std::max<int64_t>(1, std::min<int64_t>((N + kRowWarps - 1) / kRowWarps,
                                                 (kGradGridTarget + tiles - 1) / tiles)));
      launch(rmsnorm_weight_grad_kernel<TA>, dim3(tiles, slices), kRowWarps * 32, 0, stream,
             dweight, static_cast<const TA*>(dout), static_cast<const TA*>(inp), rstd, N, C, vec);
      return cudaGetLastError();
    });
  });
}

}  // namespace strata::kernels::cuda
