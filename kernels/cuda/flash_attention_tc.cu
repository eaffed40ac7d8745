// flash_attention_tc.cu — flash attention (causal, or bidirectional over padded keys: FlashMask)
// for bf16 on tensor cores (FlashAttention-2's
// work split, on mma.sync m16n8k16; kernels/cuda/mma.cuh has the fragment layouts).
//
// Tiling. A block is 4 warps and works on a tile of rows — queries in the forward (32 per warp,
// as two 16-row m-tiles), keys in the backward (16 per warp) — the other side coming in tiles of
// 64 staged row-major in shared memory as bf16 by cp.async, rows padded by 8 elements so that
// the 8 rows one ldmatrix phase reads fall in distinct banks. Every operand is read from its tile
// by ldmatrix, transposed on the way where the product wants it (.trans), so no tile is ever
// stored twice. Head dims are padded with zeros to HS_MAX (32, 64 or 128), so any head size up
// to 128 runs; rows past S are zero and masked.
//
// Forward (grid: B·NH × query tiles, the last — longest — first). A warp keeps its query rows as
// A fragments in registers (up to head size 64; at 128 they are read from shared memory at each
// k-step, as the accumulators take the registers). For each key tile up to its last row
// (causal): S = Q·Kᵀ (16 × 64 per m-tile, eight accumulator tiles, K's rows are Kᵀ's columns;
// each key fragment read serves every m-tile), the mask only where the tile reaches past the
// warp's first row, the online softmax in the log2 domain (each row's 64 scores are spread over
// the 4 lanes of a quad: max and sum are two xor-shuffles; the running sum stays per lane until
// the end), then O += P·V with P taken from the score accumulators as A fragments (no trip
// through shared memory) and V read transposed. The copies overlap the products: the value tile
// is staged while the scores are computed, the next key tile while P·V is.
//
// Grouped-query attention: a forward block reads the key/value head h / (NH / KVH) of its query
// head h. A backward block owns a key tile of one key/value head and walks the query tiles of
// each query head of its group in turn — one sequence of steps, so the next step's tiles are
// staged during this one across a change of head too — summing dK and dV over the group in
// registers, stored once. With KVH = NH the group is one head: the multi-head kernels exactly.
//
// Backward (grid: B·KVH × key tiles, the first — longest — first). A warp keeps dK and dV of its
// 16 keys in registers and walks the query tiles from its own to the last, the next one staged
// (double-buffered) while this one is computed on: Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ (keys as rows, so
// Pᵀ and dSᵀ come out as the A fragments of the next products), Pᵀ = exp2(Sᵀ·scale·log2 e − lse),
// dSᵀ = Pᵀ ∘ (dPᵀ − D), dV += Pᵀ·dO, dK += dSᵀ·Q; dSᵀ goes to shared memory (keys as rows, two
// values per store) and each warp then forms dQ = dS·K for 16 of the tile's queries (dS read
// transposed), added with f32 atomics to the dq scratch (several key tiles add to each query
// row).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/flash_attention_tc.h"
#include "kernels/cuda/flash_rows.cuh"
#include "kernels/cuda/mma.cuh"

namespace strata::kernels::cuda {
namespace {

constexpr int kTile = 64;
constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kTileLd = kTile + 8;     // row stride of the dS tile (kTile × kTile)
constexpr int kKeyFrags = kTile / 8;   // accumulator tiles across a tile of 64
constexpr int kKeySteps = kTile / 16;  // k-steps across a tile of 64
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <int HS_MAX>
struct Shape {
  static constexpr int kLd = HS_MAX + 8;          // row stride of a tile (kTile × HS_MAX)
  static constexpr int kHeadFrags = HS_MAX / 8;   // accumulator tiles across the head dims
  static constexpr int kHeadSteps = HS_MAX / 16;  // k-steps across the head dims
  static constexpr int kRowTile = kTile * kLd;    // elements of a tile
  // Forward: query rows per warp, as 16-row m-tiles. Two share each key and value fragment a
  // warp reads from shared memory (half the reads per product), as FlashAttention-2's 128-row
  // tiles of 4 warps do. Measured on an H100 (bench_cuda_kernels, 2026-11-24) two pay at head
  // size 128 (GPT 1.3B's shape: 0.418 ms against 0.431 ms with one), and one is faster below
  // (GPT-2 124M's, head size 64: 0.225-0.230 ms against 0.255-0.265 ms with two: half the
  // registers, more blocks per SM). flash_attention_forward_bf16_warp_rows runs either.
  static constexpr int kDefaultMTiles = HS_MAX > 64 ? 2 : 1;
  __host__ __device__ static constexpr int query_tile(int m_tiles) { return kWarps * 16 * m_tiles; }
  __host__ __device__ static constexpr size_t forward_smem(int m_tiles) {
    return sizeof(bf16) * static_cast<size_t>(query_tile(m_tiles) + 2 * kTile) * kLd;
  }
  // Backward: keys, values, two query tiles and their output gradients, dSᵀ, lse and D twice.
  static constexpr size_t backward_smem =
      sizeof(bf16) * (6 * kRowTile + kTile * kTileLd) + sizeof(float) * 4 * kTile;
};

// Max and sum over the 4 lanes of a quad, which hold one accumulator row between them.
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(kFullMask, v, 1));
  return fmaxf(v, __shfl_xor_sync(kFullMask, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(kFullMask, v, 1);
  return v + __shfl_xor_sync(kFullMask, v, 2);
}

__device__ __forceinline__ bf16* dynamic_shared_bf16() {
  return reinterpret_cast<bf16*>(dynamic_shared_floats());
}

template <int HS_MAX, int kM>
__global__ void __launch_bounds__(kThreads)
    flash_tc_forward_kernel(bf16* out, float* lse, const bf16* q, const bf16* k, FlashRows fr,
                            float scale_log2, bool vec) {
  using Sh = Shape<HS_MAX>;
  constexpr int kQ = Sh::query_tile(kM);
  bf16* q_s = dynamic_shared_bf16();  // (kQ, HS_MAX) queries of this block
  bf16* k_s = q_s + kQ * Sh::kLd;     // (kTile, HS_MAX) current key tile
  bf16* v_s = k_s + Sh::kRowTile;     // (kTile, HS_MAX) current value tile

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int NH = fr.NH, KVH = fr.KVH, HS = fr.HS, S = fr.Sq;
  const bool causal = fr.causal;
  const int bh = blockIdx.x, b = bh / NH, h = bh % NH, hk = h / (NH / KVH);
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kQ;
  const int w0 = q0 + 16 * kM * warp;  // this warp's first row
  // Key tiles up to the one holding the block's last row (causal) and the sequence's last real
  // key.
  const int len = real_keys(fr, b);
  if (len <= 0) return empty_rows(out, lse, fr, b, h, q0, kQ);
  const int key_tiles = (causal ? min(q0 + kQ - 1, len - 1) : len - 1) / kTile + 1;
  const int64_t ld = fr.q_ld, kld = fr.k_ld;
  const bf16* q_g = q + b * fr.q_batch + static_cast<int64_t>(h) * HS;
  const bf16* k_g = k + b * fr.k_batch + static_cast<int64_t>(hk) * HS;
  const bf16* v_g = k_g + static_cast<int64_t>(KVH) * HS;

  // Copy groups: the queries with the first key tile, then per key tile its value tile and the
  // next key tile (empty after the last), so that "all but the latest group" is always the key
  // tile the scores need next.
  stage_tile<kQ, HS_MAX>(q_s, Sh::kLd, q_g, ld, q0, S, HS, vec);
  stage_tile<kTile, HS_MAX>(k_s, Sh::kLd, k_g, kld, 0, fr.Sk, HS, vec);
  cp_async_commit();
  // The warp's query fragments stay in registers where they fit beside the accumulators, and
  // are read from q_s at every k-step where they do not (two m-tiles at head size 128).
  constexpr bool kQInRegs = kM * HS_MAX <= 128;
  constexpr int kQSteps = kQInRegs ? Sh::kHeadSteps : 1;
  uint32_t qa[kM][kQSteps][4];

  // This lane's rows in m-tile i: row[i][0] = g, row[i][1] = g + 8 of its 16 (accumulator
  // elements 0-1 and 2-3).
  int row[kM][2];
#pragma unroll
  for (int i = 0; i < kM; ++i) row[i][0] = w0 + 16 * i + g, row[i][1] = w0 + 16 * i + g + 8;
  float o[kM][Sh::kHeadFrags][4] = {};
  float m[kM][2], l[kM][2];  // running max; this lane's part of the row sums (quad-summed last)
#pragma unroll
  for (int i = 0; i < kM; ++i) m[i][0] = m[i][1] = -INFINITY, l[i][0] = l[i][1] = 0.f;

  for (int kt = 0; kt < key_tiles; ++kt) {
    const int k0 = kt * kTile;
    __syncthreads();  // the previous value tile is no longer read
    stage_tile<kTile, HS_MAX>(v_s, Sh::kLd, v_g, kld, k0, fr.Sk, HS, vec);
    cp_async_commit();
    cp_async_wait<1>();  // this thread's copies of the key tile (and queries) have landed,
    __syncthreads();     // and every thread's
    if (kQInRegs && kt == 0) {
#pragma unroll
      for (int i = 0; i < kM; ++i)
#pragma unroll
        for (int ks = 0; ks < kQSteps; ++ks)
          load_a(qa[i][ks], q_s, Sh::kLd, 16 * kM * warp + 16 * i, 16 * ks);
    }
    // A tile that starts past this warp's last row is masked for all of it: the warp only takes
    // part in the copies and barriers. Key 0 is visible to every row, so m is finite from the
    // first tile on and a later masked element never gives −inf − −inf.
    const bool visible = !causal || k0 <= w0 + 16 * kM - 1;
    float s[kM][kKeyFrags][4] = {};
    if (visible) {
#pragma unroll
      for (int ks = 0; ks < Sh::kHeadSteps; ++ks) {
        const int qk = kQInRegs ? ks : 0;
        if (!kQInRegs) {
#pragma unroll
          for (int i = 0; i < kM; ++i)
            load_a(qa[i][0], q_s, Sh::kLd, 16 * kM * warp + 16 * i, 16 * ks);
        }
#pragma unroll
        for (int j = 0; j < kKeyFrags; j += 2) {
          uint32_t kb[4];
          load_b_pair(kb, k_s, Sh::kLd, 8 * j, 16 * ks);
#pragma unroll
          for (int i = 0; i < kM; ++i) mma_16816_pair(s[i][j], s[i][j + 1], qa[i][qk], kb);
        }
      }

      // The mask where the tile reaches past the warp's first row (causal) or past the last real
      // key; causal, keys past S lie right of every row that is stored.
      const bool diagonal = (causal && k0 + kTile - 1 > w0) || k0 + kTile > len;
#pragma unroll
      for (int i = 0; i < kM; ++i) {
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < kKeyFrags; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int col = k0 + 8 * j + 2 * t + e % 2;
            float v = s[i][j][e] * scale_log2;
            if (diagonal && ((causal && col > row[i][e / 2]) || col >= len)) v = -INFINITY;
            s[i][j][e] = v;
            mx[e / 2] = fmaxf(mx[e / 2], v);
          }
        float alpha[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const float m_new = fmaxf(m[i][r], quad_max(mx[r]));
          alpha[r] = exp2f(m[i][r] - m_new);  // 0 on the first tile (m = −inf)
          m[i][r] = m_new;
          l[i][r] *= alpha[r];
        }
#pragma unroll
        for (int j = 0; j < kKeyFrags; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float p = exp2f(s[i][j][e] - m[i][e / 2]);
            l[i][e / 2] += p;
            s[i][j][e] = p;
          }
#pragma unroll
        for (int dn = 0; dn < Sh::kHeadFrags; ++dn)
#pragma unroll
          for (int e = 0; e < 4; ++e) o[i][dn][e] *= alpha[e / 2];
      }
    }

    cp_async_wait<0>();  // the value tile has landed, and after the barrier every warp is done
    __syncthreads();     // with the key tile: the next one may be staged over it
    if (kt + 1 < key_tiles)
      stage_tile<kTile, HS_MAX>(k_s, Sh::kLd, k_g, kld, k0 + kTile, fr.Sk, HS, vec);
    cp_async_commit();

    if (visible) {
#pragma unroll
      for (int kk = 0; kk < kKeySteps; ++kk) {
        uint32_t pa[kM][4];
#pragma unroll
        for (int i = 0; i < kM; ++i) accumulators_to_a(pa[i], s[i][2 * kk], s[i][2 * kk + 1]);
#pragma unroll
        for (int dn = 0; dn < Sh::kHeadFrags; dn += 2) {
          uint32_t vb[4];
          load_b_pair_trans(vb, v_s, Sh::kLd, 8 * dn, 16 * kk);
#pragma unroll
          for (int i = 0; i < kM; ++i) {
            mma_16816_pair(o[i][dn], o[i][dn + 1], pa[i], vb);
          }
        }
      }
    }
  }

#pragma unroll
  for (int i = 0; i < kM; ++i)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float sum = quad_sum(l[i][r]);
      const int qr = row[i][r];
      if (qr >= S) continue;
      const float inv = 1.f / sum;
      bf16* o_g = out + b * fr.o_batch + qr * fr.o_ld + static_cast<int64_t>(h) * HS;  // (HS)
#pragma unroll
      for (int dn = 0; dn < Sh::kHeadFrags; ++dn)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int d = 8 * dn + 2 * t + e;
          if (d < HS) o_g[d] = round_to_bf16(o[i][dn][2 * r + e] * inv);
        }
      if (t == 0) lse[bh * fr.lse_ld + qr] = (m[i][r] + log2f(sum)) * kLn2;
    }
}

// kAdd false: dk, dv stored in bf16 into dk_out (the q/k/v gradient); true: added into the f32
// dk_out (a ring block's key/value gradient). Both lie as the keys.
template <int HS_MAX, bool kAdd>
__global__ void __launch_bounds__(kThreads)
    flash_tc_backward_kernel(void* dk_out, float* dq_acc, const bf16* dout, const bf16* q,
                             const bf16* k, const float* lse, const float* dsum, FlashRows fr,
                             int q_tiles, float scale, float scale_log2, bool vec) {
  using Sh = Shape<HS_MAX>;
  bf16* k_s = dynamic_shared_bf16();     // (kTile, HS_MAX)  this block's keys
  bf16* v_s = k_s + Sh::kRowTile;        // (kTile, HS_MAX)  this block's values
  bf16* q_s2 = v_s + Sh::kRowTile;       // (2, kTile, HS_MAX)  query tiles, double-buffered
  bf16* g_s2 = q_s2 + 2 * Sh::kRowTile;  // (2, kTile, HS_MAX)  their output gradients
  bf16* ds_s = g_s2 + 2 * Sh::kRowTile;  // (kTile keys, kTile queries)  dSᵀ
  float* lse_s2 = reinterpret_cast<float*>(ds_s + kTile * kTileLd);  // (2, kTile) log2 units
  float* d_s2 = lse_s2 + 2 * kTile;                                  // (2, kTile) D

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int NH = fr.NH, KVH = fr.KVH, HS = fr.HS, S = fr.Sq, Sk = fr.Sk;
  const bool causal = fr.causal;
  const int b = blockIdx.x / KVH, hk = blockIdx.x % KVH, group = NH / KVH;
  const int k0 = blockIdx.y * kTile;
  // Causal (Sq = Sk), the query tiles from the key tile's own; else all of them.
  const int first = causal ? blockIdx.y : 0, tiles = q_tiles;
  // Steps: query tiles first..tiles-1 of query head hk·group, then of the next head, and so on.
  const int per_head = tiles - first, steps = group * per_head;
  const int64_t ld = fr.q_ld, kld = fr.k_ld;  // row strides of q and of k, v, dk, dv
  const int64_t ldo = fr.o_ld;                // of dout and dq_acc
  const int64_t k_at = b * fr.k_batch + static_cast<int64_t>(hk) * HS;
  const bf16* k_g = k + k_at;
  const bf16* v_g = k_g + static_cast<int64_t>(KVH) * HS;
  const int len = real_keys(fr, b);  // keys [0, len) are real
  if (k0 >= len) {  // padding keys only: no query sees them (the whole block returns)
    if (!kAdd) {    // assigned gradients are 0 there; accumulated ones stay as they are
      bf16* dk_g = static_cast<bf16*>(dk_out) + k_at;
      bf16* dv_g = dk_g + static_cast<int64_t>(KVH) * HS;
      for (int idx = threadIdx.x; idx < kTile * HS; idx += kThreads) {
        const int j = k0 + idx / HS, d = idx % HS;
        if (j < Sk) dk_g[j * kld + d] = dv_g[j * kld + d] = round_to_bf16(0.f);
      }
    }
    return;
  }
  // Step `step`'s query head and query tile.
  auto head_of = [&](int step) { return hk * group + step / per_head; };
  auto tile_of = [&](int step) { return first + step % per_head; };

  // Step `step`'s queries, output gradients, lse and D into buffer `buf`: the tiles by cp.async
  // (landing with the group the caller commits next), lse and D by plain stores.
  auto stage_queries = [&](int step, int buf) {
    const int h = head_of(step), q0 = tile_of(step) * kTile;
    const int64_t bh = static_cast<int64_t>(b) * NH + h;
    const bf16* q_g = q + b * fr.q_batch + static_cast<int64_t>(h) * HS;
    const bf16* g_g = dout + b * fr.o_batch + static_cast<int64_t>(h) * HS;
    stage_tile<kTile, HS_MAX>(q_s2 + buf * Sh::kRowTile, Sh::kLd, q_g, ld, q0, S, HS, vec);
    stage_tile<kTile, HS_MAX>(g_s2 + buf * Sh::kRowTile, Sh::kLd, g_g, ldo, q0, S, HS, vec);
    for (int r = threadIdx.x; r < kTile; r += kThreads) {
      const bool in = q0 + r < S;
      lse_s2[buf * kTile + r] = in ? lse[bh * fr.lse_ld + q0 + r] * kLog2e : 0.f;
      d_s2[buf * kTile + r] = in ? dsum[bh * fr.lse_ld + q0 + r] : 0.f;
    }
  };
  // The keys and values travel with the first query tile.
  stage_tile<kTile, HS_MAX>(k_s, Sh::kLd, k_g, kld, k0, Sk, HS, vec);
  stage_tile<kTile, HS_MAX>(v_s, Sh::kLd, v_g, kld, k0, Sk, HS, vec);
  stage_queries(0, 0);
  cp_async_commit();

  // This lane's keys: [0] = g, [1] = g + 8 of the warp's 16.
  const int key[2] = {k0 + 16 * warp + g, k0 + 16 * warp + g + 8};
  float dk[Sh::kHeadFrags][4] = {}, dv[Sh::kHeadFrags][4] = {};

  for (int step = 0; step < steps; ++step) {
    const int qt = tile_of(step), q0 = qt * kTile, buf = step & 1;
    float* dq_g = dq_acc + b * fr.o_batch + static_cast<int64_t>(head_of(step)) * HS;
    // The next step's query tile goes to the other buffer while this one is computed on. That
    // buffer was last read before the previous step's dS barrier, which every warp has passed: no
    // barrier is needed before the copies (and dS is rewritten only after the barrier below).
    if (step + 1 < steps) stage_queries(step + 1, buf ^ 1);
    cp_async_commit();
    cp_async_wait<1>();  // this thread's copies of this tile have landed,
    __syncthreads();     // and every thread's
    const bf16* q_s = q_s2 + buf * Sh::kRowTile;
    const bf16* g_s = g_s2 + buf * Sh::kRowTile;
    const float* lse_s = lse_s2 + buf * kTile;
    const float* d_s = d_s2 + buf * kTile;

    // Sᵀ and dPᵀ for this warp's 16 keys × the tile's 64 queries.
    float p[kKeyFrags][4] = {}, ds[kKeyFrags][4] = {};
#pragma unroll
    for (int ks = 0; ks < Sh::kHeadSteps; ++ks) {
      uint32_t ka[4], va[4];
      load_a(ka, k_s, Sh::kLd, 16 * warp, 16 * ks);
      load_a(va, v_s, Sh::kLd, 16 * warp, 16 * ks);
#pragma unroll
      for (int j = 0; j < kKeyFrags; j += 2) {
        uint32_t qb[4], gb[4];
        load_b_pair(qb, q_s, Sh::kLd, 8 * j, 16 * ks);
        mma_16816_pair(p[j], p[j + 1], ka, qb);
        load_b_pair(gb, g_s, Sh::kLd, 8 * j, 16 * ks);
        mma_16816_pair(ds[j], ds[j + 1], va, gb);
      }
    }
    // Pᵀ and dSᵀ; a query before the key (causal), a query past S or a padding key contributes
    // nothing.
    const bool edge = (causal && qt == first) || q0 + kTile > S || k0 + kTile > len;
#pragma unroll
    for (int j = 0; j < kKeyFrags; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qi = 8 * j + 2 * t + e % 2;
        const bool masked =
            edge && ((causal && q0 + qi < key[e / 2]) || q0 + qi >= S || key[e / 2] >= len);
        const float pe = masked ? 0.f : exp2f(p[j][e] * scale_log2 - lse_s[qi]);
        p[j][e] = pe;
        ds[j][e] = pe * (ds[j][e] - d_s[qi]);
      }
      // dV += Pᵀ·dO and dK += dSᵀ·Q (scale applied at the end), dO and Q read transposed.
#pragma unroll
    for (int kk = 0; kk < kKeySteps; ++kk) {
      uint32_t pa[4], sa[4];
      accumulators_to_a(pa, p[2 * kk], p[2 * kk + 1]);
      accumulators_to_a(sa, ds[2 * kk], ds[2 * kk + 1]);
#pragma unroll
      for (int dn = 0; dn < Sh::kHeadFrags; dn += 2) {
        uint32_t gb[4], qb[4];
        load_b_pair_trans(gb, g_s, Sh::kLd, 8 * dn, 16 * kk);
        mma_16816_pair(dv[dn], dv[dn + 1], pa, gb);
        load_b_pair_trans(qb, q_s, Sh::kLd, 8 * dn, 16 * kk);
        mma_16816_pair(dk[dn], dk[dn + 1], sa, qb);
      }
    }
    // dSᵀ to shared memory as it lies in the accumulators: keys as rows, a pair per store.
#pragma unroll
    for (int j = 0; j < kKeyFrags; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r)
        *reinterpret_cast<uint32_t*>(ds_s + (16 * warp + g + 8 * r) * kTileLd + 8 * j + 2 * t) =
            pack_bf16(ds[j][2 * r], ds[j][2 * r + 1]);
    __syncthreads();

    // dQ for queries 16·warp .. +15 of the tile: dS (16 × 64 keys, read transposed) · K (read
    // transposed), a quarter of the head dims at a time to keep the accumulators few.
    constexpr int kChunk = Sh::kHeadFrags >= 4 ? 4 : Sh::kHeadFrags;
#pragma unroll
    for (int dn0 = 0; dn0 < Sh::kHeadFrags; dn0 += kChunk) {
      float dq[kChunk][4] = {};
#pragma unroll
      for (int kk = 0; kk < kKeySteps; ++kk) {
        uint32_t a[4];
        load_a_trans(a, ds_s, kTileLd, 16 * warp, 16 * kk);
#pragma unroll
        for (int c = 0; c < kChunk; c += 2) {
          uint32_t kb[4];
          load_b_pair_trans(kb, k_s, Sh::kLd, 8 * (dn0 + c), 16 * kk);
          mma_16816_pair(dq[c], dq[c + 1], a, kb);
        }
      }
#pragma unroll
      for (int c = 0; c < kChunk; ++c)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = q0 + 16 * warp + g + 8 * (e / 2), d = 8 * (dn0 + c) + 2 * t + e % 2;
          if (i < S && d < HS) atomicAdd(&dq_g[i * ldo + d], scale * dq[c][e]);
        }
    }
  }

#pragma unroll
  for (int dn = 0; dn < Sh::kHeadFrags; ++dn)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int j = key[e / 2], d = 8 * dn + 2 * t + e % 2;
      if (j >= Sk || d >= HS) continue;
      const int64_t at = k_at + j * kld + d, v_at = at + static_cast<int64_t>(KVH) * HS;
      if (kAdd) {
        static_cast<float*>(dk_out)[at] += scale * dk[dn][e];
        static_cast<float*>(dk_out)[v_at] += dv[dn][e];
      } else {
        static_cast<bf16*>(dk_out)[at] = round_to_bf16(scale * dk[dn][e]);
        static_cast<bf16*>(dk_out)[v_at] = round_to_bf16(dv[dn][e]);
      }
    }
}

// One 16 × 16 × 16 product (two m16n8k16) through the fragment loads the kernels use
// (flash_attention.h's mma_fragment_product): a and b staged by cp.async in dynamic shared
// memory, each 16 × 16 row-major with a padded row stride, as the kernels' tiles are.
__global__ void mma_fragment_kernel(float* d, const bf16* a, const bf16* b,
                                    MmaFragmentOperands operands) {
  constexpr int kLd = 16 + 8;
  bf16* a_s = dynamic_shared_bf16();
  bf16* b_s = a_s + 16 * kLd;
  stage_tile<16, 16>(a_s, kLd, a, 16, 0, 16, 16, true);
  stage_tile<16, 16>(b_s, kLd, b, 16, 0, 16, 16, true);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  uint32_t fa[4], fb[4];
  if (operands == MmaFragmentOperands::kAtB)
    load_a_trans(fa, a_s, kLd, 0, 0);
  else
    load_a(fa, a_s, kLd, 0, 0);
  if (operands == MmaFragmentOperands::kABt)
    load_b_pair(fb, b_s, kLd, 0, 0);
  else
    load_b_pair_trans(fb, b_s, kLd, 0, 0);
  float acc[2][4] = {};
  mma_16816_pair(acc[0], acc[1], fa, fb);
  const int g = threadIdx.x / 4, t = threadIdx.x % 4;
  for (int n = 0; n < 2; ++n)
    for (int e = 0; e < 4; ++e) d[(g + 8 * (e / 2)) * 16 + 8 * n + 2 * t + e % 2] = acc[n][e];
}

// 16-byte loads: whole chunks of 8 head dims, every row start 16-byte aligned (the base, and
// row and sequence strides of whole 16 bytes).
bool vector_loads(const void* base, int HS, int64_t ld, int64_t batch) {
  return HS % 8 == 0 && reinterpret_cast<uintptr_t>(base) % 16 == 0 && ld % 8 == 0 &&
         batch % 8 == 0;
}

}  // namespace

cudaError_t flash_tc_forward(void* out, float* lse, const void* q, const void* k,
                             const FlashRows& r, int warp_rows, cudaStream_t stream) {
  const float scale_log2 = kLog2e / std::sqrt(static_cast<float>(r.HS));
  const bool vec =
      vector_loads(q, r.HS, r.q_ld, r.q_batch) && vector_loads(k, r.HS, r.k_ld, r.k_batch);
  return with_head_size(r.HS, [&](auto hs_max) {
    constexpr int HS_MAX = decltype(hs_max)::value;
    using Sh = Shape<HS_MAX>;
    auto run = [&](auto m_tag) {
      constexpr int kM = decltype(m_tag)::value;
      const dim3 grid(static_cast<unsigned>(r.B * r.NH),
                      static_cast<unsigned>((r.Sq + Sh::query_tile(kM) - 1) / Sh::query_tile(kM)));
      return launch_opted_in(flash_tc_forward_kernel<HS_MAX, kM>, grid, kThreads,
                             Sh::forward_smem(kM), stream, static_cast<bf16*>(out), lse,
                             static_cast<const bf16*>(q), static_cast<const bf16*>(k), r,
                             scale_log2, vec);
    };
    switch (warp_rows == 0 ? 16 * Sh::kDefaultMTiles : warp_rows) {
      case 16:
        return run(std::integral_constant<int, 1>{});
      case 32:
        return run(std::integral_constant<int, 2>{});
      default:
        return cudaErrorInvalidValue;
    }
  });
}

cudaError_t flash_tc_backward(void* dk_out, bool add, float* dq_acc, const void* dout,
                              const void* q, const void* k, const float* lse, const float* dsum,
                              const FlashRows& r, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(r.B * r.KVH),
                  static_cast<unsigned>((r.Sk + kTile - 1) / kTile));
  const int q_tiles = (r.Sq + kTile - 1) / kTile;
  const float scale = 1.f / std::sqrt(static_cast<float>(r.HS));
  const bool vec = vector_loads(q, r.HS, r.q_ld, r.q_batch) &&
                   vector_loads(k, r.HS, r.k_ld, r.k_batch) &&
                   vector_loads(dout, r.HS, r.o_ld, r.o_batch);
  return with_head_size(r.HS, [&](auto hs_max) {
    constexpr int HS_MAX = decltype(hs_max)::value;
    auto run = [&](auto add_tag) {
      return launch_opted_in(flash_tc_backward_kernel<HS_MAX, decltype(add_tag)::value>, grid,
                             kThreads, Shape<HS_MAX>::backward_smem, stream, dk_out, dq_acc,
                             static_cast<const bf16*>(dout), static_cast<const bf16*>(q),
                             static_cast<const bf16*>(k), lse, dsum, r, q_tiles, scale,
                             scale * kLog2e, vec);
    };
    return add ? run(std::true_type{}) : run(std::false_type{});
  });
}

cudaError_t mma_fragment_product(float* d, const void* a, const void* b,
                                 MmaFragmentOperands operands, cudaStream_t stream) {
  launch(mma_fragment_kernel, 1, 32, 2 * 16 * (16 + 8) * sizeof(bf16), stream, d,
         static_cast<const bf16*>(a), static_cast<const bf16*>(b), operands);
  return cudaGetLastError();
}

}  // namespace strata::kernels::cuda
