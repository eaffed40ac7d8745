// flash_attention_tc.h — the bf16 tensor-core kernels behind flash_attention.h (internal: only
// flash_attention.cu calls these; it validates shapes, allocates the backward's scratch and runs
// the backward's D pre-pass and dq pass, which both kernel families share).
//
// Same layouts, masks and results as flash_attention.h's, for bf16 qkv/out/dout/dqkv; every product
// runs on bf16 tensor cores (mma.sync, kernels/cuda/mma.cuh) with f32 accumulation, and the
// softmax, the running max and sum, lse and the gradients' accumulation stay in f32. As in
// FlashAttention-2, the probabilities P and the score gradients dS are rounded to bf16 once,
// where they become the next product's operand.
#pragma once

#include <cuda_runtime_api.h>

#include <type_traits>

#include "kernels/cuda/flash_attention.h"

namespace strata::kernels::cuda {

// Runs f(std::integral_constant<int, HS_MAX>{}) for the smallest kernel size (32, 64 or 128)
// that holds head size HS: both kernel families are compiled for those three.
template <class F>
cudaError_t with_head_size(int HS, F&& f) {
  if (HS <= 32) return f(std::integral_constant<int, 32>{});
  if (HS <= 64) return f(std::integral_constant<int, 64>{});
  return f(std::integral_constant<int, 128>{});
}

// out (B, S, NH, HS) bf16 and lse (B, NH, S) f32 from qkv (B, S, NH + 2·KVH, HS) bf16, with
// `warp_rows` query rows per warp: 0 for the default (32 above head size 64, else 16), 16 or
// 32; any other value returns cudaErrorInvalidValue.
cudaError_t flash_tc_forward(void* out, float* lse, const void* qkv, int B, int S, int NH, int KVH,
                             int HS, int warp_rows, cudaStream_t stream, FlashMask mask);

// The dk, dv parts of dqkv = their gradients (each key/value head summed over its NH / KVH
// query heads, assigned); dq_acc (B, S, NH, HS) f32 += the unrounded dq, which
// flash_attention.cu then stores into dqkv. dsum (B, NH, S) = rowsum(dout ∘ out).
cudaError_t flash_tc_backward(void* dqkv, float* dq_acc, const void* dout, const void* qkv,
                              const float* lse, const float* dsum, int B, int S, int NH, int KVH,
                              int HS, cudaStream_t stream, FlashMask mask);

}  // namespace strata::kernels::cuda
