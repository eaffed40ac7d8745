// moe.h — CUDA kernels of a mixture-of-experts layer: routing (softmax and top-k) and its
// backward, the dispatch plan, the permutations of token rows into the expert-sorted layout and
// back, and the per-expert probability sums. Pure functions on raw device buffers + shapes,
// launched on the caller's stream.
//
// Semantics are those of kernels/cpu/moe.h (the reference beside them) and
// runtime/backend/backend.h: probs, topk_w, their gradients and the sums are f32; token rows (x,
// xp, y, out and their gradients) and the logits are f32 or bf16 as their ElemType says; indices
// int32. Every kernel computes in f32 (the sums in double) and rounds to nearest even where it
// stores bf16. Every output is assigned.
//
// Deterministic: no float atomics. A row's sums run over its lanes in a fixed order (warp
// shuffles), the permutations' backward gathers each token's k rows in slot order, the probability
// sums take fixed row slices and add them in slice order, and the plan counts with integers only.
// The plan needs no host synchronisation: which experts overflow their capacity is decided on the
// device.
//
// Each function returns the last launch's cudaError_t (cudaGetLastError) for the caller to check;
// zero-sized calls launch nothing (the plan still writes its per-expert counts) and return
// cudaSuccess.
//
// Thread-safety: functions touch only their arguments; the usual stream-ordering rules apply.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/elem_type.h"

namespace strata::kernels::cuda {

// The most experts the routing and plan kernels take (a warp's experts fit 32-bit masks of 32 per
// lane; the plan counts in shared memory).
constexpr int kMoeMaxExperts = 1024;

// logits (N, E) of type act → probs (N, E), topk_idx (N, k), topk_w (N, k). One warp per row.
cudaError_t moe_route(float* probs, int32_t* topk_idx, float* topk_w, const void* logits,
                      ElemType act, int64_t N, int E, int k, bool renormalize, cudaStream_t stream);
// dlogits (N, E) of type act from dtopk_w (N, k), dprobs_expert (E, or null), probs (N, E),
// topk_idx (N, k). One warp per row.
cudaError_t moe_route_backward(void* dlogits, ElemType act, const float* dtopk_w,
                               const float* dprobs_expert, const float* probs,
                               const int32_t* topk_idx, int64_t N, int E, int k, bool renormalize,
                               cudaStream_t stream);

// The dispatch plan's scratch: bytes of device memory moe_dispatch_plan needs for N·k
// assignments over E experts.
size_t moe_dispatch_plan_workspace_bytes(int64_t N, int k, int E);
// dest_row (N, k), counts (E), routed (E) from topk_idx (N, k) (entries in [0, E)) and topk_w
// (N, k); capacity < 0 dropless. workspace: moe_dispatch_plan_workspace_bytes of device memory.
// Chunks of assignments are counted per expert, the counts scanned per expert (one block), the
// chunks ranked again to place each assignment; with a capacity, each overflowing expert's block
// finds its capacity-th largest weight by a radix select and keeps the assignments above it (and
// the first of those equal to it, in token order).
cudaError_t moe_dispatch_plan(int32_t* dest_row, int32_t* counts, int32_t* routed,
                              const int32_t* topk_idx, const float* topk_w, int64_t N, int k, int E,
                              int64_t capacity, void* workspace, cudaStream_t stream);

// xp[dest_row[n, j]] = x[n] for dest_row ≥ 0: rows of C elements of elem_bytes (2 or 4), moved as
// bits.
cudaError_t moe_permute(void* xp, const void* x, size_t elem_bytes, const int32_t* dest_row,
                        int64_t N, int k, int64_t C, cudaStream_t stream);
// dx (N, C) = Σ_j dxp[dest_row[n, j]] (dest_row ≥ 0), in j order; dx and dxp of type act.
cudaError_t moe_permute_backward(void* dx, const void* dxp, ElemType act, const int32_t* dest_row,
                                 int64_t N, int k, int64_t C, cudaStream_t stream);
// out (N, C) = Σ_j topk_w[n, j] · y[dest_row[n, j]] (dest_row ≥ 0), in j order; out and y of
// type act.
cudaError_t moe_unpermute(void* out, const void* y, ElemType act, const int32_t* dest_row,
                          const float* topk_w, int64_t N, int k, int64_t C, cudaStream_t stream);
// dy[dest_row[n, j]] = topk_w[n, j] · dout[n]; dtopk_w[n, j] = dout[n] · y[dest_row[n, j]] (0
// where dropped), one warp per assignment; dy, dout and y of type act.
cudaError_t moe_unpermute_backward(void* dy, float* dtopk_w, const void* dout, const void* y,
                                   ElemType act, const int32_t* dest_row, const float* topk_w,
                                   int64_t N, int k, int64_t C, cudaStream_t stream);

// The probability sums' scratch, in bytes.
size_t moe_prob_sums_workspace_bytes(int E);
// sums (E) = Σ_n probs (N, E)[n, e], in double: a fixed number of row slices per column, each
// summed by a block in a fixed order, then the slices in order.
cudaError_t moe_prob_sums(float* sums, const float* probs, int64_t N, int E, void* workspace,
                          cudaStream_t stream);

}  // namespace strata::kernels::cuda
