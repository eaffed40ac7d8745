// elementwise.cc — CPU implementation of kernels/cpu/elementwise.h.
#include "kernels/cpu/elementwise.h"

namespace strata::kernels::cpu {

template <class T>
void add_inplace(T* y, const T* x, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) y[i] += x[i];
}

template <class T>
void add(T* out, const T* a, const T* b, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template <class T>
void scale_inplace(T* y, T s, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) y[i] *= s;
}

template <class T>
double sum_squares(const T* x, size_t n) {
  double acc = 0;
#pragma omp parallel for schedule(static) reduction(+ : acc)
  for (size_t i = 0; i < n; ++i) acc += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return acc;
}

// Explicit instantiations: float for training, double for the finite-difference reference.

#define STRATA_INSTANTIATE_CPU_ELEMENTWISE(T)           \
  template void add_inplace<T>(T*, const T*, size_t);   \
  template void add<T>(T*, const T*, const T*, size_t); \
  template void scale_inplace<T>(T*, T, size_t);        \
  template double sum_squares<T>(const T*, size_t);

STRATA_INSTANTIATE_CPU_ELEMENTWISE(float)
STRATA_INSTANTIATE_CPU_ELEMENTWISE(double)

#undef STRATA_INSTANTIATE_CPU_ELEMENTWISE

}  // namespace strata::kernels::cpu
