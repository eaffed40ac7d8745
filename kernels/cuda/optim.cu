// optim.cu — the kernels of optim.h.
//
// A launch carries a table of up to kMaxSegments segments in its parameters (well under the
// 4 KiB kernel-parameter limit) and, per segment, the index of its first block. Block k finds
// its segment by scanning that index (≤ kMaxSegments compares, negligible beside the chunk),
// then its chunk of kChunk elements; 256 threads stride through the chunk in groups of 8
// elements (device_util.cuh), moved as 16-byte vectors where the segment's arrays are 16-byte
// aligned, so reads coalesce and each thread keeps several of them in flight.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/optim.h"

namespace strata::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kChunk = 4096;  // elements per block: 16 per thread
constexpr int kMaxSegments = 32;

struct AdamWTable {
  float* param[kMaxSegments];
  const float* grad[kMaxSegments];
  float* m[kMaxSegments];
  float* v[kMaxSegments];
  int64_t n[kMaxSegments];
  float weight_decay[kMaxSegments];
  int vec[kMaxSegments];                  // param, grad, m and v all 16-byte aligned
  int64_t first_block[kMaxSegments + 1];  // [segment]; the last entry is the total
  int count;
};

struct SumSquaresTable {
  const void* x[kMaxSegments];
  int64_t n[kMaxSegments];
  int is_bf16[kMaxSegments];
  int vec[kMaxSegments];  // x 16-byte aligned
  int64_t first_block[kMaxSegments + 1];
  int count;
};

static_assert(sizeof(AdamWTable) < 4000 && sizeof(SumSquaresTable) < 4000,
              "segment tables must fit the 4 KiB of kernel parameters");

// Which segment block `blk` works on, and that block's first element in it.
template <class Table>
__device__ __forceinline__ int find_segment(const Table& t, int64_t blk, int64_t* start) {
  int s = 0;
  while (s + 1 < t.count && t.first_block[s + 1] <= blk) ++s;
  *start = (blk - t.first_block[s]) * kChunk;
  return s;
}

// The same arithmetic, in the same order, as kernels/cpu adamw_update (bias corrections are
// computed on the host in double, as there).
__global__ void __launch_bounds__(kThreads)
    adamw_kernel(const __grid_constant__ AdamWTable t, float lr, float beta1, float beta2,
                 float eps, float bc1, float bc2, float grad_scale) {
  int64_t start = 0;
  const int s = find_segment(t, blockIdx.x, &start);
  float* p = t.param[s];
  const float* g = t.grad[s];
  float* m = t.m[s];
  float* v = t.v[s];
  const float wd = t.weight_decay[s];
  const bool vec = t.vec[s];
  const int64_t end = min(t.n[s], start + kChunk);
  for (int64_t i = start + kGroup * threadIdx.x; i < end; i += kGroup * kThreads) {
    const int k = group_count(i, end);
    float pv[kGroup], gv[kGroup], mv[kGroup], vv[kGroup];
    load_group(p + i, k, vec, pv);
    load_group(g + i, k, vec, gv);
    load_group(m + i, k, vec, mv);
    load_group(v + i, k, vec, vv);
#pragma unroll
    for (int e = 0; e < kGroup; ++e) {
      gv[e] *= grad_scale;
      mv[e] = beta1 * mv[e] + (1.0f - beta1) * gv[e];
      vv[e] = beta2 * vv[e] + (1.0f - beta2) * gv[e] * gv[e];
      const float mhat = mv[e] / bc1;
      const float vhat = vv[e] / bc2;
      pv[e] -= lr * (mhat / (sqrtf(vhat) + eps) + wd * pv[e]);
    }
    store_group(m + i, k, vec, mv);
    store_group(v + i, k, vec, vv);
    store_group(p + i, k, vec, pv);
  }
}

__global__ void __launch_bounds__(kThreads)
    sum_squares_kernel(double* out, const __grid_constant__ SumSquaresTable t) {
  __shared__ double part[kThreads / 32];
  int64_t start = 0;
  const int s = find_segment(t, blockIdx.x, &start);
  const int64_t end = min(t.n[s], start + kChunk);
  const bool vec = t.vec[s];
  double acc = 0;
  for (int64_t i = start + kGroup * threadIdx.x; i < end; i += kGroup * kThreads) {
    const int k = group_count(i, end);
    float xv[kGroup];  // a partial group's missing values are 0 and add nothing
    if (t.is_bf16[s])
      load_group(static_cast<const bf16*>(t.x[s]) + i, k, vec, xv);
    else
      load_group(static_cast<const float*>(t.x[s]) + i, k, vec, xv);
#pragma unroll
    for (int e = 0; e < kGroup; ++e) acc += static_cast<double>(xv[e]) * xv[e];
  }
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(kFullMask, acc, o);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) acc += part[w];
    atomicAdd(out, acc);
  }
}

int64_t chunks(int64_t n) {
  return (n + kChunk - 1) / kChunk;
}

// Fills a table's first_block from its n[] and returns the total number of blocks.
template <class Table>
int64_t index_blocks(Table& t) {
  t.first_block[0] = 0;
  for (int s = 0; s < t.count; ++s) t.first_block[s + 1] = t.first_block[s] + chunks(t.n[s]);
  return t.first_block[t.count];
}

}  // namespace

cudaError_t adamw_multi_tensor(const AdamWSegment* segments, int count, const AdamWHyper& hyper,
                               cudaStream_t stream) {
  // Bias corrections in double: 1 − β2^step is ~1e-3 at step 1 and float's pow would cost
  // digits (and the CPU reference does the same).
  const float bc1 =
      static_cast<float>(1.0 - std::pow(static_cast<double>(hyper.beta1), hyper.step));
  const float bc2 =
      static_cast<float>(1.0 - std::pow(static_cast<double>(hyper.beta2), hyper.step));
  for (int first = 0; first < count; first += kMaxSegments) {
    AdamWTable t{};
    for (int k = first; k < std::min(count, first + kMaxSegments); ++k) {
      const AdamWSegment& seg = segments[k];
      if (seg.n == 0) continue;  // a zero-sized segment would own no block
      t.param[t.count] = seg.param;
      t.grad[t.count] = seg.grad;
      t.m[t.count] = seg.m;
      t.v[t.count] = seg.v;
      t.n[t.count] = seg.n;
      t.weight_decay[t.count] = seg.decay ? hyper.weight_decay : 0.f;
      t.vec[t.count] = vec_aligned(seg.param) && vec_aligned(seg.grad) && vec_aligned(seg.m) &&
                       vec_aligned(seg.v);
      ++t.count;
    }
    const int64_t blocks = index_blocks(t);
    if (blocks == 0) continue;
    launch(adamw_kernel, static_cast<unsigned>(blocks), kThreads, 0, stream, t, hyper.lr,
           hyper.beta1, hyper.beta2, hyper.eps, bc1, bc2, hyper.grad_scale);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

cudaError_t sum_squares_multi_tensor(double* out, const SumSquaresSegment* segments, int count,
                                     cudaStream_t stream) {
  for (int first = 0; first < count; first += kMaxSegments) {
    SumSquaresTable t{};
    for (int k = first; k < std::min(count, first + kMaxSegments); ++k) {
      const SumSquaresSegment& seg = segments[k];
      if (seg.n == 0) continue;
      t.x[t.count] = seg.x;
      t.n[t.count] = seg.n;
      t.is_bf16[t.count] = seg.type == ElemType::kBF16;
      t.vec[t.count] = vec_aligned(seg.x);
      ++t.count;
    }
    const int64_t blocks = index_blocks(t);
    if (blocks == 0) continue;
    launch(sum_squares_kernel, static_cast<unsigned>(blocks), kThreads, 0, stream, out, t);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace strata::kernels::cuda
