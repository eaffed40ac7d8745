// embedding.h — CPU vocab-parallel token and position embedding: pure functions on raw row-major
// buffers.
//
// Every function is a template over the scalar type T, instantiated for float (training) and
// double (the reference that finite-difference tests evaluate). Loops use OpenMP.
// embedding_backward ACCUMULATES (+=) into the parameter gradients dwte and dwpe, so they sum over
// micro-batches. Pointers documented as "may be null" skip that input or output. The CUDA
// kernels: kernels/cuda/embedding.h.
//
// Thread-safety: functions touch only their arguments; concurrent calls on disjoint buffers are
// safe. They use the calling thread's OpenMP team, as set by set_num_threads() (threads.h).
#pragma once

#include <cstdint>

namespace strata::kernels::cpu {

// out (B, S, C) = wte[tokens[b,s] - vocab_start] + wpe[s] for tokens in
// [vocab_start, vocab_start + V_local); tokens outside this shard contribute 0 from wte (the
// vocab-parallel embedding: shards are summed across the tensor group). wpe may be null.
// wte (V_local, C), wpe (S_max, C) with S ≤ S_max.
template <class T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int B, int S,
                       int C, int vocab_start, int V_local);
// dwte += scatter of dout by token (own shard only), dwpe (S, C) += Σ_b dout. dwpe may be null.
template <class T>
void embedding_backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int B, int S, int C,
                        int vocab_start, int V_local);

}  // namespace strata::kernels::cpu
