// swiglu.cc — CPU implementation of kernels/cpu/swiglu.h.
//
// sigmoid(g) is computed from e = e^(−|g|) ∈ (0, 1]: 1/(1 + e) for g ≥ 0, e/(1 + e) below, so no
// intermediate overflows whatever g (1/(1 + e^(−g)) would take e^(−g) to inf for g ≪ 0), and for
// g ≪ 0 sigmoid keeps its relative precision down to where e underflows (exp_fast returns 0 below
// −87, giving sigmoid = 0 and silu = −0).
#include "kernels/cpu/swiglu.h"

#include <omp.h>

#include <cmath>
#include <cstddef>
#include <type_traits>

#include "kernels/cpu/util.h"

namespace strata::kernels::cpu {

namespace {

template <class T>
inline T sigmoid(T g) {
  const T e = exp_t(-std::fabs(g));
  const T num = g >= T(0) ? T(1) : e;
  return num / (T(1) + e);
}

// Rows [n0, n1) of the forward and backward; inlined into each caller, so the float ones below
// compile them once per vector width.
template <class T>
[[gnu::always_inline]] inline void forward_rows(T* out, const T* gate_up, size_t n0, size_t n1,
                                                int F) {
  for (size_t n = n0; n < n1; ++n) {
    const T* gate = gate_up + n * 2 * F;  // (F)
    const T* up = gate + F;               // (F)
    T* y = out + n * F;                   // (F)
#pragma omp simd
    for (int i = 0; i < F; ++i) {
      const T g = gate[i];
      y[i] = g * sigmoid(g) * up[i];
    }
  }
}

template <class T>
[[gnu::always_inline]] inline void backward_rows(T* dgate_up, const T* dout, const T* gate_up,
                                                 size_t n0, size_t n1, int F) {
  for (size_t n = n0; n < n1; ++n) {
    const T* gate = gate_up + n * 2 * F;  // (F)
    const T* up = gate + F;               // (F)
    const T* dy = dout + n * F;           // (F)
    T* dgate = dgate_up + n * 2 * F;      // (F)
    T* dup = dgate + F;                   // (F)
#pragma omp simd
    for (int i = 0; i < F; ++i) {
      const T g = gate[i];
      const T s = sigmoid(g);
      // silu'(g) = s + g·s·(1 − s). (g·s)·(1 − s) is finite for every finite g: g·s → −0 in
      // the lower tail and 1 − s → 0 in the upper one, and never a product with inf.
      const T gs = g * s;
      dgate[i] = dy[i] * up[i] * (s + gs * (T(1) - s));
      dup[i] = dy[i] * gs;
    }
  }
}

STRATA_CPU_CLONES void forward_rows_float(float* out, const float* gate_up, size_t n0, size_t n1,
                                          int F) {
  forward_rows(out, gate_up, n0, n1, F);
}

STRATA_CPU_CLONES void backward_rows_float(float* dgate_up, const float* dout, const float* gate_up,
                                           size_t n0, size_t n1, int F) {
  backward_rows(dgate_up, dout, gate_up, n0, n1, F);
}

}  // namespace

template <class T>
void swiglu_forward(T* out, const T* gate_up, int N, int F) {
#pragma omp parallel
  {
    size_t n0, n1;
    thread_share(static_cast<size_t>(N), omp_get_thread_num(), omp_get_num_threads(), n0, n1);
    if constexpr (std::is_same_v<T, float>) {
      forward_rows_float(out, gate_up, n0, n1, F);
    } else {
      forward_rows(out, gate_up, n0, n1, F);
    }
  }
}

template <class T>
void swiglu_backward(T* dgate_up, const T* dout, const T* gate_up, int N, int F) {
#pragma omp parallel
  {
    size_t n0, n1;
    thread_share(static_cast<size_t>(N), omp_get_thread_num(), omp_get_num_threads(), n0, n1);
    if constexpr (std::is_same_v<T, float>) {
      backward_rows_float(dgate_up, dout, gate_up, n0, n1, F);
    } else {
      backward_rows(dgate_up, dout, gate_up, n0, n1, F);
    }
  }
}

// Explicit instantiations: float for training, double for the finite-difference reference.

#define STRATA_INSTANTIATE_CPU_SWIGLU(T)                   \
  template void swiglu_forward<T>(T*, const T*, int, int); \
  template void swiglu_backward<T>(T*, const T*, const T*, int, int);

STRATA_INSTANTIATE_CPU_SWIGLU(float)
STRATA_INSTANTIATE_CPU_SWIGLU(double)

#undef STRATA_INSTANTIATE_CPU_SWIGLU

}  // namespace strata::kernels::cpu
