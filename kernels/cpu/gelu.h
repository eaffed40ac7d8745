// gelu.h — CPU activations: GELU (GPT-2's tanh form, BERT's exact erf form) and tanh (BERT's
// pooler), pure functions on raw buffers.
//
// Every function is a template over the scalar type T, instantiated for float (training) and
// double (the reference that finite-difference tests evaluate). Loops use OpenMP.
// The backward functions ASSIGN the input gradient dinp (one producer), so its buffer needs no
// zeroing and is never read. The CUDA kernels: kernels/cuda/gelu.h.
//
// Thread-safety: functions touch only their arguments; concurrent calls on disjoint buffers are
// safe. They use the calling thread's OpenMP team, as set by set_num_threads() (threads.h).
#pragma once

#include <cstddef>

namespace strata::kernels::cpu {

// GELU, tanh approximation (GPT-2's "gelu_new"): 0.5x(1 + tanh(√(2/π)(x + 0.044715x³))).
template <class T>
void gelu_forward(T* out, const T* inp, size_t n);
// dinp (n) = gelu'(inp) * dout.
template <class T>
void gelu_backward(T* dinp, const T* inp, const T* dout, size_t n);

// GELU, exact (BERT's, Hugging Face's "gelu"): x·Φ(x) = 0.5x(1 + erf(x/√2)).
template <class T>
void gelu_erf_forward(T* out, const T* inp, size_t n);
// dinp (n) = (Φ(x) + x·φ(x)) * dout, φ the standard normal density.
template <class T>
void gelu_erf_backward(T* dinp, const T* inp, const T* dout, size_t n);

// out (n) = tanh(inp); dinp (n) = (1 − out²) * dout, from the forward's output.
template <class T>
void tanh_forward(T* out, const T* inp, size_t n);
template <class T>
void tanh_backward(T* dinp, const T* out, const T* dout, size_t n);

}  // namespace strata::kernels::cpu
