// cross_entropy.cu — the kernels of cross_entropy.h.
//
// Launch shapes (not tuned on a GPU yet): rows (tens of thousands of columns) take one 256-thread
// block each, groups of 8 columns per thread, block reductions through warp shuffles; the
// per-row steps (rescale, target logit, losses) one thread per row, a grid-stride loop. Block
// reductions sum in another order than the CPU: they match it to float rounding, not bit for
// bit.
#include <cuda_runtime.h>

#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/map.cuh"

namespace strata::kernels::cuda {
namespace {

constexpr int kRowThreads = 256;  // cross-entropy: one block per row

// Row kernels over a row's groups of 8 columns: thread t takes the groups starting at 8t,
// 8t + 8·blockDim.x, ... Groups lie within the row's ld columns (a partial one only where ld is
// not a multiple of 8); columns at or past `valid` (vocabulary padding) are masked.
#define STRATA_FOR_EACH_COLUMN_GROUP(j, end) \
  for (int j = kGroup * threadIdx.x; j < (end); j += kGroup * blockDim.x)

// A running (max, Σ exp(x − max)) pair; `add` merges another pair into it. A pair with no values
// yet is (−inf, 0), which merges as nothing (a −inf max is never subtracted from itself). A NaN
// max is sticky: a row with a NaN logit gets NaN statistics, hence a NaN loss, as on the CPU
// (fmaxf alone would skip the NaN, and a thread holding only NaNs would drop out of the sum).
struct MaxSumExp {
  float m = -INFINITY, s = 0.f;
  __device__ void add(float om, float os) {
    if (isnan(om) || isnan(m)) {
      m = s = NAN;
    } else if (om > m) {
      s = s * expf(m - om) + os;  // expf(−inf) = 0 while this pair is still empty
      m = om;
    } else if (os != 0.f) {  // (−inf, 0), and a group's (max, 0), add nothing
      s += os * expf(om - m);
    }
  }
};

// One read of each row: every thread keeps a running pair over its groups (the group's max
// first, so the sum is rescaled at most once per group), then warps and the block merge pairs.
template <class T>
__global__ void __launch_bounds__(kRowThreads)
    ce_row_stats_kernel(float* row_max, float* row_sumexp, const T* logits, int ld, int valid,
                        bool vec) {
  __shared__ float scratch_m[32], scratch_s[32];
  const T* row = logits + static_cast<int64_t>(blockIdx.x) * ld;  // (ld)
  MaxSumExp p;
  STRATA_FOR_EACH_COLUMN_GROUP(j, valid) {
    float v[kGroup];
    load_group(row + j, group_count(j, ld), vec, v);
    float gm = -INFINITY;
    bool nan = false;
    for (int e = 0; e < kGroup; ++e)
      if (j + e < valid) gm = fmaxf(gm, v[e]), nan |= isnan(v[e]);
    p.add(nan ? NAN : gm, 0.f);
    if (p.m == -INFINITY) continue;  // every value so far −inf: nothing to add
    for (int e = 0; e < kGroup; ++e)
      if (j + e < valid) p.s += expf(v[e] - p.m);
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float om = __shfl_xor_sync(kFullMask, p.m, o), os = __shfl_xor_sync(kFullMask, p.s, o);
    p.add(om, os);
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) scratch_m[warp] = p.m, scratch_s[warp] = p.s;
  __syncthreads();
  if (threadIdx.x == 0) {
    MaxSumExp b;
    for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) b.add(scratch_m[w], scratch_s[w]);
    row_max[blockIdx.x] = b.m;
    row_sumexp[blockIdx.x] = b.s;
  }
}

__global__ void ce_rescale_sumexp_kernel(float* row_sumexp, const float* local_max,
                                         const float* row_max, int64_t N) {
  STRATA_FOR_EACH(n, N) row_sumexp[n] *= expf(local_max[n] - row_max[n]);
}

template <class T>
__global__ void ce_target_logit_kernel(float* out, const T* logits, const int32_t* targets,
                                       int64_t N, int ld, int vocab_start, int valid) {
  STRATA_FOR_EACH(n, N) {
    const int t = targets[n] - vocab_start;
    out[n] = (t >= 0 && t < valid) ? to_float(logits[n * ld + t]) : 0.f;
  }
}

// weights may be null (every row weighs 1). A zero weight is tested, not multiplied: 0 · NaN
// (a masked row's NaN or inf logits) would be NaN.
__global__ void ce_losses_kernel(float* losses, const float* row_max, const float* row_sumexp,
                                 const float* target_logit, const float* weights, int64_t N) {
  STRATA_FOR_EACH(n, N) {
    if (weights == nullptr) {
      losses[n] = logf(row_sumexp[n]) + row_max[n] - target_logit[n];
    } else {
      const float w = weights[n];
      losses[n] = w == 0.f ? 0.f : w * (logf(row_sumexp[n]) + row_max[n] - target_logit[n]);
    }
  }
}

// No __restrict__: dlogits may alias logits (each group is read, then written, by one thread).
// weights may be null (every row weighs 1); a row whose weight is 0 is stored as zeros without
// reading its logits, which may be NaN or inf.
template <class TD, class TL>
__global__ void __launch_bounds__(kRowThreads)
    ce_backward_kernel(TD* dlogits, const TL* logits, const float* row_max, const float* row_sumexp,
                       const int32_t* targets, const float* weights, float scale, int ld,
                       int vocab_start, int valid, bool vec) {
  const int64_t n = blockIdx.x;
  const TL* row = logits + n * ld;  // (ld)
  TD* drow = dlogits + n * ld;      // (ld)
  const bool masked = weights != nullptr && weights[n] == 0.f;
  // Without weights the row's factor is `scale` itself: the unweighted arithmetic.
  const float s = weights != nullptr ? weights[n] * scale : scale;
  const float m = row_max[n], inv = 1.f / row_sumexp[n];
  const int target = targets[n] - vocab_start;
  STRATA_FOR_EACH_COLUMN_GROUP(j, ld) {
    const int k = group_count(j, ld);
    float v[kGroup] = {};
    if (!masked) {
      load_group(row + j, k, vec, v);
      for (int e = 0; e < kGroup; ++e)
        v[e] = j + e < valid ? s * (expf(v[e] - m) * inv - (j + e == target ? 1.f : 0.f)) : 0.f;
    }
    store_group(drow + j, k, vec, v);
  }
}

#undef STRATA_FOR_EACH_COLUMN_GROUP

}  // namespace

cudaError_t ce_row_stats(float* row_max, float* row_sumexp, const void* logits,
                         ElemType logits_type, int64_t N, int ld, int valid, cudaStream_t stream) {
  if (N == 0) return cudaSuccess;
  return dispatch(logits_type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch(ce_row_stats_kernel<T>, static_cast<unsigned>(N), kRowThreads, 0, stream, row_max,
           row_sumexp, static_cast<const T*>(logits), ld, valid,
           vec_aligned(logits) && rows_vec_aligned(ld, sizeof(T)));
    return cudaGetLastError();
  });
}

cudaError_t ce_rescale_sumexp(float* row_sumexp, const float* local_max, const float* row_max,
                              int64_t N, cudaStream_t stream) {
  if (N == 0) return cudaSuccess;
  launch(ce_rescale_sumexp_kernel, elementwise_grid(N), kThreads, 0, stream, row_sumexp, local_max,
         row_max, N);
  return cudaGetLastError();
}

cudaError_t ce_target_logit(float* target_logit, const void* logits, ElemType logits_type,
                            const int32_t* targets, int64_t N, int ld, int vocab_start, int valid,
                            cudaStream_t stream) {
  if (N == 0) return cudaSuccess;
  return dispatch(logits_type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch(ce_target_logit_kernel<T>, elementwise_grid(N), kThreads, 0, stream, target_logit,
           static_cast<const T*>(logits), targets, N, ld, vocab_start, valid);
    return cudaGetLastError();
  });
}

cudaError_t ce_losses(float* losses, const float* row_max, const float* row_sumexp,
                      const float* target_logit, const float* weights, int64_t N,
                      cudaStream_t stream) {
  if (N == 0) return cudaSuccess;
  launch(ce_losses_kernel, elementwise_grid(N), kThreads, 0, stream, losses, row_max, row_sumexp,
         target_logit, weights, N);
  return cudaGetLastError();
}

cudaError_t ce_backward(void* dlogits, ElemType dlogits_type, const void* logits,
                        ElemType logits_type, const float* row_max, const float* row_sumexp,
                        const int32_t* targets, const float* weights, float scale, int64_t N,
                        int ld, int vocab_start, int valid, cudaStream_t stream) {
  if (N == 0) return cudaSuccess;
  return dispatch(dlogits_type, [&](auto td) {
    return dispatch(logits_type, [&](auto tl) {
      using TD = typename decltype(td)::type;
      using TL = typename decltype(tl)::type;
      const bool vec = vec_aligned(dlogits) && vec_aligned(logits) &&
                       rows_vec_aligned(ld, sizeof(TD)) && rows_vec_aligned(ld, sizeof(TL));
      launch(ce_backward_kernel<TD, TL>, static_cast<unsigned>(N), kRowThreads, 0, stream,
             static_cast<TD*>(dlogits), static_cast<const TL*>(logits), row_max, row_sumexp,
             targets, weights, scale, ld, vocab_start, valid, vec);
      return cudaGetLastError();
    });
  });
}

}  // namespace strata::kernels::cuda
