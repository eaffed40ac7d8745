// norm_rows.cuh — what the norm kernels share (device code for layernorm.cu and rmsnorm.cu
// only): their row layout — one warp per row, kNormRowWarps rows per 256-thread block, lane l
// taking the groups of kGroup columns from kGroup·l on, 32·kGroup apart, reductions by warp
// shuffles — where the rows lie (DenseRows, or HeadRows for the heads of the attention layout),
// and the parameter gradients, column sums over the rows in a kernel of their own.
//
// Thread-safety: kernels on the caller's stream; the parameter gradients accumulate with atomics,
// so their sums' order (and last bits) may differ from run to run.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/device_util.cuh"

namespace strata::kernels::cuda {

constexpr int kNormRowWarps = 8;              // one warp per row, 8 rows per block
constexpr int kNormColumns = kGroup * 32;     // parameter gradients: columns per block
constexpr int64_t kNormGradGridTarget = 264;  // parameter gradients: blocks in all

// One warp per row: lane l takes the groups of columns starting at 8l, 8l + 256, ...
#define STRATA_FOR_EACH_ROW_GROUP(c, lane, C) \
  for (int c = kGroup * (lane); c < (C); c += kGroup * 32)

// Where a norm's rows of C lie. DenseRows: an (N, C) tensor, row r at r·C, its statistics (mean,
// rstd) at r. Every row takes the first weight.
struct DenseRows {
  int C;
  __device__ __forceinline__ int64_t offset(int64_t row) const { return row * C; }
  __device__ __forceinline__ int64_t stat(int64_t row) const { return row; }
  __device__ __forceinline__ bool second_weight(int64_t) const { return false; }
};
// HeadRows: per_pos consecutive rows of C (heads) per position, a position's first row
// pos_stride elements after the previous position's and its first statistic stat_stride after;
// heads second_from … per_pos − 1 of each position take the second weight (rmsnorm.cu's qk_rows,
// q_rows and k_rows: the query and key heads of the attention layout).
struct HeadRows {
  int per_pos, C;
  int64_t pos_stride, stat_stride;
  int second_from;
  __device__ __forceinline__ int64_t offset(int64_t row) const {
    return row / per_pos * pos_stride + row % per_pos * C;
  }
  __device__ __forceinline__ int64_t stat(int64_t row) const {
    return row / per_pos * stat_stride + row % per_pos;
  }
  __device__ __forceinline__ bool second_weight(int64_t row) const {
    return row % per_pos >= second_from;
  }
};

// The parameter gradients of a norm over N rows of C columns, laid out as `rows` says (dout's rows
// as inp's): dweight += Σ_rows xhat · dy, with xhat = (x − mean) · rstd for LayerNorm (kLayerNorm,
// which also sums dbias += Σ_rows dy) and x · rstd for RMSNorm (mean and dbias unused). A block
// covers kNormColumns columns (each lane one group of kGroup, read as 16-byte vectors where rows
// allow) and its warps take rows kNormRowWarps · gridDim.y apart, summing in registers; the warps'
// sums meet in shared memory and each column adds its block's sum with one atomic. (Summing them in
// the row kernel took two shared-memory atomics per element: 4.9 ms of a 46 ms GPT-2 124M step on
// an H100.)
template <bool kLayerNorm, class TA, class Rows>
__global__ void __launch_bounds__(kNormRowWarps * 32)
    norm_param_grad_kernel(float* dweight, float* dbias, const TA* dout, const TA* inp,
                           const float* mean, const float* rstd, int64_t N, int C, Rows rows,
                           bool vec) {
  constexpr int kSums = kLayerNorm ? 2 : 1;                   // dweight, then dbias
  __shared__ float part[kSums][kNormRowWarps][kNormColumns];  // [sum][warp][column of the tile]
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int c = blockIdx.x * kNormColumns + lane * kGroup;  // this lane's group
  const int k = c < C ? group_count(c, C) : 0;
  float dw[kGroup] = {}, db[kGroup] = {};
  if (k > 0) {
    for (int64_t row = blockIdx.y * int64_t{kNormRowWarps} + warp; row < N;
         row += static_cast<int64_t>(gridDim.y) * kNormRowWarps) {
      float xv[kGroup], dyv[kGroup];
      const int64_t at = rows.offset(row) + c, st = rows.stat(row);
      load_group(inp + at, k, vec, xv);
      load_group(dout + at, k, vec, dyv);
      const float r = rstd[st];
      if constexpr (kLayerNorm) {
        const float m = mean[st];
        for (int e = 0; e < kGroup; ++e) {  // a partial group's missing dy are 0
          dw[e] += (xv[e] - m) * r * dyv[e];
          db[e] += dyv[e];
        }
      } else {
        for (int e = 0; e < kGroup; ++e) dw[e] += xv[e] * r * dyv[e];
      }
    }
  }
  for (int e = 0; e < kGroup; ++e) {
    part[0][warp][lane * kGroup + e] = dw[e];
    if constexpr (kLayerNorm) part[1][warp][lane * kGroup + e] = db[e];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kSums * kNormColumns; i += blockDim.x) {
    const int which = i / kNormColumns, col = i % kNormColumns;
    const int gc = blockIdx.x * kNormColumns + col;
    if (gc >= C) continue;
    float sum = 0.f;
    for (int w2 = 0; w2 < kNormRowWarps; ++w2) sum += part[which][w2][col];
    atomicAdd(which == 0 ? &dweight[gc] : &dbias[gc], sum);
  }
}

// Launches norm_param_grad_kernel: a tile of kNormColumns columns per block in x, and about two
// blocks per SM of a 132-SM GPU in all (more row slices only add atomics). `vec`: the pointers
// and every row start 16-byte aligned.
template <bool kLayerNorm, class TA, class Rows>
void launch_norm_param_grad(float* dweight, float* dbias, const TA* dout, const TA* inp,
                            const float* mean, const float* rstd, int64_t N, int C, Rows rows,
                            bool vec, cudaStream_t stream) {
  const unsigned tiles = static_cast<unsigned>((C + kNormColumns - 1) / kNormColumns);
  const unsigned slices = static_cast<unsigned>(
      std::max<int64_t>(1, std::min<int64_t>((N + kNormRowWarps - 1) / kNormRowWarps,
                                             (kNormGradGridTarget + tiles - 1) / tiles)));
  launch(norm_param_grad_kernel<kLayerNorm, TA, Rows>, dim3(tiles, slices), kNormRowWarps * 32, 0,
         stream, dweight, dbias, dout, inp, mean, rstd, N, C, rows, vec);
}
// The same over the dense rows of an (N, C) tensor.
template <bool kLayerNorm, class TA>
void launch_norm_param_grad(float* dweight, float* dbias, const TA* dout, const TA* inp,
                            const float* mean, const float* rstd, int64_t N, int C, bool vec,
                            cudaStream_t stream) {
  launch_norm_param_grad<kLayerNorm>(dweight, dbias, dout, inp, mean, rstd, N, C, DenseRows{C}, vec,
                                     stream);
}

}  // namespace strata::kernels::cuda
