// rope.cc — CPU implementation of kernels/cpu/rope.h.
//
// One (batch, position) row per OpenMP iteration: its query and key heads share one row of the
// angle table, read once per row.
#include "kernels/cpu/rope.h"

#include <cstddef>

namespace strata::kernels::cpu {

namespace {

// Rotates the first NH + KVH heads of every (b, s) row by `sign`·θ: sign = +1 is the forward
// rotation, −1 its transpose.
template <class T>
void rotate(T* qkv, const T* cos_sin, int B, int S, int NH, int KVH, int HS, T sign) {
  const int half = HS / 2;
  const int rotated = NH + KVH;  // query and key heads; the values follow them
  const size_t ld = static_cast<size_t>(NH + 2 * KVH) * HS;  // row stride of qkv
#pragma omp parallel for schedule(static)
  for (int bs = 0; bs < B * S; ++bs) {
    const T* cs = cos_sin + static_cast<size_t>(bs % S) * HS;  // (HS): [cos | sin] of position s
    T* row = qkv + static_cast<size_t>(bs) * ld;               // (NH + 2·KVH, HS)
    for (int h = 0; h < rotated; ++h) {
      T* x = row + static_cast<size_t>(h) * HS;  // (HS)
#pragma omp simd
      for (int i = 0; i < half; ++i) {
        const T c = cs[i];
        const T s = sign * cs[half + i];
        const T x1 = x[i];
        const T x2 = x[half + i];
        x[i] = x1 * c - x2 * s;
        x[half + i] = x2 * c + x1 * s;
      }
    }
  }
}

}  // namespace

template <class T>
void rope_forward(T* qkv, const T* cos_sin, int B, int S, int NH, int KVH, int HS) {
  rotate<T>(qkv, cos_sin, B, S, NH, KVH, HS, T(1));
}

// The transpose of [[c, −s], [s, c]] is [[c, s], [−s, c]]: the same rotation with −sin.
template <class T>
void rope_backward(T* dqkv, const T* cos_sin, int B, int S, int NH, int KVH, int HS) {
  rotate<T>(dqkv, cos_sin, B, S, NH, KVH, HS, T(-1));
}

// Explicit instantiations: float for training, double for the finite-difference reference.

#define STRATA_INSTANTIATE_CPU_ROPE(T)                                  \
  template void rope_forward<T>(T*, const T*, int, int, int, int, int); \
  template void rope_backward<T>(T*, const T*, int, int, int, int, int);

STRATA_INSTANTIATE_CPU_ROPE(float)
STRATA_INSTANTIATE_CPU_ROPE(double)

#undef STRATA_INSTANTIATE_CPU_ROPE

}  // namespace strata::kernels::cpu
