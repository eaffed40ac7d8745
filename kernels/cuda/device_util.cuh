// device_util.cuh — device helpers shared by the kernels/cuda .cu files (never included by host
// C++): f32 <-> bf16 element access, 16-byte vector access to groups of elements, warp and
// block reductions, the dispatch from a runtime ElemType to a kernel template argument, and the
// kernel launch.
//
// In the emulation build (STRATA_CUDA_EMULATION) the .cu files are compiled as C++ and their
// kernels run on the CPU (kernels/cuda/emulation/device.h): kernels are launched through
// launch() and find their dynamic shared memory through dynamic_shared_floats() for that.
//
// Every kernel computes in f32 whatever its storage type: loads widen (exact), stores round to
// nearest even (bf16) — the rounding is written out bit by bit so that it is the very function
// kernels/cpu's f32_to_bf16 applies, NaN handling included, and both backends round alike.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#ifdef STRATA_CUDA_EMULATION
#include "kernels/cuda/emulation/device.h"
#endif

#include "kernels/cuda/elem_type.h"

namespace strata::kernels::cuda {

using bf16 = __nv_bfloat16;

constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float to_float(float x) {
  return x;
}
__device__ __forceinline__ float to_float(bf16 x) {
  return __bfloat162float(x);
}

__device__ __forceinline__ bf16 round_to_bf16(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u)  // NaN: keep it a quiet NaN
    return __ushort_as_bfloat16(static_cast<unsigned short>((u >> 16) | 0x40u));
  u += 0x7fffu + ((u >> 16) & 1u);
  return __ushort_as_bfloat16(static_cast<unsigned short>(u >> 16));
}

template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ bf16 from_float<bf16>(float x) {
  return round_to_bf16(x);
}

// ---- groups of kGroup elements, moved as 16-byte vectors --------------------------------------
// Kernels that stream through memory take kGroup = 8 consecutive elements per step: one 16-byte
// access for bf16, two for f32, where 2- or 4-byte accesses would need eight. A group moves as
// vectors when the launch said it may (`vec`: every pointer 16-byte aligned and every row start
// too, vec_aligned() on the host) and the group is whole; a partial group at the end of an array
// or row, or a launch whose pointers are not aligned, goes element by element. Either way the
// values are the same: only the width of the memory accesses changes.

constexpr int kGroup = 8;

// Whether p is 16-byte aligned, and so may be accessed with vectors; a null pointer (an absent
// operand) does not count against it.
inline bool vec_aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}
// Whether rows of `cols` elements of `elem_bytes` each, starting at an aligned pointer, all start
// 16-byte aligned.
inline bool rows_vec_aligned(int64_t cols, size_t elem_bytes) {
  return (static_cast<size_t>(cols) * elem_bytes) % 16 == 0;
}

__device__ __forceinline__ void check_vector(const void* p) {
#ifdef STRATA_CUDA_EMULATION
  cuda_emulation::check_aligned(p, 16);
#else
  (void)p;
#endif
}

// v[0, count) = p[0, count) widened to f32, v[count, kGroup) = 0.
__device__ __forceinline__ void load_group(const float* p, int count, bool vec,
                                           float (&v)[kGroup]) {
  if (vec && count == kGroup) {
    check_vector(p);
    const float4 a = reinterpret_cast<const float4*>(p)[0],
                 b = reinterpret_cast<const float4*>(p)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    return;
  }
  for (int e = 0; e < kGroup; ++e) v[e] = e < count ? p[e] : 0.f;
}
__device__ __forceinline__ void load_group(const bf16* p, int count, bool vec, float (&v)[kGroup]) {
  if (vec && count == kGroup) {
    check_vector(p);
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
    for (int k = 0; k < 4; ++k) {  // little-endian: the lower address is the lower half
      v[2 * k] = __uint_as_float(w[k] << 16);
      v[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
    }
    return;
  }
  for (int e = 0; e < kGroup; ++e) v[e] = e < count ? to_float(p[e]) : 0.f;
}

// p[0, count) = v[0, count), rounded to p's type.
__device__ __forceinline__ void store_group(float* p, int count, bool vec,
                                            const float (&v)[kGroup]) {
  if (vec && count == kGroup) {
    check_vector(p);
    reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
    return;
  }
  for (int e = 0; e < count; ++e) p[e] = v[e];
}
__device__ __forceinline__ void store_group(bf16* p, int count, bool vec,
                                            const float (&v)[kGroup]) {
  if (vec && count == kGroup) {
    check_vector(p);
    uint32_t w[4];
    for (int k = 0; k < 4; ++k)
      w[k] = static_cast<uint32_t>(__bfloat16_as_ushort(round_to_bf16(v[2 * k]))) |
             (static_cast<uint32_t>(__bfloat16_as_ushort(round_to_bf16(v[2 * k + 1]))) << 16);
    *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
    return;
  }
  for (int e = 0; e < count; ++e) p[e] = round_to_bf16(v[e]);
}

// The elements of a group starting at i of an array of n: kGroup, or fewer for the last.
__device__ __forceinline__ int group_count(int64_t i, int64_t n) {
  return n - i < kGroup ? static_cast<int>(n - i) : kGroup;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// dispatch(t, f) calls f(Tag<float>{}) or f(Tag<bf16>{}); f reads the type back as
// `typename decltype(tag)::type`. Host-side only: it picks which kernel instantiation to launch.
template <class T>
struct Tag {
  using type = T;
};
template <class F>
auto dispatch(ElemType t, F&& f) {
  return t == ElemType::kBF16 ? f(Tag<bf16>{}) : f(Tag<float>{});
}

// kernel<<<grid, block, smem, stream>>>(args...).
template <class... P, class... A>
void launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
            A&&... args) {
#ifdef STRATA_CUDA_EMULATION
  cuda_emulation::launch(kernel, grid, block, smem, stream, std::forward<A>(args)...);
#else
  // clang-format off
  kernel<<<grid, block, smem, stream>>>(std::forward<A>(args)...);
  // clang-format on
#endif
}

// launch() for a kernel that may use more than 48 KiB of dynamic shared memory, which a kernel
// must opt in to (per device) before its launch; returns the opt-in's or the launch's error.
template <class... P, class... A>
cudaError_t launch_opted_in(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem,
                            cudaStream_t stream, A&&... args) {
  const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  launch(kernel, grid, block, smem, stream, std::forward<A>(args)...);
  return cudaGetLastError();
}

// The block's dynamic shared memory (the launch's `smem` bytes), as floats; 16-byte aligned,
// for the 16-byte vector stores, cp.async copies and ldmatrix rows placed in it.
__device__ __forceinline__ float* dynamic_shared_floats() {
#ifdef STRATA_CUDA_EMULATION
  return static_cast<float*>(cuda_emulation::dynamic_shared());
#else
  extern __shared__ __align__(16) float dynamic_smem[];
  return dynamic_smem;
#endif
}

inline unsigned grid_for(int64_t n, int threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

}  // namespace strata::kernels::cuda
