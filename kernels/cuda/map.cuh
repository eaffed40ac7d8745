// map.cuh — what the streaming kernels of kernels/cuda share (never included by host C++): the
// elementwise block size, grid-stride loops over elements and over groups of kGroup elements,
// their grid sizes, and the two elementwise map kernels.
//
// Launch shape of the elementwise ops that stream (casts, adds, scaling, GELU; not tuned on a GPU
// yet): one thread per group of kGroup = 8 elements, moved as 16-byte vectors where the pointers
// allow (device_util.cuh), 256 threads per block, a grid-stride loop so any n works.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/device_util.cuh"

namespace strata::kernels::cuda {

constexpr int kThreads = 256;  // elementwise blocks

// Grid-stride loop over [0, n).
#define STRATA_FOR_EACH(i, n)                                                            \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// Grid-stride loop over the groups of kGroup elements of [0, n): i is a group's first element.
#define STRATA_FOR_EACH_GROUP(i, n)                                                        \
  for (int64_t i = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * kGroup; \
       i < (n); i += static_cast<int64_t>(gridDim.x) * blockDim.x * kGroup)

inline unsigned elementwise_grid(int64_t n) {
  return grid_for(n, kThreads);
}
inline unsigned group_grid(int64_t n) {
  return grid_for((n + kGroup - 1) / kGroup, kThreads);
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

}  // namespace strata::kernels::cuda
