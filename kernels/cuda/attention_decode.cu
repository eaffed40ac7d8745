// attention_decode.cu — the kernels of attention_decode.h.
//
// kv_cache_append: one thread per element of qkv in a grid-stride loop; consecutive threads take
// consecutive elements of a head, so a warp reads one run of qkv and writes runs of q or a cache.
//
// attention_decode: one warp per (b, t, h) query row, kDecodeWarps rows per block. Lane l holds
// the elements l, l + 32, l + 64, l + 96 (< HS) of the query and of its output accumulator, so
// HS ≤ 128 needs four registers of each. The warp walks the keys 0 … pos0 + t of its key/value
// head in order: each key's score is a warp sum of the lanes' partial products (every lane then
// holds it), and the softmax is the online one of FlashAttention — a running maximum m, a
// running sum l of exp(s − m) and the accumulator rescaled by exp(m_old − m_new) whenever the
// maximum grows — so no score is stored and one pass over the cache suffices. The output is
// acc / l, rounded once at the store. Decode attends with T ≪ S_max queries, so the row-per-warp
// layout reads each cached key and value row as 32 lanes × consecutive elements (coalesced), and
// rows of one (b, t) that share a key/value head (GQA) read the same rows from cache.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/attention_decode.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/map.cuh"

namespace strata::kernels::cuda {
namespace {

constexpr int kWarpSize = 32;
constexpr int kDecodeWarps = 4;                           // query rows per block
constexpr int kPerLane = kDecodeMaxHeadSize / kWarpSize;  // elements per lane
static_assert(kDecodeMaxHeadSize % kWarpSize == 0, "a head is whole lanes");

template <class T>
__global__ void kv_cache_append_kernel(T* q, T* k_cache, T* v_cache, const T* qkv, int T_new,
                                       int S_max, int NH, int KVH, int HS, int pos0, int64_t n) {
  const int heads = NH + 2 * KVH;
  STRATA_FOR_EACH(e, n) {
    const int i = static_cast<int>(e % HS);
    const int64_t th = e / HS;  // (token, head)
    const int head = static_cast<int>(th % heads);
    const int64_t token = th / heads;  // b · T + t
    const T x = qkv[e];
    if (head < NH) {
      q[(token * NH + head) * HS + i] = x;
      continue;
    }
    const int64_t b = token / T_new, t = token % T_new;
    const int64_t row = (b * S_max + pos0 + t) * KVH;  // the cache position's first head
    if (head < NH + KVH)
      k_cache[(row + head - NH) * HS + i] = x;
    else
      v_cache[(row + head - NH - KVH) * HS + i] = x;
  }
}

template <class T>
__global__ void __launch_bounds__(kDecodeWarps* kWarpSize)
    attention_decode_kernel(T* out, const T* q, const T* k_cache, const T* v_cache, int T_new,
                            int S_max, int NH, int KVH, int HS, int pos0, int64_t rows,
                            float scale) {
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kDecodeWarps + threadIdx.x / kWarpSize;
  if (r >= rows) return;  // the whole warp: r is the same for its lanes
  const int h = static_cast<int>(r % NH);
  const int64_t token = r / NH;  // b · T + t
  const int64_t b = token / T_new;
  const int t = static_cast<int>(token % T_new);
  const int kvh = h / (NH / KVH);
  const int64_t kv_row = static_cast<int64_t>(KVH) * HS;  // one cache position
  const T* kb = k_cache + b * S_max * kv_row + static_cast<int64_t>(kvh) * HS;
  const T* vb = v_cache + b * S_max * kv_row + static_cast<int64_t>(kvh) * HS;

  float qr[kPerLane], acc[kPerLane];
  const T* qt = q + r * HS;  // q (B, T, NH, HS): row r
  for (int e = 0; e < kPerLane; ++e) {
    const int i = lane + e * kWarpSize;
    qr[e] = i < HS ? to_float(qt[i]) : 0.f;
    acc[e] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  const int n = pos0 + t + 1;  // keys 0 … pos0 + t
  for (int j = 0; j < n; ++j) {
    const T* kj = kb + j * kv_row;
    float dot = 0.f;
    for (int e = 0; e < kPerLane; ++e) {
      const int i = lane + e * kWarpSize;
      if (i < HS) dot += qr[e] * to_float(kj[i]);
    }
    const float s = warp_sum(dot) * scale;
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new);  // 0 for the first key (m = −∞)
    const float p = expf(s - m_new);
    l = l * corr + p;
    const T* vj = vb + j * kv_row;
    for (int e = 0; e < kPerLane; ++e) {
      const int i = lane + e * kWarpSize;
      acc[e] = acc[e] * corr + (i < HS ? p * to_float(vj[i]) : 0.f);
    }
    m = m_new;
  }
  const float inv = 1.f / l;
  T* o = out + r * HS;
  for (int e = 0; e < kPerLane; ++e) {
    const int i = lane + e * kWarpSize;
    if (i < HS) o[i] = from_float<T>(acc[e] * inv);
  }
}

bool valid_shape(int B, int T, int S_max, int NH, int KVH, int HS, int pos0) {
  return B >= 0 && T >= 0 && S_max >= 0 && NH >= 0 && KVH >= 1 && HS >= 0 && NH % KVH == 0 &&
         pos0 >= 0 && static_cast<int64_t>(pos0) + T <= S_max;
}

}  // namespace

cudaError_t kv_cache_append(void* q, void* k_cache, void* v_cache, const void* qkv, ElemType t,
                            int B, int T, int S_max, int NH, int KVH, int HS, int pos0,
                            cudaStream_t stream) {
  if (!valid_shape(B, T, S_max, NH, KVH, HS, pos0)) return cudaErrorInvalidValue;
  const int64_t n = static_cast<int64_t>(B) * T * (NH + 2 * KVH) * HS;
  if (n == 0) return cudaSuccess;
  return dispatch(t, [&](auto tag) {
    using E = typename decltype(tag)::type;
    launch(kv_cache_append_kernel<E>, elementwise_grid(n), kThreads, 0, stream, static_cast<E*>(q),
           static_cast<E*>(k_cache), static_cast<E*>(v_cache), static_cast<const E*>(qkv), T, S_max,
           NH, KVH, HS, pos0, n);
    return cudaGetLastError();
  });
}

cudaError_t attention_decode(void* out, const void* q, const void* k_cache, const void* v_cache,
                             ElemType t, int B, int T, int S_max, int NH, int KVH, int HS, int pos0,
                             cudaStream_t stream) {
  if (!valid_shape(B, T, S_max, NH, KVH, HS, pos0) || HS > kDecodeMaxHeadSize)
    return cudaErrorInvalidValue;
  const int64_t rows = static_cast<int64_t>(B) * T * NH;
  if (rows == 0 || HS == 0) return cudaSuccess;
  const float scale = 1.f / sqrtf(static_cast<float>(HS));
  return dispatch(t, [&](auto tag) {
    using E = typename decltype(tag)::type;
    launch(attention_decode_kernel<E>, grid_for(rows, kDecodeWarps), kDecodeWarps * kWarpSize, 0,
           stream, static_cast<E*>(out), static_cast<const E*>(q), static_cast<const E*>(k_cache),
           static_cast<const E*>(v_cache), T, S_max, NH, KVH, HS, pos0, rows, scale);
    return cudaGetLastError();
  });
}

}  // namespace strata::kernels::cuda
