// rope.cu — the kernel of rope.h: one thread per rotated pair (token, head, i < HS/2), in a
// grid-stride loop. Consecutive threads take consecutive i of one head, so a warp reads and
// writes two runs of consecutive elements (x[i], x[i + HS/2]) and one run of each table half.
// The forward and the backward differ only in the sign of the sine (the inverse rotation).
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/map.cuh"
#include "kernels/cuda/rope.h"

namespace strata::kernels::cuda {
namespace {

// sin_sign +1: the rotation (forward); −1: its transpose (backward).
template <class T>
__global__ void rope_kernel(T* qkv, const float* cos_sin, int S, int rotated_heads, int all_heads,
                            int HS, int64_t pairs, float sin_sign) {
  const int half = HS / 2;
  STRATA_FOR_EACH(p, pairs) {
    const int i = static_cast<int>(p % half);
    const int64_t th = p / half;  // (token, rotated head)
    const int64_t token = th / rotated_heads;
    const int head = static_cast<int>(th % rotated_heads);
    const int s = static_cast<int>(token % S);
    T* x = qkv + (token * all_heads + head) * HS;  // (HS)
    const float c = cos_sin[static_cast<int64_t>(s) * HS + i];
    const float sn = sin_sign * cos_sin[static_cast<int64_t>(s) * HS + half + i];
    const float x0 = to_float(x[i]), x1 = to_float(x[i + half]);
    x[i] = from_float<T>(x0 * c - x1 * sn);
    x[i + half] = from_float<T>(x1 * c + x0 * sn);
  }
}

cudaError_t rope(void* qkv, ElemType t, const float* cos_sin, int B, int S, int NH, int KVH, int HS,
                 float sin_sign, cudaStream_t stream) {
  if (B < 0 || S < 0 || NH < 0 || KVH < 1 || HS < 0 || HS % 2 != 0) return cudaErrorInvalidValue;
  const int64_t pairs = static_cast<int64_t>(B) * S * (NH + KVH) * (HS / 2);
  if (pairs == 0) return cudaSuccess;
  return dispatch(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch(rope_kernel<T>, elementwise_grid(pairs), kThreads, 0, stream, static_cast<T*>(qkv),
           cos_sin, S, NH + KVH, NH + 2 * KVH, HS, pairs, sin_sign);
    return cudaGetLastError();
  });
}

}  // namespace

cudaError_t rope_forward(void* qkv, ElemType t, const float* cos_sin, int B, int S, int NH, int KVH,
                         int HS, cudaStream_t stream) {
  return rope(qkv, t, cos_sin, B, S, NH, KVH, HS, 1.f, stream);
}

cudaError_t rope_backward(void* dqkv, ElemType t, const float* cos_sin, int B, int S, int NH,
                          int KVH, int HS, cudaStream_t stream) {
  return rope(dqkv, t, cos_sin, B, S, NH, KVH, HS, -1.f, stream);
}

}  // namespace strata::kernels::cuda
