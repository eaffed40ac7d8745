// flash_attention_tc.h — the bf16 tensor-core kernels behind flash_attention.h and
// attention_block.h (internal: only flash_attention.cu calls these; it validates shapes, allocates
// the backward's scratch and runs the backward's D pre-pass and dq pass, which both kernel families
// share).
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

// The bf16 tensor-core kernels on the rows of r (flash_attention.h's FlashRows; q and k point at
// row 0, head 0 of the query and key operands). Forward: out (bf16) and lse assigned, with
// `warp_rows` query rows per warp: 0 for the default (32 above head size 64, else 16), 16 or 32.
cudaError_t flash_tc_forward(void* out, float* lse, const void* q, const void* k,
                             const FlashRows& r, int warp_rows, cudaStream_t stream);

// Backward given D (dsum): dq += into the f32 accumulator dq_acc (laid out as out); dk and dv
// either assigned in bf16 into dk_out (add false: the q/k/v gradient, laid out as k) or added in
// f32 (add true: a ring block's f32 key/value gradient, laid out as k).
cudaError_t flash_tc_backward(void* dk_out, bool add, float* dq_acc, const void* dout,
                              const void* q, const void* k, const float* lse, const float* dsum,
                              const FlashRows& r, cudaStream_t stream);

}  // namespace strata::kernels::cuda
