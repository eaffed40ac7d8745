// gemm_bias.cu — the kernels of gemm_bias.h.
//
// Launch shapes (not tuned on a GPU yet):
// - the bias add: one thread per element, a grid-stride loop;
// - column sums (dbias where cuBLASLt has no BGRADB epilogue): 32 columns × 8 row lanes per
//   block, blocks split the rows into at most kMaxRowSplits groups, each group adds its partial
//   sum with one atomicAdd per column — so a column takes ≤ 64 atomics instead of one per row.
// The column sums' order differs from the CPU's (atomics): they match it to float rounding, not
// bit for bit.
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/gemm_bias.h"
#include "kernels/cuda/map.cuh"

namespace strata::kernels::cuda {
namespace {

constexpr int kColTile = 32;  // column sums: columns per block (one warp wide) ...
constexpr int kColRows = 8;   // ... times row lanes per block
constexpr int kMaxRowSplits = 64;

// Row groups for the column sums: enough blocks to fill the GPU when there are few columns,
// never more groups than rows of kColRows.
unsigned row_splits(int64_t N) {
  return static_cast<unsigned>(std::max<int64_t>(
      1, std::min<int64_t>(kMaxRowSplits, (N + kColRows * 4 - 1) / (kColRows * 4))));
}

template <class TO, class TB>
__global__ void add_bias_kernel(TO* out, const TB* bias, int64_t N, int OC) {
  STRATA_FOR_EACH(i, N * OC) out[i] = from_float<TO>(to_float(out[i]) + to_float(bias[i % OC]));
}

// Block (kColTile, kColRows): thread (x, y) sums column blockIdx.x·kColTile + x over the rows
// y + kColRows·blockIdx.y, stepping by kColRows·gridDim.y.
template <class T>
__global__ void bias_grad_kernel(float* dbias, const T* dout, int64_t N, int OC) {
  __shared__ float part[kColRows][kColTile + 1];
  const int o = blockIdx.x * kColTile + threadIdx.x;
  float s = 0.f;
  if (o < OC)
    for (int64_t n = blockIdx.y * kColRows + threadIdx.y; n < N;
         n += static_cast<int64_t>(gridDim.y) * kColRows)
      s += to_float(dout[n * OC + o]);
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && o < OC) {
    for (int y = 1; y < kColRows; ++y) s += part[y][threadIdx.x];
    atomicAdd(&dbias[o], s);
  }
}

}  // namespace

cudaError_t add_bias(void* out, ElemType out_type, const void* bias, ElemType bias_type, int64_t N,
                     int OC, cudaStream_t stream) {
  if (N * OC == 0) return cudaSuccess;
  return dispatch(out_type, [&](auto to) {
    return dispatch(bias_type, [&](auto tb) {
      using TO = typename decltype(to)::type;
      using TB = typename decltype(tb)::type;
      launch(add_bias_kernel<TO, TB>, elementwise_grid(N * OC), kThreads, 0, stream,
             static_cast<TO*>(out), static_cast<const TB*>(bias), N, OC);
      return cudaGetLastError();
    });
  });
}

cudaError_t bias_grad(float* dbias, const void* dout, ElemType dout_type, int64_t N, int OC,
                      cudaStream_t stream) {
  if (N == 0 || OC == 0) return cudaSuccess;
  const dim3 grid(grid_for(OC, kColTile), row_splits(N)), block(kColTile, kColRows);
  return dispatch(dout_type, [&](auto t) {
    using T = typename decltype(t)::type;
    launch(bias_grad_kernel<T>, grid, block, 0, stream, dbias, static_cast<const T*>(dout), N, OC);
    return cudaGetLastError();
  });
}

}  // namespace strata::kernels::cuda
