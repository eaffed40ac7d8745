// flash_attention.cu — flash_attention.h: its entry points, and its f32 kernels, on CUDA cores
// (f32 FMAs from shared memory), which keep fp32 runs true fp32 for the equivalence checks. bf16
// goes to the tensor-core kernels of flash_attention_tc.cu; the backward's D pre-pass and dq
// pass below serve both.
//
// Tiling. Queries and keys come in tiles of kTile = 64 rows. A block has 256 threads seen as a
// 16 × 16 grid (ty, tx): for a 64 × 64 tile of scores it owns rows ty + 16r and columns
// tx + 16c (r, c < 4), and for a 64 × HS tile of outputs rows ty + 16r and head dims tx + 16c
// (c < HS_MAX / 16). The 16 threads of one row group are 16 consecutive lanes of one warp, so a
// row's max and sum are 4 xor-shuffles. Tiles are staged in shared memory, with rows padded by one
// float where threads of a warp read down a column, so those reads fall in distinct banks.
//
// Grouped-query attention: query head h reads key/value head h / (NH / KVH) in the forward; in
// the backward a block owns one key/value head's key tile and walks the query tiles of each of
// the NH / KVH query heads that share it in turn, so dk and dv sum over the group in registers
// and are stored once (no atomics between blocks); with KVH = NH the group is one head and the
// kernels do exactly what multi-head attention does.
//
// Masks (FlashMask): causal, a query tile walks the key tiles up to its own; bidirectional, all
// key tiles; with key lengths, none past the sequence's last real key, and a backward block whose
// key tile is all padding only stores zeros.
//
// Forward (grid: B·NH × query tiles, the last — longest — query tiles first): the block keeps
// its 64 query rows and walks the key tiles 0..its own (causal), with the online softmax: a
// running row max m and sum l, rescaling the output accumulators by e^(m_old − m_new) whenever
// the max grows. Scores are kept in the log2 domain (scale·log2 e folded into one multiply) so
// each exponential is one exp2f. At the end out = acc / l and lse = (m + log2 l) · ln 2.
//
// Backward (FlashAttention-2 order): a pre-pass computes D_i = Σ_d dout_i,d · out_i,d; the main
// kernel (grid: B·KVH × key tiles, the first — longest — key tiles first) keeps one key/value
// tile and accumulates dk, dv in registers while walking, for each query head of its group, the
// query tiles from its own to the last: P = exp(scale·q·kᵀ − lse), dP = dout·vᵀ, dS = P ∘ (dP − D),
// dv += Pᵀ·dout, dk += scale·dSᵀ·q, and dq += scale·dS·k goes to an f32 scratch with atomicAdd
// (several key tiles add to each query row). A last pass stores that scratch into the q part of
// dqkv; dk, dv are stored by their one owning block, so dqkv is assigned (never read), as the
// Backend asks.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/flash_attention_tc.h"
#include "kernels/cuda/flash_rows.cuh"

namespace strata::kernels::cuda {
namespace {

constexpr int kTile = 64;
constexpr int kThreads = 256;      // a 16 × 16 grid of threads
constexpr int kRows = kTile / 16;  // tile rows per thread (r)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Shared-memory row strides (floats). HS_MAX is a multiple of 32, so HS_MAX + 1 puts the rows
// that a warp reads down a column (k_s[tx + 16c][d] for 16 values of tx) in 16 distinct banks.
template <int HS_MAX>
struct Strides {
  static constexpr int kPadded = HS_MAX + 1;  // tiles read down columns
  static constexpr int kDense = HS_MAX;       // tiles read along rows only
  static constexpr int kScores = kTile + 1;   // score / probability tiles
};

template <int HS_MAX>
constexpr size_t forward_smem_bytes() {
  using St = Strides<HS_MAX>;
  return sizeof(float) * kTile * (2 * St::kPadded + St::kDense + St::kScores);
}
template <int HS_MAX>
constexpr size_t backward_smem_bytes() {
  using St = Strides<HS_MAX>;
  return sizeof(float) * (kTile * (4 * St::kPadded + 2 * St::kScores) + 2 * kTile);
}

// dst (kTile, HS_MAX) f32 ← rows [row0, row0 + kTile) of src (rows of stride ld, HS used
// columns); rows at or past S and columns at or past HS are zero, so they add nothing anywhere.
template <int HS_MAX>
__device__ __forceinline__ void load_tile(float* dst, int ldd, const float* src, int64_t ld,
                                          int row0, int S, int HS) {
  for (int idx = threadIdx.x; idx < kTile * HS_MAX; idx += kThreads) {
    const int r = idx / HS_MAX, d = idx % HS_MAX;
    const int row = row0 + r;
    dst[r * ldd + d] = (row < S && d < HS) ? src[row * ld + d] : 0.f;
  }
}

// Sum / max over the 16 lanes of a row group (lanes 0-15 or 16-31 of the warp).
__device__ __forceinline__ float group16_sum(float v) {
  for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}
__device__ __forceinline__ float group16_max(float v) {
  for (int o = 8; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

template <int HS_MAX>
__global__ void __launch_bounds__(kThreads)
    flash_forward_kernel(float* out, float* lse, const float* q, const float* k, FlashRows fr,
                         float scale_log2) {
  using St = Strides<HS_MAX>;
  constexpr int DC = HS_MAX / 16;  // head dims per thread
  float* smem = dynamic_shared_floats();
  float* q_s = smem;                       // (kTile, kPadded)  queries of this block
  float* k_s = q_s + kTile * St::kPadded;  // (kTile, kPadded)  current key tile
  float* v_s = k_s + kTile * St::kPadded;  // (kTile, kDense)   current value tile
  float* p_s = v_s + kTile * St::kDense;   // (kTile, kScores)  probabilities of the tile

  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int NH = fr.NH, KVH = fr.KVH, HS = fr.HS, S = fr.Sq;
  const bool causal = fr.causal;
  const int bh = blockIdx.x, b = bh / NH, h = bh % NH, hk = h / (NH / KVH);
  const int qt = gridDim.y - 1 - blockIdx.y;
  const int q0 = qt * kTile;
  const int len = real_keys(fr, b);  // keys [0, len) are real
  if (len <= 0) return empty_rows(out, lse, fr, b, h, q0, kTile);
  const int last_kt = causal ? min(qt, (len - 1) / kTile) : (len - 1) / kTile;
  const int64_t ld = fr.q_ld, kld = fr.k_ld;
  const float* q_g = q + b * fr.q_batch + static_cast<int64_t>(h) * HS;   // (Sq, HS)
  const float* k_g = k + b * fr.k_batch + static_cast<int64_t>(hk) * HS;  // (Sk, HS)
  const float* v_g = k_g + static_cast<int64_t>(KVH) * HS;                // (Sk, HS)

  load_tile<HS_MAX>(q_s, St::kPadded, q_g, ld, q0, S, HS);

  float o[kRows][DC];
  float m[kRows], l[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.f;
#pragma unroll
    for (int c = 0; c < DC; ++c) o[r][c] = 0.f;
  }

  for (int kt = 0; kt <= last_kt; ++kt) {
    const int k0 = kt * kTile;
    __syncthreads();  // the previous tile's k_s, v_s, p_s are no longer read
    load_tile<HS_MAX>(k_s, St::kPadded, k_g, kld, k0, fr.Sk, HS);
    load_tile<HS_MAX>(v_s, St::kDense, v_g, kld, k0, fr.Sk, HS);
    __syncthreads();

    float s[kRows][4] = {};
    for (int d = 0; d < HS; ++d) {
      float qa[kRows], kb[4];
#pragma unroll
      for (int r = 0; r < kRows; ++r) qa[r] = q_s[(ty + 16 * r) * St::kPadded + d];
#pragma unroll
      for (int c = 0; c < 4; ++c) kb[c] = k_s[(tx + 16 * c) * St::kPadded + d];
#pragma unroll
      for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int c = 0; c < 4; ++c) s[r][c] = fmaf(qa[r], kb[c], s[r][c]);
    }

#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int i = q0 + ty + 16 * r;
      float mx = -INFINITY;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int j = k0 + tx + 16 * c;
        s[r][c] = ((!causal || j <= i) && j < len) ? s[r][c] * scale_log2 : -INFINITY;
        mx = fmaxf(mx, s[r][c]);
      }
      // Key 0 is in tile 0 and visible to every row, so m is finite from the first tile on and
      // a later all-masked row tile leaves it unchanged (no −inf − −inf).
      const float m_new = fmaxf(m[r], group16_max(mx));
      const float alpha = exp2f(m[r] - m_new);  // 0 on the first tile (m = −inf)
      float rs = 0.f;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const float p = exp2f(s[r][c] - m_new);
        p_s[(ty + 16 * r) * St::kScores + tx + 16 * c] = p;
        rs += p;
      }
      l[r] = l[r] * alpha + group16_sum(rs);
      m[r] = m_new;
#pragma unroll
      for (int c = 0; c < DC; ++c) o[r][c] *= alpha;
    }
    __syncthreads();

    for (int j = 0; j < kTile; ++j) {
      float vb[DC];
#pragma unroll
      for (int c = 0; c < DC; ++c) vb[c] = v_s[j * St::kDense + tx + 16 * c];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const float p = p_s[(ty + 16 * r) * St::kScores + j];
#pragma unroll
        for (int c = 0; c < DC; ++c) o[r][c] = fmaf(p, vb[c], o[r][c]);
      }
    }
  }

#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int i = q0 + ty + 16 * r;
    if (i >= S) continue;
    const float inv = 1.f / l[r];
    float* o_g = out + b * fr.o_batch + i * fr.o_ld + static_cast<int64_t>(h) * HS;  // (HS)
#pragma unroll
    for (int c = 0; c < DC; ++c) {
      const int d = tx + 16 * c;
      if (d < HS) o_g[d] = o[r][c] * inv;
    }
    if (tx == 0) lse[bh * fr.lse_ld + i] = (m[r] + log2f(l[r])) * kLn2;
  }
}

// D (B, NH, S) = Σ_d dout · out over each head's row: one warp per (b, s, h).
template <class T>
__global__ void flash_backward_dsum_kernel(float* dsum, const T* dout, const T* out, int B, int S,
                                           int NH, int HS) {
  const int64_t rows = static_cast<int64_t>(B) * S * NH;
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
  for (int64_t row = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32; row < rows;
       row += warps) {
    const T* g = dout + row * HS;  // (HS)
    const T* o = out + row * HS;   // (HS)
    float s = 0.f;
    for (int d = lane; d < HS; d += 32) s = fmaf(to_float(g[d]), to_float(o[d]), s);
    s = warp_sum(s);
    if (lane == 0) {
      const int64_t bs = row / NH, h = row % NH, b = bs / S, i = bs % S;
      dsum[(b * NH + h) * S + i] = s;
    }
  }
}

// kAdd false: dk, dv stored into dk_out (the q/k/v gradient); true: added (a ring block's f32
// key/value gradient). Both lie as the keys.
template <int HS_MAX, bool kAdd>
__global__ void __launch_bounds__(kThreads)
    flash_backward_kernel(float* dk_out, float* dq_acc, const float* dout, const float* q,
                          const float* k, const float* lse, const float* dsum, FlashRows fr,
                          int q_tiles, float scale, float scale_log2) {
  using St = Strides<HS_MAX>;
  constexpr int DC = HS_MAX / 16;
  float* smem = dynamic_shared_floats();
  float* k_s = smem;                          // (kTile, kPadded)  this block's keys
  float* v_s = k_s + kTile * St::kPadded;     // (kTile, kPadded)  this block's values
  float* q_s = v_s + kTile * St::kPadded;     // (kTile, kPadded)  current query tile
  float* g_s = q_s + kTile * St::kPadded;     // (kTile, kPadded)  its output gradient
  float* p_s = g_s + kTile * St::kPadded;     // (kTile, kScores)  P, [query][key]
  float* ds_s = p_s + kTile * St::kScores;    // (kTile, kScores)  dS, [query][key]
  float* lse_s = ds_s + kTile * St::kScores;  // (kTile) lse of the query rows, log2 units
  float* d_s = lse_s + kTile;                 // (kTile) D of the query rows

  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int NH = fr.NH, KVH = fr.KVH, HS = fr.HS, S = fr.Sq, Sk = fr.Sk;
  const bool causal = fr.causal;
  const int b = blockIdx.x / KVH, hk = blockIdx.x % KVH, group = NH / KVH;
  const int kt = blockIdx.y;
  const int k0 = kt * kTile;
  const int tiles = q_tiles;
  const int64_t ld = fr.q_ld, kld = fr.k_ld;  // row strides of q and of k, v, dk, dv
  const int64_t ldo = fr.o_ld;                // of dout and dq_acc
  const int64_t k_at = b * fr.k_batch + static_cast<int64_t>(hk) * HS;
  const float* k_g = k + k_at;                              // (Sk, HS), stride kld
  const float* v_g = k_g + static_cast<int64_t>(KVH) * HS;  // (Sk, HS), stride kld
  float* dk_g = dk_out + k_at;                              // (Sk, HS), stride kld
  float* dv_g = dk_g + static_cast<int64_t>(KVH) * HS;      // (Sk, HS), stride kld
  const int len = real_keys(fr, b);                         // keys [0, len) are real
  if (k0 >= len) {  // padding keys only: no query sees them (the whole block returns)
    if (!kAdd) {    // assigned gradients are 0 there; accumulated ones stay as they are
      for (int idx = threadIdx.x; idx < kTile * HS; idx += kThreads) {
        const int j = k0 + idx / HS, d = idx % HS;
        if (j < Sk) dk_g[j * kld + d] = dv_g[j * kld + d] = 0.f;
      }
    }
    return;
  }

  load_tile<HS_MAX>(k_s, St::kPadded, k_g, kld, k0, Sk, HS);
  load_tile<HS_MAX>(v_s, St::kPadded, v_g, kld, k0, Sk, HS);

  float dk[kRows][DC], dv[kRows][DC];  // rows: keys ty + 16r of this tile
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int c = 0; c < DC; ++c) dk[r][c] = dv[r][c] = 0.f;

  for (int h = hk * group; h < (hk + 1) * group; ++h)  // the query heads sharing this key head
    for (int qt = causal ? kt : 0; qt < tiles; ++qt) {
      const float* q_g = q + b * fr.q_batch + static_cast<int64_t>(h) * HS;  // (Sq, HS)
      const float* g_g = dout + b * fr.o_batch + static_cast<int64_t>(h) * HS;
      float* dq_g = dq_acc + b * fr.o_batch + static_cast<int64_t>(h) * HS;
      const int64_t bh = static_cast<int64_t>(b) * NH + h;
      const float* lse_g = lse + bh * fr.lse_ld;  // (Sq)
      const float* d_g = dsum + bh * fr.lse_ld;   // (Sq)
      const int q0 = qt * kTile;
      __syncthreads();  // the previous query tile is no longer read
      load_tile<HS_MAX>(q_s, St::kPadded, q_g, ld, q0, S, HS);
      load_tile<HS_MAX>(g_s, St::kPadded, g_g, ldo, q0, S, HS);
      for (int r = threadIdx.x; r < kTile; r += kThreads) {
        const bool in = q0 + r < S;
        lse_s[r] = in ? lse_g[q0 + r] * kLog2e : 0.f;
        d_s[r] = in ? d_g[q0 + r] : 0.f;
      }
      __syncthreads();

      // Scores and dP for queries ty + 16r, keys tx + 16c.
      float s[kRows][4] = {}, dp[kRows][4] = {};
      for (int d = 0; d < HS; ++d) {
        float qa[kRows], ga[kRows], kb[4], vb[4];
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          qa[r] = q_s[(ty + 16 * r) * St::kPadded + d];
          ga[r] = g_s[(ty + 16 * r) * St::kPadded + d];
        }
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          kb[c] = k_s[(tx + 16 * c) * St::kPadded + d];
          vb[c] = v_s[(tx + 16 * c) * St::kPadded + d];
        }
#pragma unroll
        for (int r = 0; r < kRows; ++r)
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            s[r][c] = fmaf(qa[r], kb[c], s[r][c]);
            dp[r][c] = fmaf(ga[r], vb[c], dp[r][c]);
          }
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const int qi = ty + 16 * r, i = q0 + qi;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int kj = tx + 16 * c, j = k0 + kj;
          const bool seen = (!causal || j <= i) && j < len && i < S;
          const float p = seen ? exp2f(s[r][c] * scale_log2 - lse_s[qi]) : 0.f;
          p_s[qi * St::kScores + kj] = p;
          ds_s[qi * St::kScores + kj] = p * (dp[r][c] - d_s[qi]);
        }
      }
      __syncthreads();

      // dv += Pᵀ·dout and dk += dSᵀ·q for keys ty + 16r, dims tx + 16c (scale applied at the end).
      for (int qi = 0; qi < kTile; ++qi) {
        float ga[DC], qa[DC];
#pragma unroll
        for (int c = 0; c < DC; ++c) {
          ga[c] = g_s[qi * St::kPadded + tx + 16 * c];
          qa[c] = q_s[qi * St::kPadded + tx + 16 * c];
        }
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          const float p = p_s[qi * St::kScores + ty + 16 * r];
          const float ds = ds_s[qi * St::kScores + ty + 16 * r];
#pragma unroll
          for (int c = 0; c < DC; ++c) {
            dv[r][c] = fmaf(p, ga[c], dv[r][c]);
            dk[r][c] = fmaf(ds, qa[c], dk[r][c]);
          }
        }
      }

      // dq += scale·dS·k for queries ty + 16r, dims tx + 16c: partial over this key tile.
      float dq[kRows][DC] = {};
      for (int kj = 0; kj < kTile; ++kj) {
        float kb[DC];
#pragma unroll
        for (int c = 0; c < DC; ++c) kb[c] = k_s[kj * St::kPadded + tx + 16 * c];
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          const float ds = ds_s[(ty + 16 * r) * St::kScores + kj];
#pragma unroll
          for (int c = 0; c < DC; ++c) dq[r][c] = fmaf(ds, kb[c], dq[r][c]);
        }
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const int i = q0 + ty + 16 * r;
        if (i >= S) continue;
#pragma unroll
        for (int c = 0; c < DC; ++c) {
          const int d = tx + 16 * c;
          if (d < HS) atomicAdd(&dq_g[i * ldo + d], scale * dq[r][c]);
        }
      }
    }

#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int j = k0 + ty + 16 * r;
    if (j >= Sk) continue;
#pragma unroll
    for (int c = 0; c < DC; ++c) {
      const int d = tx + 16 * c;
      if (d >= HS) continue;
      const int64_t at = j * kld + d;
      if (kAdd) {
        dk_g[at] += scale * dk[r][c];
        dv_g[at] += dv[r][c];
      } else {
        dk_g[at] = scale * dk[r][c];
        dv_g[at] = dv[r][c];
      }
    }
  }
}

// The q part of dqkv (B, S, NH + 2·KVH, HS) = dq_acc (B, S, NH, HS): rows of `row` = NH·HS
// elements, `ld` apart in dqkv.
template <class T>
__global__ void flash_backward_dq_kernel(T* dqkv, const float* dq_acc, int64_t tokens, int64_t row,
                                         int64_t ld) {
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       idx < tokens * row; idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t at = (idx / row) * ld + idx % row;
    dqkv[at] = from_float<T>(dq_acc[idx]);
  }
}

// Query/key tiles go on gridDim.y, which holds at most 65535. KVH divides NH (both may be 0 only
// together with nothing to do: NH = 0 is an empty call).
bool valid_shape(int B, int S, int NH, int KVH, int HS) {
  return B >= 0 && S >= 0 && NH >= 0 && KVH >= 1 && NH % KVH == 0 && HS >= 1 &&
         HS <= kFlashMaxHeadSize && (S + kTile - 1) / kTile <= 65535;
}
// A block's rows: both sides as valid_shape asks, and causal only on the same positions.
bool valid_rows(const FlashRows& r) {
  return valid_shape(r.B, r.Sq, r.NH, r.KVH, r.HS) && valid_shape(r.B, r.Sk, r.NH, r.KVH, r.HS) &&
         (!r.causal || r.Sq == r.Sk);
}

float log2_scale(int HS) {
  return kLog2e / std::sqrt(static_cast<float>(HS));
}

// The forward on either kernel family: out and lse of the rows of r.
cudaError_t forward_rows(void* out, float* lse, const void* q, const void* k, ElemType type,
                         const FlashRows& r, cudaStream_t stream) {
  if (type == ElemType::kBF16) return flash_tc_forward(out, lse, q, k, r, 0, stream);
  const dim3 grid(static_cast<unsigned>(r.B * r.NH),
                  static_cast<unsigned>((r.Sq + kTile - 1) / kTile));
  return with_head_size(r.HS, [&](auto hs_max) {
    constexpr int HS_MAX = decltype(hs_max)::value;
    return launch_opted_in(flash_forward_kernel<HS_MAX>, grid, kThreads,
                           forward_smem_bytes<HS_MAX>(), stream, static_cast<float*>(out), lse,
                           static_cast<const float*>(q), static_cast<const float*>(k), r,
                           log2_scale(r.HS));
  });
}

// The backward's main kernel on either family, given D: dq into the f32 dq_acc, dk and dv into
// dk_out (assigned in the operands' type, or added in f32 when `add`).
cudaError_t backward_rows(void* dk_out, bool add, float* dq_acc, const void* dout, const void* q,
                          const void* k, const float* lse, const float* dsum, ElemType type,
                          const FlashRows& r, cudaStream_t stream) {
  if (type == ElemType::kBF16)
    return flash_tc_backward(dk_out, add, dq_acc, dout, q, k, lse, dsum, r, stream);
  const dim3 grid(static_cast<unsigned>(r.B * r.KVH),
                  static_cast<unsigned>((r.Sk + kTile - 1) / kTile));
  const int q_tiles = (r.Sq + kTile - 1) / kTile;
  const float scale = 1.f / std::sqrt(static_cast<float>(r.HS));
  return with_head_size(r.HS, [&](auto hs_max) {
    constexpr int HS_MAX = decltype(hs_max)::value;
    auto run = [&](auto add_tag) {
      return launch_opted_in(flash_backward_kernel<HS_MAX, decltype(add_tag)::value>, grid,
                             kThreads, backward_smem_bytes<HS_MAX>(), stream,
                             static_cast<float*>(dk_out), dq_acc, static_cast<const float*>(dout),
                             static_cast<const float*>(q), static_cast<const float*>(k), lse, dsum,
                             r, q_tiles, scale, log2_scale(r.HS));
    };
    return add ? run(std::true_type{}) : run(std::false_type{});
  });
}

// The qkv's element offset of its first key head.
int64_t key_offset(int NH, int HS) {
  return static_cast<int64_t>(NH) * HS;
}

}  // namespace

FlashRows whole_sequence_rows(int B, int S, int NH, int KVH, int HS, FlashMask mask) {
  FlashRows r;
  r.B = B;
  r.Sq = r.Sk = S;
  r.NH = NH;
  r.KVH = KVH;
  r.HS = HS;
  r.q_ld = r.k_ld = static_cast<int64_t>(NH + 2 * KVH) * HS;
  r.q_batch = r.k_batch = S * r.q_ld;
  r.o_ld = static_cast<int64_t>(NH) * HS;
  r.o_batch = S * r.o_ld;
  r.lse_ld = S;
  r.causal = mask.causal;
  r.key_len = mask.key_len;
  return r;
}

cudaError_t flash_attention_forward(void* out, float* lse, const void* qkv, ElemType type, int B,
                                    int S, int NH, int KVH, int HS, cudaStream_t stream,
                                    FlashMask mask) {
  if (!valid_shape(B, S, NH, KVH, HS)) return cudaErrorInvalidValue;
  if (static_cast<int64_t>(B) * NH * S == 0) return cudaSuccess;
  const FlashRows r = whole_sequence_rows(B, S, NH, KVH, HS, mask);
  const void* k = static_cast<const char*>(qkv) + key_offset(NH, HS) * elem_size(type);
  return forward_rows(out, lse, qkv, k, type, r, stream);
}

cudaError_t flash_attention_forward_bf16_warp_rows(void* out, float* lse, const void* qkv, int B,
                                                   int S, int NH, int KVH, int HS, int warp_rows,
                                                   cudaStream_t stream, FlashMask mask) {
  if (!valid_shape(B, S, NH, KVH, HS) || (warp_rows != 16 && warp_rows != 32))
    return cudaErrorInvalidValue;
  if (static_cast<int64_t>(B) * NH * S == 0) return cudaSuccess;
  const bf16* k = static_cast<const bf16*>(qkv) + key_offset(NH, HS);
  return flash_tc_forward(out, lse, qkv, k, whole_sequence_rows(B, S, NH, KVH, HS, mask), warp_rows,
                          stream);
}

size_t flash_attention_backward_scratch_bytes(int B, int S, int NH, int /*KVH*/, int HS) {
  const size_t rows = static_cast<size_t>(B) * S * NH;
  return sizeof(float) * (rows * static_cast<size_t>(HS) + rows);
}

cudaError_t flash_attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out,
                                     const float* lse, ElemType type, int B, int S, int NH, int KVH,
                                     int HS, void* scratch, cudaStream_t stream, FlashMask mask) {
  if (!valid_shape(B, S, NH, KVH, HS)) return cudaErrorInvalidValue;
  const int64_t rows = static_cast<int64_t>(B) * S * NH;
  if (rows == 0) return cudaSuccess;
  float* dq_acc = static_cast<float*>(scratch);  // (B, S, NH, HS)
  float* dsum = dq_acc + rows * HS;              // (B, NH, S)
  cudaError_t err = cudaMemsetAsync(dq_acc, 0, sizeof(float) * rows * HS, stream);
  if (err != cudaSuccess) return err;
  const FlashRows r = whole_sequence_rows(B, S, NH, KVH, HS, mask);
  return dispatch(type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const unsigned dsum_blocks = grid_for(rows * 32, kThreads);
    launch(flash_backward_dsum_kernel<T>, dsum_blocks, kThreads, 0, stream, dsum,
           static_cast<const T*>(dout), static_cast<const T*>(out), B, S, NH, HS);
    const T* k = static_cast<const T*>(qkv) + key_offset(NH, HS);
    T* dk = static_cast<T*>(dqkv) + key_offset(NH, HS);
    cudaError_t e = backward_rows(dk, false, dq_acc, dout, qkv, k, lse, dsum, type, r, stream);
    if (e != cudaSuccess) return e;
    const int64_t row = static_cast<int64_t>(NH) * HS;
    const int64_t ld = static_cast<int64_t>(NH + 2 * KVH) * HS;
    const int64_t tokens = static_cast<int64_t>(B) * S;
    launch(flash_backward_dq_kernel<T>, grid_for(tokens * row, kThreads), kThreads, 0, stream,
           static_cast<T*>(dqkv), dq_acc, tokens, row, ld);
    return cudaGetLastError();
  });
}

// ---- ring attention blocks (attention_block.h) ----

cudaError_t attention_block_forward(void* out, float* lse, const void* q, const void* k,
                                    ElemType type, const FlashRows& r, cudaStream_t stream) {
  if (!valid_rows(r)) return cudaErrorInvalidValue;
  if (static_cast<int64_t>(r.B) * r.NH * r.Sq == 0) return cudaSuccess;
  return forward_rows(out, lse, q, k, type, r, stream);
}

cudaError_t attention_block_backward(float* dq, float* dkv, const void* dout, const void* q,
                                     const void* k, const float* lse, const float* delta,
                                     ElemType type, const FlashRows& r, cudaStream_t stream) {
  if (!valid_rows(r)) return cudaErrorInvalidValue;
  if (static_cast<int64_t>(r.B) * r.NH * r.Sq * r.Sk == 0) return cudaSuccess;
  return backward_rows(dkv, true, dq, dout, q, k, lse, delta, type, r, stream);
}

cudaError_t attention_block_delta(float* delta, const void* dout, const void* out, ElemType type,
                                  int B, int S, int NH, int HS, cudaStream_t stream) {
  const int64_t rows = static_cast<int64_t>(B) * S * NH;
  if (B < 0 || S < 0 || NH < 0 || HS < 1) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  return dispatch(type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch(flash_backward_dsum_kernel<T>, grid_for(rows * 32, kThreads), kThreads, 0, stream, delta,
           static_cast<const T*>(dout), static_cast<const T*>(out), B, S, NH, HS);
    return cudaGetLastError();
  });
}

}  // namespace strata::kernels::cuda
