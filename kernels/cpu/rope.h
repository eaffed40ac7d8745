// rope.h — CPU rotary position embeddings (RoPE) on the attention's qkv layout, in place: pure
// functions on raw row-major buffers.
//
// Every function is a template over the scalar type T, instantiated for float (training) and
// double (the reference that finite-difference tests evaluate). Loops use OpenMP.
// Layout (runtime/backend/backend.h, kernels/cpu/attention.h): qkv (B, S, NH + 2·KVH, HS) holds per
// position the NH query heads, then the KVH key heads, then the KVH value heads. Pairs are
// (x[i], x[i + HS/2]), i < HS/2: Hugging Face's rotate_half convention, not Meta's interleaved
// (x[2i], x[2i+1]). HS must be even. The angles come from the caller as a table, so any
// frequency scaling (rope_scaling) is the caller's business. The CUDA backend's RoPE is tested
// against these.
//
// Thread-safety: functions touch only their arguments; concurrent calls on disjoint buffers are
// safe. They use the calling thread's OpenMP team, as set by set_num_threads() (threads.h).
#pragma once

namespace strata::kernels::cpu {

// qkv (B, S, NH + 2·KVH, HS), in place: rotates the NH query heads and the KVH key heads of
// position s (0-based within each sequence) by the angles of row s of
// cos_sin (S, HS) = [cos(θ_0..θ_{HS/2−1}) | sin(θ_0..θ_{HS/2−1})]:
//   x[i] ← x[i]·cos − x[i+HS/2]·sin,   x[i+HS/2] ← x[i+HS/2]·cos + x[i]·sin.
// The value heads are left untouched.
template <class T>
void rope_forward(T* qkv, const T* cos_sin, int B, int S, int NH, int KVH, int HS);
// The transpose of rope_forward (its inverse: the rotation is orthogonal), applied in place to a
// gradient dqkv of the same layout; the value part is left untouched.
template <class T>
void rope_backward(T* dqkv, const T* cos_sin, int B, int S, int NH, int KVH, int HS);

}  // namespace strata::kernels::cpu
