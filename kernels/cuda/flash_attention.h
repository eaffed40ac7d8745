// flash_attention.h — fused grouped-query attention (flash-style), causal or bidirectional over
// the real keys of padded sequences (FlashMask): the S×S score and probability matrices are
// never stored, only the log-sum-exp of each score row.
//
// Layouts (this rank's heads; row-major), runtime/backend/backend.h's:
//   qkv  (B, S, NH + 2·KVH, HS)  per token: the NH query heads, then the KVH key heads, then the
//                                KVH value heads; query head h attends with key/value head
//                                h / (NH / KVH) (KVH = NH: multi-head, (B, S, 3, NH, HS))
//   out  (B, S, NH, HS)
//   lse  (B, NH, S) f32     log Σ_j exp(scale · q_i·k_j) over the keys j query i sees,
//                           scale = 1/√HS
// qkv, out, dout and dqkv share one element type (f32 or bf16); every product is summed in f32
// and results are rounded once, at the store. f32 runs on CUDA cores in true f32
// (flash_attention.cu); bf16 on tensor cores (flash_attention_tc.cu), where, as in
// FlashAttention-2, the probabilities and score gradients are also rounded to bf16 where they
// become an operand of the next product.
//
// Limits: KVH ≥ 1 dividing NH (a head count that does not divide is refused, never rounded);
// 1 ≤ HS ≤ kFlashMaxHeadSize (head sizes 32, 64 and 128 run on kernels sized for them,
// any other size on the next larger one); any S ≥ 1. Other shapes return cudaErrorInvalidValue
// before launching anything. The kernels need up to ~163 KiB of shared memory per block (HS in
// (64, 128], f32 backward) and the bf16 ones tensor cores, which sm_80 and sm_90 provide.
//
// Thread-safety: none needed (no state); calls are ordered by their stream.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/elem_type.h"

namespace strata::kernels::cuda {

constexpr int kFlashMaxHeadSize = 128;

// Which keys query i of sequence b sees: j ≤ i when causal (else every j), and j < key_len[b]
// when key_len — (B) int32 on the device, each in [1, S] — is given (the rest is padding: never
// attended, gradient 0). Every query row is computed, padded ones included.
struct FlashMask {
  bool causal = true;
  const int32_t* key_len = nullptr;
};

// Where one call's operands lie, in elements of their type, so that the same kernels serve the
// whole sequences of a q/k/v tensor (the calls below) and one block of ring attention
// (attention_block.h). Row i of sequence b of query head h is q + b·q_batch + i·q_ld + h·HS; key
// head hk's row j is k + b·k_batch + j·k_ld + hk·HS and its value row lies KVH·HS after it (the
// layouts of q/k/v and of a ring's key/value block alike); out, dout and the f32 dq
// accumulator lie as o (row i of head h at b·o_batch + i·o_ld + h·HS); the log-sum-exp and D of
// row (b, h, i) at (b·NH + h)·lse_ld + i. A block has Sq query and Sk key rows a sequence;
// causal needs Sq = Sk (the same positions). Key j of sequence b is padding when key_len and
// k_offset + j ≥ key_len[b] (a block whose keys are all padding for a row leaves it empty:
// out 0 and lse −inf).
struct FlashRows {
  int B = 0, Sq = 0, Sk = 0, NH = 0, KVH = 0, HS = 0;
  int64_t q_ld = 0, q_batch = 0, k_ld = 0, k_batch = 0, o_ld = 0, o_batch = 0, lse_ld = 0;
  bool causal = true;
  const int32_t* key_len = nullptr;
  int k_offset = 0;
};
// The whole sequences of a (B, S, NH + 2·KVH, HS) q/k/v with its (B, S, NH, HS) out and (B, NH,
// S) lse: the rows of the calls below (k: the q/k/v's first key head, NH·HS elements in).
FlashRows whole_sequence_rows(int B, int S, int NH, int KVH, int HS, FlashMask mask);

// out = softmax(scale · q·kᵀ, mask) · v, and the per-row log-sum-exp for the backward.
cudaError_t flash_attention_forward(void* out, float* lse, const void* qkv, ElemType type, int B,
                                    int S, int NH, int KVH, int HS, cudaStream_t stream,
                                    FlashMask mask = {});

// The bf16 forward with `warp_rows` query rows per warp, 16 or 32 (the default is 32 for head
// sizes above 64, else 16: measured): the same results, for bench_cuda_kernels to measure the
// choice side by side. Other values return cudaErrorInvalidValue.
cudaError_t flash_attention_forward_bf16_warp_rows(void* out, float* lse, const void* qkv, int B,
                                                   int S, int NH, int KVH, int HS, int warp_rows,
                                                   cudaStream_t stream, FlashMask mask = {});

// Bytes of device scratch the backward needs: an f32 (B, S, NH, HS) accumulator for dq and the
// (B, NH, S) row sums D = rowsum(dout ∘ out). Both are per query head, so KVH does not change
// the size; it is taken so that every call names the same shape.
size_t flash_attention_backward_scratch_bytes(int B, int S, int NH, int KVH, int HS);

// dqkv (B, S, NH + 2·KVH, HS) = the gradient of the forward (assigned: never read), given its
// inputs, its output `out` and `lse`; a key/value head's gradient is the sum over its NH / KVH
// query heads. `scratch` holds flash_attention_backward_scratch_bytes(...) bytes, 4-byte aligned.
// mask: the forward's.
cudaError_t flash_attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out,
                                     const float* lse, ElemType type, int B, int S, int NH, int KVH,
                                     int HS, void* scratch, cudaStream_t stream,
                                     FlashMask mask = {});

// Diagnostics: d (16 × 16, f32, row-major) = a · bᵀ (kABt), a · b (kAB) or aᵀ · b (kAtB), with a
// and b 16 × 16 bf16 row-major (16-byte aligned), as two tensor-core products through the very
// shared-memory staging (cp.async) and fragment loads (ldmatrix, plain and transposed) the bf16
// kernels use — a check, on the GPU itself, of the layouts they assume (kernels/cuda/mma.cuh).
// kABt reads b as the kernels read a key tile, kAB as they read a value tile, kAtB reads a as
// the backward reads dSᵀ.
enum class MmaFragmentOperands { kABt, kAB, kAtB };
cudaError_t mma_fragment_product(float* d, const void* a, const void* b,
                                 MmaFragmentOperands operands, cudaStream_t stream);

}  // namespace strata::kernels::cuda
