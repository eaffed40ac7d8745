// moe.cu — the kernels of moe.h.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/map.cuh"
#include "kernels/cuda/moe.h"

namespace strata::kernels::cuda {
namespace {

constexpr int kRowThreads = 128;  // a warp per row (routing) or per assignment (dtopk_w)
constexpr int kPlanThreads = 256;
constexpr int kMaxChunks = 512;  // chunks of assignments the plan counts in (bounds its scan)
constexpr int kProbSlices = 64;  // row slices of the probability sums (fixed: the order's)

inline unsigned warps_grid(int64_t warps) {
  return grid_for(warps, kRowThreads / 32);
}

// ---- routing ------------------------------------------------------------------------------

// Lane l holds experts l, l + 32, …: slot s is expert l + 32·s, `taken` its chosen slots. Each of
// the k rounds takes the warp's largest untaken probability, equal ones by the lower expert.
template <class T>
__global__ void __launch_bounds__(kRowThreads)
    moe_route_kernel(float* probs, int32_t* topk_idx, float* topk_w, const T* logits, int64_t N,
                     int E, int k, bool renormalize) {
  const int lane = threadIdx.x % 32;
  const int64_t n = blockIdx.x * static_cast<int64_t>(kRowThreads / 32) + threadIdx.x / 32;
  if (n >= N) return;           // the whole warp
  const T* x = logits + n * E;  // (E)
  float* p = probs + n * E;     // (E)
  float mx = -INFINITY;
  for (int e = lane; e < E; e += 32) mx = fmaxf(mx, to_float(x[e]));
  mx = warp_max(mx);
  float sum = 0.f;
  for (int e = lane; e < E; e += 32) sum += expf(to_float(x[e]) - mx);
  sum = warp_sum(sum);
  for (int e = lane; e < E; e += 32) p[e] = expf(to_float(x[e]) - mx) / sum;
  uint32_t taken = 0;
  float selected = 0.f;
  for (int j = 0; j < k; ++j) {
    float best = 0.f;
    int best_e = E;  // none
    for (int s = 0, e = lane; e < E; ++s, e += 32)
      if (!((taken >> s) & 1u) && (best_e == E || p[e] > best)) best = p[e], best_e = e;
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(kFullMask, best, o);
      const int oe = __shfl_xor_sync(kFullMask, best_e, o);
      if (oe != E && (best_e == E || ob > best || (ob == best && oe < best_e)))
        best = ob, best_e = oe;
    }
    if (best_e % 32 == lane) taken |= 1u << (best_e / 32);
    selected += best;
    if (lane == 0) topk_idx[n * k + j] = best_e, topk_w[n * k + j] = best;
  }
  if (renormalize && lane == 0)
    for (int j = 0; j < k; ++j) topk_w[n * k + j] /= selected;
}

// backend.h's backward, a warp per row: the selected experts' terms are recomputed by every lane
// (k is small), dot = Σ_e p_e·dp_e over the lanes.
template <class T>
__global__ void __launch_bounds__(kRowThreads)
    moe_route_backward_kernel(T* dlogits, const float* dtopk_w, const float* dprobs_expert,
                              const float* probs, const int32_t* topk_idx, int64_t N, int E, int k,
                              bool renormalize) {
  const int lane = threadIdx.x % 32;
  const int64_t n = blockIdx.x * static_cast<int64_t>(kRowThreads / 32) + threadIdx.x / 32;
  if (n >= N) return;
  const float* p = probs + n * E;         // (E)
  const int32_t* idx = topk_idx + n * k;  // (k)
  const float* dw = dtopk_w + n * k;      // (k)
  float s = 0.f, dw_w = 0.f;
  if (renormalize) {
    for (int j = 0; j < k; ++j) s += p[idx[j]];
    for (int j = 0; j < k; ++j) dw_w += dw[j] * (p[idx[j]] / s);
  }
  auto dp = [&](int e) {
    float d = dprobs_expert ? dprobs_expert[e] : 0.f;
    for (int j = 0; j < k; ++j)
      if (idx[j] == e) d += renormalize ? (dw[j] - dw_w) / s : dw[j];
    return d;
  };
  float dot = 0.f;
  for (int e = lane; e < E; e += 32) dot += p[e] * dp(e);
  dot = warp_sum(dot);
  for (int e = lane; e < E; e += 32) dlogits[n * E + e] = from_float<T>(p[e] * (dp(e) - dot));
}

// ---- dispatch plan ------------------------------------------------------------------------
// Workspace: hist (chunks, E), then list (A), offs_count (E), offs_routed (E), all int32.

struct PlanLayout {
  int64_t A = 0, chunk = 0, chunks = 0;
};
PlanLayout plan_layout(int64_t N, int k) {
  PlanLayout l;
  l.A = N * k;
  const int64_t steps = (l.A + kPlanThreads - 1) / kPlanThreads;  // of one block
  l.chunk = kPlanThreads * std::max<int64_t>(1, (steps + kMaxChunks - 1) / kMaxChunks);
  l.chunks = (l.A + l.chunk - 1) / l.chunk;
  return l;
}

// Chunk c's assignments [c·L, (c + 1)·L), in steps of a block: each thread counts the threads
// before it in the step with its expert (the shared list of the step's experts), and the last of
// them adds the step's count to the expert's running count. place false: the chunk's counts per
// expert go to hist[c]. place true: hist[c] holds each expert's assignments in the chunks before,
// so running count + rank is the assignment's position among its expert's, in flat order; it
// becomes its row (dropless, or an expert within its capacity) or goes to the expert's list for
// moe_plan_drop_kernel.
__global__ void __launch_bounds__(kPlanThreads)
    moe_plan_rank_kernel(bool place, int32_t* hist, int32_t* dest_row, int32_t* list,
                         const int32_t* topk_idx, int64_t A, int64_t L, int E, int64_t capacity,
                         const int32_t* routed, const int32_t* offs_count,
                         const int32_t* offs_routed) {
  __shared__ int count[kMoeMaxExperts];
  __shared__ int step_expert[kPlanThreads];
  const int t = threadIdx.x;
  const int64_t c = blockIdx.x;
  for (int e = t; e < E; e += kPlanThreads) count[e] = place ? hist[c * E + e] : 0;
  __syncthreads();
  const int64_t a1 = (c + 1) * L < A ? (c + 1) * L : A;
  for (int64_t base = c * L; base < a1; base += kPlanThreads) {
    const int64_t a = base + t;
    const int e = a < a1 ? topk_idx[a] : -1;
    step_expert[t] = e;
    __syncthreads();
    int before = 0;
    bool last = true;
    for (int u = 0; u < kPlanThreads; ++u)
      if (step_expert[u] == e) {
        before += u < t;
        last = last && u <= t;
      }
    if (e >= 0 && place) {
      const int pos = count[e] + before;
      if (capacity < 0 || routed[e] <= capacity)
        dest_row[a] = offs_count[e] + pos;
      else
        list[offs_routed[e] + pos] = static_cast<int32_t>(a);
    }
    __syncthreads();  // every count read before any is updated
    if (e >= 0 && last) count[e] += before + 1;
    __syncthreads();
  }
  if (!place)
    for (int e = t; e < E; e += kPlanThreads) hist[c * E + e] = count[e];
}

// One block: per expert, the chunk counts become exclusive prefixes (in place), their total is
// routed, its capacity-bound part counts; then the experts' offsets in the dropless list and in
// the layout.
__global__ void __launch_bounds__(kPlanThreads)
    moe_plan_scan_kernel(int32_t* hist, int32_t* counts, int32_t* routed, int32_t* offs_count,
                         int32_t* offs_routed, int64_t chunks, int E, int64_t capacity) {
  for (int e = threadIdx.x; e < E; e += kPlanThreads) {
    int run = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      const int h = hist[c * E + e];
      hist[c * E + e] = run;
      run += h;
    }
    routed[e] = run;
    counts[e] = capacity < 0 || run <= capacity ? run : static_cast<int>(capacity);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int oc = 0, orr = 0;
    for (int e = 0; e < E; ++e) {
      offs_count[e] = oc, offs_routed[e] = orr;
      oc += counts[e], orr += routed[e];
    }
  }
}

// The exclusive prefix of v over the block's threads (kPlanThreads), and its total.
__device__ int block_exclusive_scan(int v, int* total) {
  __shared__ int buf[kPlanThreads];
  const int t = threadIdx.x;
  buf[t] = v;
  __syncthreads();
  for (int o = 1; o < kPlanThreads; o <<= 1) {
    const int add = t >= o ? buf[t - o] : 0;
    __syncthreads();
    buf[t] += add;
    __syncthreads();
  }
  *total = buf[kPlanThreads - 1];
  const int inclusive = buf[t];
  __syncthreads();  // before the next call overwrites buf
  return inclusive - v;
}

// A float's bits as an unsigned key of the same order (non-NaN; −0 sorts just below +0, which no
// routing weight is).
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// One block per expert; only experts routed more than `capacity` assignments work. A radix
// select (four passes of 8 bits, counted in shared memory) finds the key of the capacity-th
// largest weight and how many of the keys equal to it are kept; then one ordered pass over the
// expert's list (token order) keeps the larger weights and the first `need` equal ones, and gives
// the kept ones consecutive rows.
__global__ void __launch_bounds__(kPlanThreads)
    moe_plan_drop_kernel(int32_t* dest_row, const int32_t* list, const float* topk_w,
                         const int32_t* routed, const int32_t* offs_count,
                         const int32_t* offs_routed, int64_t capacity) {
  __shared__ int bins[256];
  __shared__ uint32_t chosen_prefix;
  __shared__ int chosen_need;
  const int e = blockIdx.x, t = threadIdx.x;
  const int m = routed[e];
  if (m <= capacity) return;                    // the whole block
  const int32_t* mine = list + offs_routed[e];  // (m) flat indices, token order
  uint32_t prefix = 0, mask = 0;
  int need = static_cast<int>(capacity);  // among the keys matching prefix on mask
  if (capacity > 0) {
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int b = t; b < 256; b += kPlanThreads) bins[b] = 0;
      __syncthreads();
      for (int i = t; i < m; i += kPlanThreads) {
        const uint32_t key = order_key(topk_w[mine[i]]);
        if ((key & mask) == prefix) atomicAdd(&bins[(key >> shift) & 255u], 1);
      }
      __syncthreads();
      if (t == 0) {
        int b = 255, left = need;
        while (left > bins[b]) left -= bins[b--];
        chosen_prefix = prefix | (static_cast<uint32_t>(b) << shift);
        chosen_need = left;
      }
      __syncthreads();
      prefix = chosen_prefix, need = chosen_need, mask |= 255u << shift;
      __syncthreads();  // read before the next pass writes them
    }
  }
  int eq_seen = 0, kept_seen = 0;
  for (int base = 0; base < m; base += kPlanThreads) {
    const int i = base + t;
    int greater = 0, equal = 0;
    if (i < m && capacity > 0) {
      const uint32_t key = order_key(topk_w[mine[i]]);
      greater = key > prefix, equal = key == prefix;
    }
    int eq_total = 0, kept_total = 0;
    const int eq_before = eq_seen + block_exclusive_scan(equal, &eq_total);
    const int keep = greater || (equal && eq_before < need);
    const int kept_before = kept_seen + block_exclusive_scan(keep, &kept_total);
    if (i < m) dest_row[mine[i]] = keep ? offs_count[e] + kept_before : -1;
    eq_seen += eq_total, kept_seen += kept_total;
  }
}

// ---- permutations -------------------------------------------------------------------------

template <class E>
__global__ void moe_permute_kernel(E* xp, const E* x, const int32_t* dest_row, int64_t N, int k,
                                   int64_t C) {
  STRATA_FOR_EACH(i, N * k * C) {
    const int64_t a = i / C, c = i % C;
    const int32_t d = dest_row[a];
    if (d >= 0) xp[d * C + c] = x[(a / k) * C + c];
  }
}

// Per token and group of kGroup columns: Σ_j w_j · rows[dest_row[n, j]] in j order (w_j = 1 when
// weights is null), stored into out[n].
template <class T>
__global__ void moe_gather_kernel(T* out, const T* rows, const int32_t* dest_row,
                                  const float* weights, int64_t N, int k, int64_t C, bool vec) {
  const int64_t groups = (C + kGroup - 1) / kGroup;
  STRATA_FOR_EACH(i, N * groups) {
    const int64_t n = i / groups, c = (i % groups) * kGroup;
    const int cnt = group_count(c, C);
    float acc[kGroup] = {};
    for (int j = 0; j < k; ++j) {
      const int32_t d = dest_row[n * k + j];
      if (d < 0) continue;
      const float w = weights ? weights[n * k + j] : 1.f;
      float v[kGroup];
      load_group(rows + d * C + c, cnt, vec, v);
      for (int e = 0; e < kGroup; ++e) acc[e] += w * v[e];
    }
    store_group(out + n * C + c, cnt, vec, acc);
  }
}

// dy[dest_row[a]] = topk_w[a] · dout[a / k], per assignment and group of columns.
template <class T>
__global__ void moe_scatter_grad_kernel(T* dy, const T* dout, const int32_t* dest_row,
                                        const float* topk_w, int64_t N, int k, int64_t C,
                                        bool vec) {
  const int64_t groups = (C + kGroup - 1) / kGroup;
  STRATA_FOR_EACH(i, N * k * groups) {
    const int64_t a = i / groups, c = (i % groups) * kGroup;
    const int32_t d = dest_row[a];
    if (d < 0) continue;
    const int cnt = group_count(c, C);
    float v[kGroup];
    load_group(dout + (a / k) * C + c, cnt, vec, v);
    for (int e = 0; e < kGroup; ++e) v[e] *= topk_w[a];
    store_group(dy + d * C + c, cnt, vec, v);
  }
}

// dtopk_w[a] = dout[a / k] · y[dest_row[a]], a warp per assignment.
template <class T>
__global__ void __launch_bounds__(kRowThreads)
    moe_weight_grad_kernel(float* dtopk_w, const T* dout, const T* y, const int32_t* dest_row,
                           int64_t N, int k, int64_t C) {
  const int lane = threadIdx.x % 32;
  const int64_t a = blockIdx.x * static_cast<int64_t>(kRowThreads / 32) + threadIdx.x / 32;
  if (a >= N * k) return;
  const int32_t d = dest_row[a];
  float dot = 0.f;
  if (d >= 0)
    for (int64_t c = lane; c < C; c += 32)
      dot += to_float(dout[(a / k) * C + c]) * to_float(y[d * C + c]);
  dot = warp_sum(dot);
  if (lane == 0) dtopk_w[a] = dot;
}

// ---- probability sums -----------------------------------------------------------------------

// Block (32, 8) over 32 columns and row slice blockIdx.y: each thread sums every 8th row of the
// slice, then row 0 of the block adds the 8 partial sums in order.
__global__ void __launch_bounds__(256)
    moe_prob_slices_kernel(double* partial, const float* probs, int64_t N, int E) {
  __shared__ double part[8][32];
  const int e = blockIdx.x * 32 + threadIdx.x;
  const int64_t per = (N + kProbSlices - 1) / kProbSlices;
  const int64_t r0 = blockIdx.y * per, r1 = r0 + per < N ? r0 + per : N;
  double s = 0;
  if (e < E)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) s += probs[r * E + e];
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && e < E) {
    double total = 0;
    for (int y = 0; y < 8; ++y) total += part[y][threadIdx.x];
    partial[blockIdx.y * static_cast<int64_t>(E) + e] = total;
  }
}

__global__ void moe_prob_total_kernel(float* sums, const double* partial, int E) {
  STRATA_FOR_EACH(e, E) {
    double total = 0;
    for (int s = 0; s < kProbSlices; ++s) total += partial[s * static_cast<int64_t>(E) + e];
    sums[e] = static_cast<float>(total);
  }
}

}  // namespace

cudaError_t moe_route(float* probs, int32_t* topk_idx, float* topk_w, const void* logits,
                      ElemType act, int64_t N, int E, int k, bool renormalize,
                      cudaStream_t stream) {
  if (N == 0) return cudaSuccess;
  if (E < 1 || E > kMoeMaxExperts || k < 1 || k > E) return cudaErrorInvalidValue;
  return dispatch(act, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch(moe_route_kernel<T>, warps_grid(N), kRowThreads, 0, stream, probs, topk_idx, topk_w,
           static_cast<const T*>(logits), N, E, k, renormalize);
    return cudaGetLastError();
  });
}

cudaError_t moe_route_backward(void* dlogits, ElemType act, const float* dtopk_w,
                               const float* dprobs_expert, const float* probs,
                               const int32_t* topk_idx, int64_t N, int E, int k, bool renormalize,
                               cudaStream_t stream) {
  if (N == 0) return cudaSuccess;
  return dispatch(act, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch(moe_route_backward_kernel<T>, warps_grid(N), kRowThreads, 0, stream,
           static_cast<T*>(dlogits), dtopk_w, dprobs_expert, probs, topk_idx, N, E, k, renormalize);
    return cudaGetLastError();
  });
}

size_t moe_dispatch_plan_workspace_bytes(int64_t N, int k, int E) {
  const PlanLayout l = plan_layout(N, k);
  return sizeof(int32_t) * static_cast<size_t>(l.chunks * E + l.A + 2 * int64_t{E});
}

cudaError_t moe_dispatch_plan(int32_t* dest_row, int32_t* counts, int32_t* routed,
                              const int32_t* topk_idx, const float* topk_w, int64_t N, int k, int E,
                              int64_t capacity, void* workspace, cudaStream_t stream) {
  if (E < 1 || E > kMoeMaxExperts || k < 1) return cudaErrorInvalidValue;
  const PlanLayout l = plan_layout(N, k);
  int32_t* hist = static_cast<int32_t*>(workspace);  // (chunks, E)
  int32_t* list = hist + l.chunks * E;               // (A)
  int32_t* offs_count = list + l.A;                  // (E)
  int32_t* offs_routed = offs_count + E;             // (E)
  const unsigned chunks = static_cast<unsigned>(l.chunks);
  if (chunks > 0)
    launch(moe_plan_rank_kernel, chunks, kPlanThreads, 0, stream, false, hist, dest_row, list,
           topk_idx, l.A, l.chunk, E, capacity, routed, offs_count, offs_routed);
  launch(moe_plan_scan_kernel, 1, kPlanThreads, 0, stream, hist, counts, routed, offs_count,
         offs_routed, l.chunks, E, capacity);
  if (chunks > 0)
    launch(moe_plan_rank_kernel, chunks, kPlanThreads, 0, stream, true, hist, dest_row, list,
           topk_idx, l.A, l.chunk, E, capacity, routed, offs_count, offs_routed);
  if (chunks > 0 && capacity >= 0)
    launch(moe_plan_drop_kernel, static_cast<unsigned>(E), kPlanThreads, 0, stream, dest_row, list,
           topk_w, routed, offs_count, offs_routed, capacity);
  return cudaGetLastError();
}

cudaError_t moe_permute(void* xp, const void* x, size_t elem_bytes, const int32_t* dest_row,
                        int64_t N, int k, int64_t C, cudaStream_t stream) {
  const int64_t n = N * k * C;
  if (n == 0) return cudaSuccess;
  if (elem_bytes == 2)
    launch(moe_permute_kernel<uint16_t>, elementwise_grid(n), kThreads, 0, stream,
           static_cast<uint16_t*>(xp), static_cast<const uint16_t*>(x), dest_row, N, k, C);
  else
    launch(moe_permute_kernel<uint32_t>, elementwise_grid(n), kThreads, 0, stream,
           static_cast<uint32_t*>(xp), static_cast<const uint32_t*>(x), dest_row, N, k, C);
  return cudaGetLastError();
}

cudaError_t moe_permute_backward(void* dx, const void* dxp, ElemType act, const int32_t* dest_row,
                                 int64_t N, int k, int64_t C, cudaStream_t stream) {
  return moe_unpermute(dx, dxp, act, dest_row, nullptr, N, k, C, stream);
}

cudaError_t moe_unpermute(void* out, const void* y, ElemType act, const int32_t* dest_row,
                          const float* topk_w, int64_t N, int k, int64_t C, cudaStream_t stream) {
  if (N * C == 0) return cudaSuccess;
  const bool vec = vec_aligned(out) && vec_aligned(y) && rows_vec_aligned(C, elem_size(act));
  return dispatch(act, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch(moe_gather_kernel<T>, group_grid(N * C), kThreads, 0, stream, static_cast<T*>(out),
           static_cast<const T*>(y), dest_row, topk_w, N, k, C, vec);
    return cudaGetLastError();
  });
}

cudaError_t moe_unpermute_backward(void* dy, float* dtopk_w, const void* dout, const void* y,
                                   ElemType act, const int32_t* dest_row, const float* topk_w,
                                   int64_t N, int k, int64_t C, cudaStream_t stream) {
  if (N == 0) return cudaSuccess;
  const bool vec = vec_aligned(dy) && vec_aligned(dout) && rows_vec_aligned(C, elem_size(act));
  return dispatch(act, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (C > 0)
      launch(moe_scatter_grad_kernel<T>, group_grid(N * k * C), kThreads, 0, stream,
             static_cast<T*>(dy), static_cast<const T*>(dout), dest_row, topk_w, N, k, C, vec);
    launch(moe_weight_grad_kernel<T>, warps_grid(N * k), kRowThreads, 0, stream, dtopk_w,
           static_cast<const T*>(dout), static_cast<const T*>(y), dest_row, N, k, C);
    return cudaGetLastError();
  });
}

size_t moe_prob_sums_workspace_bytes(int E) {
  return sizeof(double) * static_cast<size_t>(kProbSlices) * E;
}

cudaError_t moe_prob_sums(float* sums, const float* probs, int64_t N, int E, void* workspace,
                          cudaStream_t stream) {
  if (E == 0) return cudaSuccess;
  double* partial = static_cast<double*>(workspace);  // (slices, E)
  launch(moe_prob_slices_kernel, dim3(grid_for(E, 32), kProbSlices), dim3(32, 8), 0, stream,
         partial, probs, N, E);
  launch(moe_prob_total_kernel, elementwise_grid(E), kThreads, 0, stream, sums, partial, E);
  return cudaGetLastError();
}

}  // namespace strata::kernels::cuda
