// flash_rows.cuh — device helpers on flash_attention.h's FlashRows, shared by the f32 and the
// bf16 tensor-core flash kernels (internal to kernels/cuda/flash_attention*.cu).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/flash_attention.h"

namespace strata::kernels::cuda {

// The real keys of sequence b among the call's Sk: all of them, or those before
// key_len[b] − k_offset (none when that is ≤ 0: a ring block wholly in the padding).
__device__ __forceinline__ int real_keys(const FlashRows& r, int b) {
  if (r.key_len == nullptr) return r.Sk;
  return max(0, min(r.Sk, r.key_len[b] - r.k_offset));
}

// Rows [q0, q0 + n) of head h of sequence b when the call has no real key for them: out 0 and
// lse −inf (the empty block that attention_block_merge skips). Called by a whole thread block.
template <class T>
__device__ void empty_rows(T* out, float* lse, const FlashRows& r, int b, int h, int q0, int n) {
  for (int idx = threadIdx.x; idx < n * r.HS; idx += blockDim.x) {
    const int i = q0 + idx / r.HS, d = idx % r.HS;
    if (i < r.Sq)
      out[b * r.o_batch + i * r.o_ld + static_cast<int64_t>(h) * r.HS + d] = from_float<T>(0.f);
  }
  for (int i = threadIdx.x; i < n; i += blockDim.x)
    if (q0 + i < r.Sq) lse[(static_cast<int64_t>(b) * r.NH + h) * r.lse_ld + q0 + i] = -INFINITY;
}

}  // namespace strata::kernels::cuda
