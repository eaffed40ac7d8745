// precision.cc — CPU implementation of kernels/cpu/precision.h.
#include "kernels/cpu/precision.h"

namespace strata::kernels::cpu {

void cast_f32_to_bf16(uint16_t* dst, const float* src, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}

void cast_bf16_to_f32(float* dst, const uint16_t* src, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}

}  // namespace strata::kernels::cpu
