// device_util.cuh — device helpers shared by the kernels/cuda .cu files (never included by host
// C++): f32 <-> bf16 element access, warp and block reductions, the dispatch from a runtime
// ElemType to a kernel template argument, and the kernel launch.
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

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// Sum (or max) over the whole block, returned to every thread. blockDim.x must be a multiple of
// 32; `scratch` is 32 floats of shared memory, free again when the function returns.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = warp_sum(lane < warps ? scratch[lane] : 0.f);
  __syncthreads();
  return v;
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_max(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = warp_max(lane < warps ? scratch[lane] : -INFINITY);
  __syncthreads();
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

// The block's dynamic shared memory (the launch's `smem` bytes), as floats.
__device__ __forceinline__ float* dynamic_shared_floats() {
#ifdef STRATA_CUDA_EMULATION
  return static_cast<float*>(cuda_emulation::dynamic_shared());
#else
  extern __shared__ float dynamic_smem[];
  return dynamic_smem;
#endif
}

inline unsigned grid_for(int64_t n, int threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

}  // namespace strata::kernels::cuda
