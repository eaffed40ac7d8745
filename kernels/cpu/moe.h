// moe.h — CPU kernels of a mixture-of-experts layer (Mixtral's and Qwen3-MoE's sparse block):
// the router's softmax and top-k, the dispatch plan that lays the routed rows out by expert, the
// permutation of token rows into that layout and back (weighted by the routing weights), and the
// per-expert sums of the router probabilities (the load-balancing loss's). Pure functions on raw
// row-major buffers.
//
// Notation: N tokens, E experts, k experts per token, C hidden; an assignment (n, j) is token n's
// j-th choice, flat index n·k + j. dest_row (N, k) is its row in the expert-sorted layout, or −1
// where the plan dropped it (runtime/backend/backend.h states the layout and the drop rule).
//
// The float functions are templates over T, instantiated for float (training) and double (the
// reference the finite-difference tests evaluate). Every function computes each output from its
// inputs in a fixed order (no reduction across threads), so results do not depend on the thread
// count. Every output is ASSIGNED. The CUDA kernels (kernels/cuda/moe.h) are tested against these.
//
// Thread-safety: functions touch only their arguments; concurrent calls on disjoint buffers are
// safe. They use the calling thread's OpenMP team (threads.h).
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata::kernels::cpu {

// Routing. probs (N, E) = softmax(logits (N, E)) per row (max-subtracted); topk_idx (N, k) the k
// largest probabilities' experts in descending order, equal probabilities by the lower expert
// index; topk_w (N, k) their probabilities, divided by their sum when `renormalize`.
template <class T>
void moe_route(T* probs, int32_t* topk_idx, T* topk_w, const T* logits, int64_t N, int E, int k,
               bool renormalize);
// Its backward: dlogits (N, E) from dtopk_w (N, k) and dprobs_expert (E, or null: a gradient on
// every row's probabilities), through the renormalisation (when on) and the softmax.
template <class T>
void moe_route_backward(T* dlogits, const T* dtopk_w, const T* dprobs_expert, const T* probs,
                        const int32_t* topk_idx, int64_t N, int E, int k, bool renormalize);

// The dispatch plan: routed (E) assignments per expert, counts (E) those kept, dest_row (N, k).
// capacity < 0: dropless; else each expert keeps its `capacity` assignments of largest topk_w
// (equal weights: the lower token index first). topk_idx entries lie in [0, E).
void moe_dispatch_plan(int32_t* dest_row, int32_t* counts, int32_t* routed, const int32_t* topk_idx,
                       const float* topk_w, int64_t N, int k, int E, int64_t capacity);

// xp[dest_row[n, j]] = x[n] for every kept assignment: rows of C elements of elem_bytes each,
// copied as they are (any element type). Rows of xp no assignment names are left as they are.
void moe_permute(void* xp, const void* x, size_t elem_bytes, const int32_t* dest_row, int64_t N,
                 int k, int64_t C);
// dx (N, C) = Σ_j dxp[dest_row[n, j]] over the kept j, in j order (0 where none is kept).
template <class T>
void moe_permute_backward(T* dx, const T* dxp, const int32_t* dest_row, int64_t N, int k,
                          int64_t C);
// out (N, C) = Σ_j topk_w[n, j] · y[dest_row[n, j]] over the kept j, in j order.
template <class T>
void moe_unpermute(T* out, const T* y, const int32_t* dest_row, const T* topk_w, int64_t N, int k,
                   int64_t C);
// dy[dest_row[n, j]] = topk_w[n, j] · dout[n]; dtopk_w[n, j] = dout[n] · y[dest_row[n, j]] (0
// for a dropped assignment).
template <class T>
void moe_unpermute_backward(T* dy, T* dtopk_w, const T* dout, const T* y, const int32_t* dest_row,
                            const T* topk_w, int64_t N, int k, int64_t C);

// sums (E) = Σ_n probs[n, e], accumulated in double in row order.
void moe_prob_sums(float* sums, const float* probs, int64_t N, int E);

}  // namespace strata::kernels::cpu
