// attention_block.cu — attention_block.h's elementwise pieces: the log-sum-exp merge of a block
// into the running rows (one warp per row of a head), the key/value extraction a ring step sends
// and the assembly of the q/k/v gradient from the f32 accumulators (one thread per element).
// The block forward, backward and delta run on the flash kernels (flash_attention.cu).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention_block.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/map.cuh"

namespace strata::kernels::cuda {
namespace {

// Rows (b, i, h) for i in [r0, r0 + rows), one warp each: every lane reads the two lse values and
// computes the weights, the head's HS elements are spread over the lanes, lane 0 stores the lse.
template <class T>
__global__ void merge_kernel(T* out, float* lse, const T* out_b, const float* lse_b, int B, int S,
                             int NH, int HS, int r0, int rows) {
  const int64_t n = static_cast<int64_t>(B) * rows * NH;
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
  for (int64_t w = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32; w < n;
       w += warps) {
    const int64_t h = w % NH, i = r0 + (w / NH) % rows, b = w / (static_cast<int64_t>(NH) * rows);
    const int64_t at = (b * NH + h) * S + i;
    float la = lse[at];
    const float lb = lse_b[at];
    // Every lane has read the row's lse before lane 0 rewrites it: the shuffle (of equal values)
    // is the warp's meeting point.
    la = __shfl_xor_sync(kFullMask, la, 16);
    if (lb == -INFINITY) continue;  // the block saw no key of this row
    const int64_t row = (b * S + i) * NH * HS + h * HS;
    float wa = 0.f, wb = 1.f, l = lb;
    if (la != -INFINITY) {
      const float m = fmaxf(la, lb);
      l = m + logf(expf(la - m) + expf(lb - m));
      wa = expf(la - l);
      wb = expf(lb - l);
    }
    for (int d = lane; d < HS; d += 32)
      out[row + d] = from_float<T>(wa * to_float(out[row + d]) + wb * to_float(out_b[row + d]));
    if (lane == 0) lse[at] = l;
  }
}

// dst (tokens, n) = src's columns [q, q + n) of its rows of `width`, as raw bits of E.
template <class E>
__global__ void columns_kernel(E* dst, const E* src, int64_t tokens, int64_t width, int64_t q,
                               int64_t n) {
  STRATA_FOR_EACH(i, tokens * n) {
    dst[i] = src[(i / n) * width + q + i % n];
  }
}

// dqkv (tokens, q + n) = [dq | dkv], rounded to T.
template <class T>
__global__ void assemble_kernel(T* dqkv, const float* dq, const float* dkv, int64_t tokens,
                                int64_t q, int64_t n) {
  const int64_t w = q + n;
  STRATA_FOR_EACH(i, tokens * w) {
    const int64_t t = i / w, c = i % w;
    dqkv[i] = from_float<T>(c < q ? dq[t * q + c] : dkv[t * n + c - q]);
  }
}

}  // namespace

cudaError_t attention_block_merge(void* out, float* lse, const void* out_b, const float* lse_b,
                                  ElemType type, int B, int S, int NH, int HS, int r0, int rows,
                                  cudaStream_t stream) {
  if (B < 0 || S < 0 || NH < 0 || HS < 1 || r0 < 0 || rows < 0 || r0 + rows > S)
    return cudaErrorInvalidValue;
  const int64_t n = static_cast<int64_t>(B) * rows * NH;
  if (n == 0) return cudaSuccess;
  return dispatch(type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch(merge_kernel<T>, grid_for(n * 32, kThreads), kThreads, 0, stream, static_cast<T*>(out),
           lse, static_cast<const T*>(out_b), lse_b, B, S, NH, HS, r0, rows);
    return cudaGetLastError();
  });
}

cudaError_t attention_kv_extract(void* kv, const void* qkv, ElemType type, int64_t tokens,
                                 int64_t width, int64_t q, cudaStream_t stream) {
  if (tokens < 0 || q < 0 || width < q) return cudaErrorInvalidValue;
  const int64_t n = width - q;
  if (tokens * n == 0) return cudaSuccess;
  if (elem_size(type) == 2)
    launch(columns_kernel<uint16_t>, elementwise_grid(tokens * n), kThreads, 0, stream,
           static_cast<uint16_t*>(kv), static_cast<const uint16_t*>(qkv), tokens, width, q, n);
  else
    launch(columns_kernel<uint32_t>, elementwise_grid(tokens * n), kThreads, 0, stream,
           static_cast<uint32_t*>(kv), static_cast<const uint32_t*>(qkv), tokens, width, q, n);
  return cudaGetLastError();
}

cudaError_t attention_qkv_assemble(void* dqkv, const float* dq, const float* dkv, ElemType type,
                                   int64_t tokens, int64_t q, int64_t n, cudaStream_t stream) {
  if (tokens < 0 || q < 0 || n < 0) return cudaErrorInvalidValue;
  if (tokens * (q + n) == 0) return cudaSuccess;
  return dispatch(type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch(assemble_kernel<T>, elementwise_grid(tokens * (q + n)), kThreads, 0, stream,
           static_cast<T*>(dqkv), dq, dkv, tokens, q, n);
    return cudaGetLastError();
  });
}

}  // namespace strata::kernels::cuda
