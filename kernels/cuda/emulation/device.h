// device.h — what a kernels/cuda .cu file needs from the device side when the emulation build
// (-DSTRATA_CUDA_EMULATION=ON) compiles it as plain C++: the built-in index variables, the
// intrinsics the kernels use, __shared__ storage and the kernel launch. Included by
// device_util.cuh in that build only; see docs/gpu.md "CUDA emulation" for what it is for.
//
// Execution model (scheduler.cc). A launch runs its blocks one after another on the calling
// thread. The threads of a block are fibers (Boost.Context) on that one thread, each run until it
// reaches a barrier — __syncthreads (all the block's live threads) or a warp shuffle (all the
// live lanes of its warp) — or returns; a barrier is released when every thread it waits for has
// arrived. So __syncthreads and the shuffles mean what they mean on a GPU, atomics need no
// locking, and the emulator can tell what a GPU would do silently wrong or hang on:
//   - a barrier that can never be released (threads of one warp waiting at different barriers,
//     or a warp shuffle some lanes of the warp never reach) aborts with the block, the kernel's
//     launch shape and where each thread waits;
//   - a shuffle whose source lane has returned aborts (a GPU returns an undefined value).
// The warps of a block take turns: each runs as far as it can (through its shuffles, products and
// ldmatrix) until its threads wait at __syncthreads or return, before the next warp starts —
// warps and threads in order in even-numbered blocks, in reverse in odd ones. So shared memory
// that a missing __syncthreads leaves unordered between two threads or warps is read before it
// is written (or overwritten before it is read) in one order or the other, and fails a
// comparison with the CPU reference. Dynamic shared memory
// and every cudaMalloc start filled with NaN bytes (0xff), so reading what no thread wrote shows.
//
// Tensor cores: mma_bf16_16816 stands for mma.sync.m16n8k16 (bf16 in, f32 accumulate), a third
// warp barrier: when all 32 lanes have arrived, A and B are assembled from their fragments by the
// PTX ISA's layout (kernels/cuda/mma.cuh) and each lane gets its part of D. Lanes of one warp
// at different barriers, or a product some lanes never reach, abort like a shuffle does.
//
// ldmatrix (ldmatrix_x4: ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16) is a fourth warp
// barrier: when all 32 lanes have arrived, each lane's row is read from shared memory and each
// lane gets its registers by the PTX ISA's layout. A row that is not 16 aligned bytes of the
// block's dynamic shared memory aborts, as do lanes that disagree on .trans.
//
// cp.async (cp_async_16, cp_async_commit, cp_async_wait: cp.async.cg.shared.global of 16 bytes,
// commit_group, wait_group) lands its copies at one of the two extremes a GPU allows, by block:
// in blocks 0 and 1 of every 4 only when the thread's wait_group lets their group complete (never,
// if it returns without waiting), so a thread that reads a copy's bytes before waiting for it, or
// another thread's without a __syncthreads after that thread's wait, reads the bytes from before
// the copy (NaN in a fresh block); in blocks 2 and 3 at once, so a copy issued over data another
// warp still reads (the __syncthreads before it missing) overwrites it. With the warp order
// alternating by block, each landing meets each order. Either fails a comparison with the CPU.
//
// Not emulated: warp-synchronous code without __syncwarp (each fiber runs alone until it
// blocks), memory fences, cooperative groups, other tensor-core shapes or types, other ldmatrix
// shapes, other cp.async forms, textures. Kernels here use none.
#pragma once

#include <cuda_runtime.h>  // dim3, uint3, cudaStream_t

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

// The built-in variables: set by the scheduler for the fiber it is about to resume.
extern thread_local uint3 threadIdx;
extern thread_local uint3 blockIdx;
extern thread_local dim3 blockDim;
extern thread_local dim3 gridDim;

// Attributes with no meaning on the CPU. __shared__ arrays become static thread_local: one copy
// per emulating thread, shared by the block running on it (blocks run one at a time).
#define __launch_bounds__(...)
#undef __shared__
#define __shared__ static thread_local

namespace strata::cuda_emulation {

// Runs body() once for every thread of every block of the grid (scheduler.cc). A shape a GPU
// refuses to launch — a block of more than 1024 threads, more dynamic shared memory than the
// kernel opted into (runtime.cc) — aborts naming it.
void run_grid(const void* kernel, dim3 grid, dim3 block, size_t dynamic_smem_bytes,
              const std::function<void()>& body);
// The dynamic shared memory `kernel` may use: 48 KiB, or what cudaFuncSetAttribute raised it to.
size_t max_dynamic_shared_bytes(const void* kernel);
// What comes before a kernel launched on `stream` (runtime.cc): the stream's pending work (async.h)
// completes, and communication in flight makes progress.
void before_launch(cudaStream_t stream);
// Block barrier, and the exchange of one 64-bit word among the 32 lanes of a warp: every lane
// puts `bits` in and gets back lane (its lane ^ lane_mask)'s.
void sync_block();
uint64_t shuffle_xor(uint64_t bits, int lane_mask, unsigned mask, int width);
// d += a · b over the warp (mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32): this lane's
// fragments in, its four accumulators updated in place.
void mma_bf16_16816(float* d, const uint32_t* a, const uint32_t* b);
// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 over the warp: this lane's row address in,
// its four registers out.
void ldmatrix_x4(uint32_t* r, const void* row, bool trans);
// cp.async.cg.shared.global [smem_dst], [global_src], 16, src_bytes (the rest zero-filled);
// cp.async.commit_group; cp.async.wait_group pending.
void cp_async_16(void* smem_dst, const void* global_src, int src_bytes);
void cp_async_commit();
void cp_async_wait(int pending);
// This block's dynamic shared memory (as many bytes as the launch asked for).
void* dynamic_shared();
// A vector load or store of `bytes` at p (a uint4 or float4): aborts, naming the thread and the
// address, unless p is `bytes`-aligned, where a GPU would stop with a misaligned address.
void check_aligned(const void* p, size_t bytes);

template <class T>
T shfl_xor(T v, int lane_mask, unsigned mask, int width) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "shuffles move up to 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  bits = shuffle_xor(bits, lane_mask, mask, width);
  std::memcpy(&v, &bits, sizeof(T));
  return v;
}

template <class T>
T atomic_add(T* address, T v) {
  const T old = *address;  // the block's fibers share one thread: no other writer meanwhile
  *address = old + v;
  return old;
}

// kernel<<<grid, block, smem, stream>>>(args...): the arguments are converted to the kernel's
// parameter types once, as a launch copies them, and every thread gets the same copies.
template <class... P, class... A>
void launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
            A&&... args) {
  static_assert(sizeof...(P) == sizeof...(A), "kernel launched with the wrong argument count");
  before_launch(stream);
  const std::tuple<std::decay_t<P>...> params(std::forward<A>(args)...);
  run_grid(reinterpret_cast<const void*>(kernel), grid, block, smem,
           [&] { std::apply(kernel, params); });
}

}  // namespace strata::cuda_emulation

// cuda_runtime.h's overload for kernel pointers, which it declares for nvcc only.
template <class... P>
cudaError_t cudaFuncSetAttribute(void (*kernel)(P...), cudaFuncAttribute attr, int value) {
  return cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), attr, value);
}

using std::isnan;  // CUDA's device isnan (expf, fmaxf and the like come from <cmath> unqualified)
using std::max;    // CUDA's device min and max, for the argument types the kernels use
using std::min;

inline void __syncthreads() {
  strata::cuda_emulation::sync_block();
}
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  return strata::cuda_emulation::shfl_xor(v, lane_mask, mask, width);
}
inline float atomicAdd(float* address, float v) {
  return strata::cuda_emulation::atomic_add(address, v);
}
inline double atomicAdd(double* address, double v) {
  return strata::cuda_emulation::atomic_add(address, v);
}
inline int atomicAdd(int* address, int v) {
  return strata::cuda_emulation::atomic_add(address, v);
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
