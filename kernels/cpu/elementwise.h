// elementwise.h — CPU vector helpers: adds, scaling and the sum of squares, on raw buffers.
//
// Every function is a template over the scalar type T, instantiated for float (training) and
// double (the reference that finite-difference tests evaluate). Loops use OpenMP;
// sum_squares reduces across threads, in an order that depends on their number. The CUDA kernels:
// kernels/cuda/elementwise.h (and the multi-tensor sum of squares of kernels/cuda/optim.h).
//
// Thread-safety: functions touch only their arguments; concurrent calls on disjoint buffers are
// safe. They use the calling thread's OpenMP team, as set by set_num_threads() (threads.h).
#pragma once

#include <cstddef>

namespace strata::kernels::cpu {

// y (n) += x (n)
template <class T>
void add_inplace(T* y, const T* x, size_t n);
// out (n) = a + b
template <class T>
void add(T* out, const T* a, const T* b, size_t n);
// y (n) *= s
template <class T>
void scale_inplace(T* y, T s, size_t n);
// Σ x², accumulated in double.
template <class T>
double sum_squares(const T* x, size_t n);

}  // namespace strata::kernels::cpu
