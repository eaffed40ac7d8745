// embedding.cc — CPU implementation of kernels/cpu/embedding.h.
//
// The scatter into dwte and dwpe is parallel over column chunks (see kernels/cpu/util.h): no two
// threads write one element, and each sum is taken in the same order whatever the thread count.
#include "kernels/cpu/embedding.h"

#include <algorithm>
#include <cstddef>

#include "kernels/cpu/util.h"

namespace strata::kernels::cpu {

template <class T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int B, int S,
                       int C, int vocab_start, int V_local) {
#pragma omp parallel for schedule(static)
  for (int bs = 0; bs < B * S; ++bs) {
    const int s = bs % S;
    const int32_t local = tokens[bs] - vocab_start;
    const bool own = local >= 0 && local < V_local;
    T* y = out + static_cast<size_t>(bs) * C;                                  // (C)
    const T* e = own ? wte + static_cast<size_t>(local) * C : nullptr;         // (C)
    const T* p = wpe != nullptr ? wpe + static_cast<size_t>(s) * C : nullptr;  // (C)
    for (int c = 0; c < C; ++c) y[c] = (e != nullptr ? e[c] : T(0)) + (p != nullptr ? p[c] : T(0));
  }
}

template <class T>
void embedding_backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int B, int S, int C,
                        int vocab_start, int V_local) {
  // A token can repeat within the batch, so the scatter into dwte is parallel over channel
  // chunks, each thread walking every position in order (see the file comment).
  for_column_chunks(C, [&](int c0, int c1) {
    for (int bs = 0; bs < B * S; ++bs) {
      const int32_t local = tokens[bs] - vocab_start;
      if (local < 0 || local >= V_local) continue;
      const T* dy = dout + static_cast<size_t>(bs) * C;  // (C)
      T* dw = dwte + static_cast<size_t>(local) * C;     // (C)
      for (int c = c0; c < c1; ++c) dw[c] += dy[c];
    }
    if (dwpe != nullptr) {
      for (int s = 0; s < S; ++s) {
        T* dp = dwpe + static_cast<size_t>(s) * C;  // (C)
        for (int b = 0; b < B; ++b) {
          const T* dy = dout + (static_cast<size_t>(b) * S + s) * C;  // (C)
          for (int c = c0; c < c1; ++c) dp[c] += dy[c];
        }
      }
    }
  });
}

// Explicit instantiations: float for training, double for the finite-difference reference.

#define STRATA_INSTANTIATE_CPU_EMBEDDING(T)                                                      \
  template void embedding_forward<T>(T*, const int32_t*, const T*, const T*, int, int, int, int, \
                                     int);                                                       \
  template void embedding_backward<T>(T*, T*, const T*, const int32_t*, int, int, int, int, int);

STRATA_INSTANTIATE_CPU_EMBEDDING(float)
STRATA_INSTANTIATE_CPU_EMBEDDING(double)

#undef STRATA_INSTANTIATE_CPU_EMBEDDING

}  // namespace strata::kernels::cpu
