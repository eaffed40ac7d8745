// gelu.cc — CPU implementation of kernels/cpu/gelu.h.
//
// Computed through the identity 0.5·(1 + tanh(u)) = σ(2u) = 1 / (1 + e^(−2u)): one exp instead of
// a tanh (see exp_fast), and no overflow: e^(−2u) → inf gives σ = 0, e^(−2u) → 0 gives σ = 1.
#include "kernels/cpu/gelu.h"

#include <omp.h>

#include <cmath>
#include <type_traits>

#include "kernels/cpu/util.h"

namespace strata::kernels::cpu {

namespace {

// Elements [i0, i1) of the forward and backward; inlined into each caller, so the float ones below
// compile them once per vector width.
template <class T>
[[gnu::always_inline]] inline void forward_range(T* out, const T* inp, size_t i0, size_t i1) {
  const T k = T(0.7978845608028654);  // √(2/π)
  const T c = T(0.044715);
#pragma omp simd
  for (size_t i = i0; i < i1; ++i) {
    const T x = inp[i];
    out[i] = x / (T(1) + exp_t(T(-2) * k * (x + c * x * x * x)));
  }
}

template <class T>
[[gnu::always_inline]] inline void backward_range(T* dinp, const T* inp, const T* dout, size_t i0,
                                                  size_t i1) {
  const T k = T(0.7978845608028654);  // √(2/π)
  const T c = T(0.044715);
#pragma omp simd
  for (size_t i = i0; i < i1; ++i) {
    const T x = inp[i];
    const T s = T(1) / (T(1) + exp_t(T(-2) * k * (x + c * x * x * x)));  // σ(2u)
    // d/dx [x·σ(2u)] = σ(2u) + x·σ(2u)(1 − σ(2u))·2u', with u' = k·(1 + 3c·x²). w = 2k·σ(1 − σ)
    // is exactly 0 in both tails, and multiplying it into x one factor at a time keeps every
    // product finite there: x³ alone would overflow to inf and 0·inf give NaN for |x| > 1e12.
    const T w = T(2) * k * s * (T(1) - s);
    const T grad = s + w * x + T(3) * c * (((w * x) * x) * x);
    dinp[i] = grad * dout[i];
  }
}

STRATA_CPU_CLONES void forward_range_float(float* out, const float* inp, size_t i0, size_t i1) {
  forward_range(out, inp, i0, i1);
}

STRATA_CPU_CLONES void backward_range_float(float* dinp, const float* inp, const float* dout,
                                            size_t i0, size_t i1) {
  backward_range(dinp, inp, dout, i0, i1);
}

}  // namespace

template <class T>
void gelu_forward(T* out, const T* inp, size_t n) {
#pragma omp parallel
  {
    size_t i0, i1;
    thread_share(n, omp_get_thread_num(), omp_get_num_threads(), i0, i1);
    if constexpr (std::is_same_v<T, float>) {
      forward_range_float(out, inp, i0, i1);
    } else {
      forward_range(out, inp, i0, i1);
    }
  }
}

template <class T>
void gelu_backward(T* dinp, const T* inp, const T* dout, size_t n) {
#pragma omp parallel
  {
    size_t i0, i1;
    thread_share(n, omp_get_thread_num(), omp_get_num_threads(), i0, i1);
    if constexpr (std::is_same_v<T, float>) {
      backward_range_float(dinp, inp, dout, i0, i1);
    } else {
      backward_range(dinp, inp, dout, i0, i1);
    }
  }
}

template <class T>
void gelu_erf_forward(T* out, const T* inp, size_t n) {
  const T r = T(0.7071067811865476);  // 1/√2
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) {
    const T x = inp[i];
    out[i] = T(0.5) * x * (T(1) + std::erf(x * r));
  }
}

template <class T>
void gelu_erf_backward(T* dinp, const T* inp, const T* dout, size_t n) {
  const T r = T(0.7071067811865476);             // 1/√2
  const T inv_sqrt_2pi = T(0.3989422804014327);  // 1/√(2π)
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) {
    const T x = inp[i];
    // Φ(x) + x·φ(x); in the tails exp(−x²/2) underflows to 0 and the product with x stays 0.
    const T grad = T(0.5) * (T(1) + std::erf(x * r)) + x * inv_sqrt_2pi * std::exp(T(-0.5) * x * x);
    dinp[i] = grad * dout[i];
  }
}

template <class T>
void tanh_forward(T* out, const T* inp, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) out[i] = std::tanh(inp[i]);
}

template <class T>
void tanh_backward(T* dinp, const T* out, const T* dout, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) dinp[i] = (T(1) - out[i] * out[i]) * dout[i];
}

// Explicit instantiations: float for training, double for the finite-difference reference.

#define STRATA_INSTANTIATE_CPU_GELU(T)                                \
  template void gelu_forward<T>(T*, const T*, size_t);                \
  template void gelu_backward<T>(T*, const T*, const T*, size_t);     \
  template void gelu_erf_forward<T>(T*, const T*, size_t);            \
  template void gelu_erf_backward<T>(T*, const T*, const T*, size_t); \
  template void tanh_forward<T>(T*, const T*, size_t);                \
  template void tanh_backward<T>(T*, const T*, const T*, size_t);

STRATA_INSTANTIATE_CPU_GELU(float)
STRATA_INSTANTIATE_CPU_GELU(double)

#undef STRATA_INSTANTIATE_CPU_GELU

}  // namespace strata::kernels::cpu
