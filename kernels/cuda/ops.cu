// ops.cu — the kernels of ops.h.
//
// Launch shapes (none has been tuned on a GPU yet):
// - elementwise ops that stream (casts, adds, scaling, GELU): one thread per group of kGroup = 8
//   elements, moved as 16-byte vectors where the pointers allow (device_util.cuh), 256 threads
//   per block, a grid-stride loop so any n works;
// - LayerNorm: one warp per row (8 rows per 256-thread block), each lane taking groups of 8
//   columns, reductions by warp shuffles alone — a row of 768 or 2048 columns is too short to
//   keep a whole block busy, and a warp needs no __syncthreads; the row is read from global
//   memory once per pass (L1/L2 keep it between them). The backward also sums dweight and
//   dbias over its rows in shared memory, so dout and inp are read by one kernel only;
// - cross-entropy rows (tens of thousands of columns): one 256-thread block per row, groups of
//   8 columns per thread, block reductions through warp shuffles;
// - column sums (dbias where cuBLASLt has no BGRADB epilogue): 32 columns × 8 row lanes per
//   block, blocks split the rows into at most kMaxRowSplits groups, each group adds its partial
//   sum with one atomicAdd per column — so a column takes ≤ 64 atomics instead of one per row.
// Sums whose order differs from the CPU (block reductions, atomics) match it to float rounding,
// not bit for bit.
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/ops.h"

namespace strata::kernels::cuda {
namespace {

constexpr int kThreads = 256;     // elementwise blocks
constexpr int kRowThreads = 256;  // cross-entropy: one block per row
constexpr int kRowWarps = 8;      // LayerNorm: one warp per row, 8 rows per block
constexpr int64_t kLnGridTarget = 264;  // LayerNorm parameter gradients: blocks in all
constexpr int kColTile = 32;      // column sums: columns per block (one warp wide) ...
constexpr int kColRows = 8;       // ... times row lanes per block
constexpr int kMaxRowSplits = 64;

// Grid-stride loop over [0, n).
#define STRATA_FOR_EACH(i, n)                                                            \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// Grid-stride loop over the groups of kGroup elements of [0, n): i is a group's first element.
#define STRATA_FOR_EACH_GROUP(i, n)                                                          \
  for (int64_t i = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * kGroup; \
       i < (n); i += static_cast<int64_t>(gridDim.x) * blockDim.x * kGroup)

unsigned elementwise_grid(int64_t n) {
  return grid_for(n, kThreads);
}
unsigned group_grid(int64_t n) {
  return grid_for((n + kGroup - 1) / kGroup, kThreads);
}

// Row groups for the column sums: enough blocks to fill the GPU when there are few columns,
// never more groups than rows of kColRows.
unsigned row_splits(int64_t N) {
  return static_cast<unsigned>(std::max<int64_t>(
      1, std::min<int64_t>(kMaxRowSplits, (N + kColRows * 4 - 1) / (kColRows * 4))));
}

// ---- elementwise maps: out = op(a) or op(a, b), element by element in f32 ---------------------
// The streaming elementwise ops (casts, scaling, adds, GELU and its gradient) differ only in
// `op`; these two kernels move the groups for all of them. out may be a (each group is read, then
// written, by one thread), so add_inplace and scale_inplace run in place.

template <class TO, class TA, class Op>
__global__ void map_kernel(TO* out, const TA* a, int64_t n, bool vec, Op op) {
  STRATA_FOR_EACH_GROUP(i, n) {
    const int k = group_count(i, n);
    float v[kGroup];
    load_group(a + i, k, vec, v);
    for (int e = 0; e < kGroup; ++e) v[e] = op(v[e]);
    store_group(out + i, k, vec, v);
  }
}

template <class TO, class TA, class TB, class Op>
__global__ void map2_kernel(TO* out, const TA* a, const TB* b, int64_t n, bool vec, Op op) {
  STRATA_FOR_EACH_GROUP(i, n) {
    const int k = group_count(i, n);
    float u[kGroup], v[kGroup];
    load_group(a + i, k, vec, u);
    load_group(b + i, k, vec, v);
    for (int e = 0; e < kGroup; ++e) u[e] = op(u[e], v[e]);
    store_group(out + i, k, vec, u);
  }
}

struct Identity {
  __device__ float operator()(float x) const { return x; }
};
struct Scale {
  float s;
  __device__ float operator()(float x) const { return x * s; }
};
struct Sum {
  __device__ float operator()(float a, float b) const { return a + b; }
};

// ---- bias ------------------------------------------------------------------------------------

template <class TO, class TB>
__global__ void add_bias_kernel(TO* out, const TB* bias, int64_t N, int OC) {
  STRATA_FOR_EACH(i, N * OC) out[i] = from_float<TO>(to_float(out[i]) + to_float(bias[i % OC]));
}

// Block (kColTile, kColRows): thread (x, y) sums column blockIdx.x·kColTile + x over the rows
// y + kColRows·blockIdx.y, stepping by kColRows·gridDim.y.
template <class T>
__global__ void bias_grad_kernel(float* dbias, const T* dout, int64_t N, int OC) {
  __shared__ float part[kColRows][kColTile + 1];
  const int o = blockIdx.x * kColTile + threadIdx.x;
  float s = 0.f;
  if (o < OC)
    for (int64_t n = blockIdx.y * kColRows + threadIdx.y; n < N;
         n += static_cast<int64_t>(gridDim.y) * kColRows)
      s += to_float(dout[n * OC + o]);
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && o < OC) {
    for (int y = 1; y < kColRows; ++y) s += part[y][threadIdx.x];
    atomicAdd(&dbias[o], s);
  }
}

// ---- LayerNorm ------------------------------------------------------------------------------

// One warp per row: lane l takes the groups of columns starting at 8l, 8l + 256, ...
#define STRATA_FOR_EACH_ROW_GROUP(c, lane, C) \
  for (int c = kGroup * (lane); c < (C); c += kGroup * 32)

template <class TA, class TW>
__global__ void __launch_bounds__(kRowWarps * 32)
    layernorm_forward_kernel(TA* out, float* mean, float* rstd, const TA* inp, const TW* w,
                             const TW* b, int64_t N, int C, bool vec) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * int64_t{kRowWarps} + threadIdx.x / 32;
  if (row >= N) return;  // the whole warp: none of its lanes shuffles below
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
  const float r = 1.f / sqrtf(warp_sum(q) / C + 1e-5f);
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
// are layernorm_param_grad_kernel's.
template <class TA, class TW>
__global__ void __launch_bounds__(kRowWarps * 32)
    layernorm_backward_kernel(TA* dinp, const TA* dout, const TA* inp, const TW* w,
                              const float* mean, const float* rstd, int64_t N, int C, bool vec) {
  const int lane = threadIdx.x % 32;
  for (int64_t row = blockIdx.x * int64_t{kRowWarps} + threadIdx.x / 32; row < N;
       row += static_cast<int64_t>(gridDim.x) * kRowWarps) {
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

// The parameter gradients, column sums over the rows: dweight += Σ xhat·dy, dbias += Σ dy.
// A block covers kLnColumns columns (each lane one group of kGroup, read as 16-byte vectors
// where rows allow) and its warps take rows kRowWarps · gridDim.y apart, summing in registers;
// the warps' sums meet in shared memory and each column adds its block's sum with one atomic.
// (Summing them in the row kernel took two shared-memory atomics per element: 4.9 ms of a
// 46 ms GPT-2 124M step on an H100.)
constexpr int kLnColumns = kGroup * 32;
template <class TA>
__global__ void __launch_bounds__(kRowWarps * 32)
    layernorm_param_grad_kernel(float* dweight, float* dbias, const TA* dout, const TA* inp,
                                const float* mean, const float* rstd, int64_t N, int C, bool vec) {
  __shared__ float part[2][kRowWarps][kLnColumns];  // [dw, db][warp][column of the tile]
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int c = blockIdx.x * kLnColumns + lane * kGroup;  // this lane's group
  const int k = c < C ? group_count(c, C) : 0;
  float dw[kGroup] = {}, db[kGroup] = {};
  if (k > 0) {
    for (int64_t row = blockIdx.y * int64_t{kRowWarps} + warp; row < N;
         row += static_cast<int64_t>(gridDim.y) * kRowWarps) {
      float xv[kGroup], dyv[kGroup];
      load_group(inp + row * C + c, k, vec, xv);
      load_group(dout + row * C + c, k, vec, dyv);
      const float m = mean[row], r = rstd[row];
      for (int e = 0; e < kGroup; ++e) {  // a partial group's missing dy are 0
        dw[e] += (xv[e] - m) * r * dyv[e];
        db[e] += dyv[e];
      }
    }
  }
  for (int e = 0; e < kGroup; ++e) {
    part[0][warp][lane * kGroup + e] = dw[e];
    part[1][warp][lane * kGroup + e] = db[e];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < 2 * kLnColumns; i += blockDim.x) {
    const int which = i / kLnColumns, col = i % kLnColumns;
    const int gc = blockIdx.x * kLnColumns + col;
    if (gc >= C) continue;
    float sum = 0.f;
    for (int w2 = 0; w2 < kRowWarps; ++w2) sum += part[which][w2][col];
    atomicAdd(which == 0 ? &dweight[gc] : &dbias[gc], sum);
  }
}

#undef STRATA_FOR_EACH_ROW_GROUP

// ---- GELU (tanh approximation) ----------------------------------------------------------------
// Through 0.5·(1 + tanh(u)) = σ(2u) = 1 / (1 + e^(−2u)), as the CPU reference: one exp and no
// overflow in either tail.

constexpr float kGeluK = 0.7978845608028654f;  // √(2/π)
constexpr float kGeluC = 0.044715f;

__device__ __forceinline__ float gelu(float x) {
  return x / (1.f + expf(-2.f * kGeluK * (x + kGeluC * x * x * x)));
}
__device__ __forceinline__ float gelu_grad(float x) {
  const float s = 1.f / (1.f + expf(-2.f * kGeluK * (x + kGeluC * x * x * x)));  // σ(2u)
  // d/dx [x·σ(2u)] = σ + x·σ(1 − σ)·2k(1 + 3c·x²); w·x multiplied in one factor at a time
  // keeps every product finite in the tails (x³ alone overflows for |x| > 1e12).
  const float w = 2.f * kGeluK * s * (1.f - s);
  return s + w * x + 3.f * kGeluC * (((w * x) * x) * x);
}

struct Gelu {
  __device__ float operator()(float x) const { return gelu(x); }
};
struct GeluBackward {  // (inp, dout) -> dinp
  __device__ float operator()(float x, float g) const { return g * gelu_grad(x); }
};

// ---- embedding ------------------------------------------------------------------------------

template <class TO, class TW>
__global__ void embedding_forward_kernel(TO* out, const int32_t* tokens, const TW* wte,
                                         const TW* wpe, int64_t BS, int S, int C, int vocab_start,
                                         int V_local) {
  STRATA_FOR_EACH(i, BS * C) {
    const int64_t bs = i / C;
    const int c = static_cast<int>(i % C);
    const int t = tokens[bs] - vocab_start;
    float v = (t >= 0 && t < V_local) ? to_float(wte[static_cast<int64_t>(t) * C + c]) : 0.f;
    if (wpe) v += to_float(wpe[(bs % S) * C + c]);
    out[i] = from_float<TO>(v);
  }
}

// A token may repeat within the batch, so its row of dwte is a sum over positions: atomics.
template <class T>
__global__ void embedding_backward_kernel(float* dwte, float* dwpe, const T* dout,
                                          const int32_t* tokens, int64_t BS, int S, int C,
                                          int vocab_start, int V_local) {
  STRATA_FOR_EACH(i, BS * C) {
    const int64_t bs = i / C;
    const int c = static_cast<int>(i % C);
    const float g = to_float(dout[i]);
    const int t = tokens[bs] - vocab_start;
    if (t >= 0 && t < V_local) atomicAdd(&dwte[static_cast<int64_t>(t) * C + c], g);
    if (dwpe) atomicAdd(&dwpe[(bs % S) * C + c], g);
  }
}

// ---- cross-entropy ----------------------------------------------------------------------------

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

__global__ void ce_losses_kernel(float* losses, const float* row_max, const float* row_sumexp,
                                 const float* target_logit, int64_t N) {
  STRATA_FOR_EACH(n, N) losses[n] = logf(row_sumexp[n]) + row_max[n] - target_logit[n];
}

// No __restrict__: dlogits may alias logits (each group is read, then written, by one thread).
template <class TD, class TL>
__global__ void __launch_bounds__(kRowThreads)
    ce_backward_kernel(TD* dlogits, const TL* logits, const float* row_max, const float* row_sumexp,
                       const int32_t* targets, float scale, int ld, int vocab_start, int valid,
                       bool vec) {
  const int64_t n = blockIdx.x;
  const TL* row = logits + n * ld;  // (ld)
  TD* drow = dlogits + n * ld;      // (ld)
  const float m = row_max[n], inv = 1.f / row_sumexp[n];
  const int target = targets[n] - vocab_start;
  STRATA_FOR_EACH_COLUMN_GROUP(j, ld) {
    const int k = group_count(j, ld);
    float v[kGroup];
    load_group(row + j, k, vec, v);
    for (int e = 0; e < kGroup; ++e)
      v[e] = j + e < valid ? scale * (expf(v[e] - m) * inv - (j + e == target ? 1.f : 0.f)) : 0.f;
    store_group(drow + j, k, vec, v);
  }
}

#undef STRATA_FOR_EACH_COLUMN_GROUP

// ---- reductions -------------------------------------------------------------------------------

// Per-thread partial sums in double, a block reduction, one atomicAdd per block.
template <class T>
__global__ void __launch_bounds__(kThreads)
    sum_kernel(double* out, const T* x, int64_t n, bool square) {
  __shared__ double part[kThreads / 32];
  double s = 0;
  STRATA_FOR_EACH(i, n) {
    const double v = to_float(x[i]);
    s += square ? v * v : v;
  }
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(kFullMask, s, o);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) s += part[w];
    atomicAdd(out, s);
  }
}

// bsc (B, S, C) <-> chunks (t, B, S/t, C), one thread per element, moved as raw bits of E.
template <class E>
__global__ void seq_permute_kernel(E* bsc, E* chunks, int64_t B, int64_t S, int64_t C, int t,
                                   bool to_chunks) {
  STRATA_FOR_EACH(i, B * S * C) {
    const int64_t c = i % C, s = (i / C) % S, b = i / (C * S);
    const int64_t Sl = S / t, r = s / Sl, sl = s % Sl;
    const int64_t j = ((r * B + b) * Sl + sl) * C + c;
    if (to_chunks)
      chunks[j] = bsc[i];
    else
      bsc[i] = chunks[j];
  }
}

}  // namespace

// ---- launches ---------------------------------------------------------------------------------

cudaError_t cast(void* dst, ElemType dst_type, const void* src, ElemType src_type, int64_t n,
                 cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (dst_type == src_type)
    return cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * elem_size(dst_type),
                           cudaMemcpyDeviceToDevice, stream);
  return dispatch(dst_type, [&](auto td) {
    return dispatch(src_type, [&](auto ts) {
      using D = typename decltype(td)::type;
      using S = typename decltype(ts)::type;
      launch(map_kernel<D, S, Identity>, group_grid(n), kThreads, 0, stream,
             static_cast<D*>(dst), static_cast<const S*>(src), n,
             vec_aligned(dst) && vec_aligned(src), Identity{});
      return cudaGetLastError();
    });
  });
}

cudaError_t add_bias(void* out, ElemType out_type, const void* bias, ElemType bias_type, int64_t N,
                     int OC, cudaStream_t stream) {
  if (N * OC == 0) return cudaSuccess;
  return dispatch(out_type, [&](auto to) {
    return dispatch(bias_type, [&](auto tb) {
      using TO = typename decltype(to)::type;
      using TB = typename decltype(tb)::type;
      launch(add_bias_kernel<TO, TB>, elementwise_grid(N * OC), kThreads, 0, stream,
             static_cast<TO*>(out), static_cast<const TB*>(bias), N, OC);
      return cudaGetLastError();
    });
  });
}

cudaError_t bias_grad(float* dbias, const void* dout, ElemType dout_type, int64_t N, int OC,
                      cudaStream_t stream) {
  if (N == 0 || OC == 0) return cudaSuccess;
  const dim3 grid(grid_for(OC, kColTile), row_splits(N)), block(kColTile, kColRows);
  return dispatch(dout_type, [&](auto t) {
    using T = typename decltype(t)::type;
    launch(bias_grad_kernel<T>, grid, block, 0, stream, dbias, static_cast<const T*>(dout), N, OC);
    return cudaGetLastError();
  });
}

cudaError_t layernorm_forward(void* out, float* mean, float* rstd, const void* inp, ElemType act,
                              const void* weight, const void* bias, ElemType w_type, int64_t N,
                              int C, cudaStream_t stream) {
  if (N == 0) return cudaSuccess;
  return dispatch(act, [&](auto ta) {
    return dispatch(w_type, [&](auto tw) {
      using TA = typename decltype(ta)::type;
      using TW = typename decltype(tw)::type;
      const bool vec = vec_aligned(out) && vec_aligned(inp) && vec_aligned(weight) &&
                       vec_aligned(bias) && rows_vec_aligned(C, sizeof(TA));
      launch(layernorm_forward_kernel<TA, TW>, grid_for(N, kRowWarps), kRowWarps * 32, 0, stream,
             static_cast<TA*>(out), mean, rstd, static_cast<const TA*>(inp),
             static_cast<const TW*>(weight), static_cast<const TW*>(bias), N, C, vec);
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
      launch(layernorm_backward_kernel<TA, TW>, grid_for(N, kRowWarps), kRowWarps * 32, 0, stream,
             static_cast<TA*>(dinp), static_cast<const TA*>(dout), static_cast<const TA*>(inp),
             static_cast<const TW*>(weight), mean, rstd, N, C, vec);
      if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
      // About two blocks per SM of a 132-SM GPU in all: more row slices only add atomics.
      const unsigned tiles = static_cast<unsigned>((C + kLnColumns - 1) / kLnColumns);
      const unsigned slices = static_cast<unsigned>(std::max<int64_t>(
          1,
          std::min<int64_t>((N + kRowWarps - 1) / kRowWarps, (kLnGridTarget + tiles - 1) / tiles)));
      launch(layernorm_param_grad_kernel<TA>, dim3(tiles, slices), kRowWarps * 32, 0, stream,
             dweight, dbias, static_cast<const TA*>(dout), static_cast<const TA*>(inp), mean, rstd,
             N, C, vec);
      return cudaGetLastError();
    });
  });
}

cudaError_t gelu_forward(void* out, const void* inp, ElemType t, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return dispatch(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch(map_kernel<T, T, Gelu>, group_grid(n), kThreads, 0, stream, static_cast<T*>(out),
           static_cast<const T*>(inp), n, vec_aligned(out) && vec_aligned(inp), Gelu{});
    return cudaGetLastError();
  });
}

cudaError_t gelu_backward(void* dinp, const void* inp, const void* dout, ElemType t, int64_t n,
                          cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return dispatch(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch(map2_kernel<T, T, T, GeluBackward>, group_grid(n), kThreads, 0, stream,
           static_cast<T*>(dinp), static_cast<const T*>(inp), static_cast<const T*>(dout), n,
           vec_aligned(dinp) && vec_aligned(inp) && vec_aligned(dout), GeluBackward{});
    return cudaGetLastError();
  });
}

cudaError_t embedding_forward(void* out, ElemType out_type, const int32_t* tokens, const void* wte,
                              const void* wpe, ElemType w_type, int B, int S, int C,
                              int vocab_start, int V_local, cudaStream_t stream) {
  const int64_t BS = static_cast<int64_t>(B) * S;
  if (BS * C == 0) return cudaSuccess;
  return dispatch(out_type, [&](auto to) {
    return dispatch(w_type, [&](auto tw) {
      using TO = typename decltype(to)::type;
      using TW = typename decltype(tw)::type;
      launch(embedding_forward_kernel<TO, TW>, elementwise_grid(BS * C), kThreads, 0, stream,
             static_cast<TO*>(out), tokens, static_cast<const TW*>(wte),
             static_cast<const TW*>(wpe), BS, S, C, vocab_start, V_local);
      return cudaGetLastError();
    });
  });
}

cudaError_t embedding_backward(float* dwte, float* dwpe, const void* dout, ElemType dout_type,
                               const int32_t* tokens, int B, int S, int C, int vocab_start,
                               int V_local, cudaStream_t stream) {
  const int64_t BS = static_cast<int64_t>(B) * S;
  if (BS * C == 0) return cudaSuccess;
  return dispatch(dout_type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch(embedding_backward_kernel<T>, elementwise_grid(BS * C), kThreads, 0, stream, dwte, dwpe,
           static_cast<const T*>(dout), tokens, BS, S, C, vocab_start, V_local);
    return cudaGetLastError();
  });
}

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
                      const float* target_logit, int64_t N, cudaStream_t stream) {
  if (N == 0) return cudaSuccess;
  launch(ce_losses_kernel, elementwise_grid(N), kThreads, 0, stream, losses, row_max, row_sumexp,
         target_logit, N);
  return cudaGetLastError();
}

cudaError_t ce_backward(void* dlogits, ElemType dlogits_type, const void* logits,
                        ElemType logits_type, const float* row_max, const float* row_sumexp,
                        const int32_t* targets, float scale, int64_t N, int ld, int vocab_start,
                        int valid, cudaStream_t stream) {
  if (N == 0) return cudaSuccess;
  return dispatch(dlogits_type, [&](auto td) {
    return dispatch(logits_type, [&](auto tl) {
      using TD = typename decltype(td)::type;
      using TL = typename decltype(tl)::type;
      const bool vec = vec_aligned(dlogits) && vec_aligned(logits) &&
                       rows_vec_aligned(ld, sizeof(TD)) && rows_vec_aligned(ld, sizeof(TL));
      launch(ce_backward_kernel<TD, TL>, static_cast<unsigned>(N), kRowThreads, 0, stream,
             static_cast<TD*>(dlogits), static_cast<const TL*>(logits), row_max, row_sumexp,
             targets, scale, ld, vocab_start, valid, vec);
      return cudaGetLastError();
    });
  });
}

cudaError_t add_inplace(void* y, ElemType y_type, const void* x, ElemType x_type, int64_t n,
                        cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return dispatch(y_type, [&](auto ty) {
    return dispatch(x_type, [&](auto tx) {
      using TY = typename decltype(ty)::type;
      using TX = typename decltype(tx)::type;
      launch(map2_kernel<TY, TY, TX, Sum>, group_grid(n), kThreads, 0, stream,
             static_cast<TY*>(y), static_cast<const TY*>(y), static_cast<const TX*>(x), n,
             vec_aligned(y) && vec_aligned(x), Sum{});
      return cudaGetLastError();
    });
  });
}

cudaError_t add(void* out, ElemType out_type, const void* a, ElemType a_type, const void* b,
                ElemType b_type, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return dispatch(out_type, [&](auto to) {
    return dispatch(a_type, [&](auto ta) {
      return dispatch(b_type, [&](auto tb) {
        using TO = typename decltype(to)::type;
        using TA = typename decltype(ta)::type;
        using TB = typename decltype(tb)::type;
        launch(map2_kernel<TO, TA, TB, Sum>, group_grid(n), kThreads, 0, stream,
               static_cast<TO*>(out), static_cast<const TA*>(a), static_cast<const TB*>(b), n,
               vec_aligned(out) && vec_aligned(a) && vec_aligned(b), Sum{});
        return cudaGetLastError();
      });
    });
  });
}

cudaError_t scale_inplace(void* y, ElemType t, float s, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return dispatch(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch(map_kernel<T, T, Scale>, group_grid(n), kThreads, 0, stream, static_cast<T*>(y),
           static_cast<const T*>(y), n, vec_aligned(y), Scale{s});
    return cudaGetLastError();
  });
}

cudaError_t sum(double* out, const void* x, ElemType t, int64_t n, bool square,
                cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  // Enough blocks to fill the GPU; each thread then loops, so the atomics stay few.
  const unsigned grid = std::min(1024u, elementwise_grid(n));
  return dispatch(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch(sum_kernel<T>, grid, kThreads, 0, stream, out, static_cast<const T*>(x), n, square);
    return cudaGetLastError();
  });
}

cudaError_t seq_permute(void* bsc, void* chunks, size_t elem_bytes, int64_t B, int64_t S, int64_t C,
                        int t, bool to_chunks, cudaStream_t stream) {
  const int64_t n = B * S * C;
  if (n == 0) return cudaSuccess;
  if (elem_bytes == 2)
    launch(seq_permute_kernel<uint16_t>, elementwise_grid(n), kThreads, 0, stream,
           static_cast<uint16_t*>(bsc), static_cast<uint16_t*>(chunks), B, S, C, t, to_chunks);
  else
    launch(seq_permute_kernel<uint32_t>, elementwise_grid(n), kThreads, 0, stream,
           static_cast<uint32_t*>(bsc), static_cast<uint32_t*>(chunks), B, S, C, t, to_chunks);
  return cudaGetLastError();
}

#undef STRATA_FOR_EACH
#undef STRATA_FOR_EACH_GROUP

}  // namespace strata::kernels::cuda
