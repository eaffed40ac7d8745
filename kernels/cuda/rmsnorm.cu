// rmsnorm.cu — the kernels of rmsnorm.h, laid out as layernorm.cu's (norm_rows.cuh: one warp per
// row, 8 rows per 256-thread block, each lane taking groups of 8 columns moved as 16-byte vectors
// where the rows allow, reductions by warp shuffles; the weight gradient a column sum in the
// kernel LayerNorm's parameter gradients use, registers then one atomic per column and block). Sums
// whose order differs from the CPU (warp reductions, atomics) match it to float rounding, not bit
// for bit. The per-head RMSNorm of the query and key heads runs the same kernels on the heads as
// rows (norm_rows.cuh's HeadRows), in place; a head of HS ≤ 128 leaves half the warp's lanes or
// more idle (a row of HS = 128 is 16 groups of 8), which has not been timed on a GPU yet.
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/norm_rows.cuh"
#include "kernels/cuda/rmsnorm.h"

namespace strata::kernels::cuda {
namespace {

// One warp per row; the rows lie as `rows` says (norm_rows.cuh), each taking w or, where rows
// says so, w2. out may be inp (in place: a lane reads each of its groups before writing it).
template <class TA, class TW, class Rows>
__global__ void __launch_bounds__(kNormRowWarps * 32)
    rmsnorm_forward_kernel(TA* out, float* rstd, const TA* inp, const TW* w, const TW* w2,
                           float eps, int64_t N, int C, Rows rows, bool vec) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * int64_t{kNormRowWarps} + threadIdx.x / 32;
  if (row >= N) return;  // the whole warp: none of its lanes shuffles below
  const int64_t at = rows.offset(row);
  const TA* x = inp + at;                           // (C)
  TA* y = out + at;                                 // (C)
  const TW* wr = rows.second_weight(row) ? w2 : w;  // (C)
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
    load_group(wr + c, k, vec, wv);
    for (int e = 0; e < kGroup; ++e) v[e] = v[e] * r * wv[e];
    store_group(y + c, k, vec, v);
  }
  if (lane == 0) rstd[rows.stat(row)] = r;
}

// The input gradient, one warp per row: dx = rstd · (g − xhat · mean(g · xhat)), g = w · dy,
// xhat = x · rstd (LayerNorm's without the mean terms), added to dinp (kAccumulate) or assigned;
// assigned, dinp may be dout (in place: a lane reads the whole row's dy for the mean, the warp
// reduces, then each lane reads each of its groups before writing it). Rows and weights as the
// forward's. The weight gradient is norm_param_grad_kernel's (norm_rows.cuh).
template <bool kAccumulate, class TA, class TW, class Rows>
__global__ void __launch_bounds__(kNormRowWarps * 32)
    rmsnorm_backward_kernel(TA* dinp, const TA* dout, const TA* inp, const TW* w, const TW* w2,
                            const float* rstd, int64_t N, int C, Rows rows, bool vec) {
  const int lane = threadIdx.x % 32;
  for (int64_t row = blockIdx.x * int64_t{kNormRowWarps} + threadIdx.x / 32; row < N;
       row += static_cast<int64_t>(gridDim.x) * kNormRowWarps) {
    const int64_t at = rows.offset(row);
    const TA* x = inp + at;                           // (C)
    const TA* dy = dout + at;                         // (C)
    TA* dx = dinp + at;                               // (C)
    const TW* wr = rows.second_weight(row) ? w2 : w;  // (C)
    const float r = rstd[rows.stat(row)];
    float xv[kGroup], dyv[kGroup], wv[kGroup];
    float gx_sum = 0.f;
    STRATA_FOR_EACH_ROW_GROUP(c, lane, C) {
      const int k = group_count(c, C);
      load_group(x + c, k, vec, xv);
      load_group(dy + c, k, vec, dyv);
      load_group(wr + c, k, vec, wv);
      for (int e = 0; e < kGroup; ++e) gx_sum += wv[e] * dyv[e] * xv[e] * r;  // missing: 0
    }
    const float gx_mean = warp_sum(gx_sum) / C;
    STRATA_FOR_EACH_ROW_GROUP(c, lane, C) {
      const int k = group_count(c, C);
      float dxv[kGroup];
      load_group(x + c, k, vec, xv);
      load_group(dy + c, k, vec, dyv);
      load_group(wr + c, k, vec, wv);
      if constexpr (kAccumulate) load_group(dx + c, k, vec, dxv);
      for (int e = 0; e < kGroup; ++e) {
        const float g = (wv[e] * dyv[e] - xv[e] * r * gx_mean) * r;
        if constexpr (kAccumulate) {
          dxv[e] += g;
        } else {
          dxv[e] = g;
        }
      }
      store_group(dx + c, k, vec, dxv);
    }
  }
}

// The query and key heads as rows (norm_rows.cuh's HeadRows): all NH + KVH of a position, rstd in
// the same order; the query heads alone; the key heads alone (pointers NH heads, NH statistics on).
HeadRows qk_rows(int NH, int KVH, int HS) {
  return {NH + KVH, HS, static_cast<int64_t>(NH + 2 * KVH) * HS, NH + KVH, NH};
}
HeadRows q_rows(int NH, int KVH, int HS) {
  return {NH, HS, static_cast<int64_t>(NH + 2 * KVH) * HS, NH + KVH, NH};
}
HeadRows k_rows(int NH, int KVH, int HS) {
  return {KVH, HS, static_cast<int64_t>(NH + 2 * KVH) * HS, NH + KVH, KVH};
}
bool qk_sizes_valid(int64_t N, int NH, int KVH, int HS) {
  return N >= 0 && NH >= 0 && KVH >= 1 && HS >= 0;
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
      const auto* w = static_cast<const TW*>(weight);
      launch(rmsnorm_forward_kernel<TA, TW, DenseRows>, grid_for(N, kNormRowWarps),
             kNormRowWarps * 32, 0, stream, static_cast<TA*>(out), rstd,
             static_cast<const TA*>(inp), w, w, eps, N, C, DenseRows{C}, vec);
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
      const auto* w = static_cast<const TW*>(weight);
      launch(rmsnorm_backward_kernel<true, TA, TW, DenseRows>, grid_for(N, kNormRowWarps),
             kNormRowWarps * 32, 0, stream, static_cast<TA*>(dinp), static_cast<const TA*>(dout),
             static_cast<const TA*>(inp), w, w, rstd, N, C, DenseRows{C}, vec);
      if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
      launch_norm_param_grad<false>(dweight, nullptr, static_cast<const TA*>(dout),
                                    static_cast<const TA*>(inp), nullptr, rstd, N, C, vec, stream);
      return cudaGetLastError();
    });
  });
}

cudaError_t qk_rmsnorm_forward(void* qkv, ElemType act, float* rstd, const void* q_weight,
                               const void* k_weight, ElemType w_type, float eps, int64_t N, int NH,
                               int KVH, int HS, cudaStream_t stream) {
  if (!qk_sizes_valid(N, NH, KVH, HS)) return cudaErrorInvalidValue;
  const int64_t rows = N * (NH + KVH);
  if (rows == 0 || HS == 0) return cudaSuccess;
  return dispatch(act, [&](auto ta) {
    using TA = typename decltype(ta)::type;
    return dispatch(w_type, [&](auto tw) {
      using TW = typename decltype(tw)::type;
      const bool vec = vec_aligned(qkv) && vec_aligned(q_weight) && vec_aligned(k_weight) &&
                       rows_vec_aligned(HS, sizeof(TA));
      launch(rmsnorm_forward_kernel<TA, TW, HeadRows>, grid_for(rows, kNormRowWarps),
             kNormRowWarps * 32, 0, stream, static_cast<TA*>(qkv), rstd,
             static_cast<const TA*>(qkv), static_cast<const TW*>(q_weight),
             static_cast<const TW*>(k_weight), eps, rows, HS, qk_rows(NH, KVH, HS), vec);
      return cudaGetLastError();
    });
  });
}

cudaError_t qk_rmsnorm_backward(void* dqkv, float* dq_weight, float* dk_weight, const void* x,
                                ElemType act, const void* q_weight, const void* k_weight,
                                ElemType w_type, const float* rstd, int64_t N, int NH, int KVH,
                                int HS, cudaStream_t stream) {
  if (!qk_sizes_valid(N, NH, KVH, HS)) return cudaErrorInvalidValue;
  const int64_t rows = N * (NH + KVH);
  if (rows == 0 || HS == 0) return cudaSuccess;
  return dispatch(act, [&](auto ta) {
    using TA = typename decltype(ta)::type;
    return dispatch(w_type, [&](auto tw) {
      using TW = typename decltype(tw)::type;
      const bool vec = vec_aligned(dqkv) && vec_aligned(x) && vec_aligned(q_weight) &&
                       vec_aligned(k_weight) && rows_vec_aligned(HS, sizeof(TA));
      auto* d = static_cast<TA*>(dqkv);
      const auto* xa = static_cast<const TA*>(x);
      // The weight gradients first, on the stream: they read the incoming gradient that the row
      // kernel then overwrites.
      const int64_t k_at = static_cast<int64_t>(NH) * HS;  // the first key head of position 0
      if (NH > 0) {
        launch_norm_param_grad<false>(dq_weight, nullptr, d, xa, nullptr, rstd, N * NH, HS,
                                      q_rows(NH, KVH, HS), vec, stream);
        if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
      }
      launch_norm_param_grad<false>(dk_weight, nullptr, d + k_at, xa + k_at, nullptr, rstd + NH,
                                    N * KVH, HS, k_rows(NH, KVH, HS), vec, stream);
      if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
      launch(rmsnorm_backward_kernel<false, TA, TW, HeadRows>, grid_for(rows, kNormRowWarps),
             kNormRowWarps * 32, 0, stream, d, d, xa, static_cast<const TW*>(q_weight),
             static_cast<const TW*>(k_weight), rstd, rows, HS, qk_rows(NH, KVH, HS), vec);
      return cudaGetLastError();
    });
  });
}

}  // namespace strata::kernels::cuda
