// swiglu.h — CPU SwiGLU (the gated MLP activation of Llama-family models): pure functions on raw
// row-major buffers.
//
// Every function is a template over the scalar type T, instantiated for float (training) and
// double (the reference that finite-difference tests evaluate). Loops use OpenMP.
// swiglu_backward ASSIGNS the input gradient dgate_up (one producer), so its buffer needs no
// zeroing and is never read. The CUDA backend's SwiGLU is tested against these.
//
// Thread-safety: functions touch only their arguments; concurrent calls on disjoint buffers are
// safe. They use the calling thread's OpenMP team, as set by set_num_threads() (threads.h).
#pragma once

namespace strata::kernels::cpu {

// gate_up (N, 2F) holds per row [gate (F) | up (F)] (one GEMM makes both);
// out (N, F) = silu(gate) · up, silu(g) = g · sigmoid(g).
template <class T>
void swiglu_forward(T* out, const T* gate_up, int N, int F);
// dgate_up (N, 2F) = [dout · up · silu'(gate) | dout · silu(gate)], assigned.
template <class T>
void swiglu_backward(T* dgate_up, const T* dout, const T* gate_up, int N, int F);

}  // namespace strata::kernels::cpu
