// precision.h — bfloat16 on the CPU: the conversions to and from f32 of one value, and the casts
// of whole buffers. The CUDA kernels round by the very same function (round_to_bf16 in
// kernels/cuda/device_util.cuh), so both backends round alike; the CUDA casts are
// kernels/cuda/precision.h.
//
// Thread-safety: functions touch only their arguments; concurrent calls on disjoint buffers are
// safe. They use the calling thread's OpenMP team, as set by set_num_threads() (threads.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace strata::kernels::cpu {

// bfloat16 as its 16 raw bits (the upper half of an IEEE float).
inline float bf16_to_f32(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
// Round to nearest, ties to even; NaN stays a (quiet) NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
void cast_f32_to_bf16(uint16_t* dst, const float* src, size_t n);
void cast_bf16_to_f32(float* dst, const uint16_t* src, size_t n);

}  // namespace strata::kernels::cpu
