// flash_attention_tc.cu — causal flash attention for bf16 on tensor cores (FlashAttention-2's
// work split, on mma.sync m16n8k16; kernels/cuda/mma.cuh has the fragment layouts).
//
// Tiling. A block is 4 warps and works on a tile of 64 rows (queries in the forward, keys in the
// backward), 16 rows per warp; the other side comes in tiles of 64 staged in shared memory as
// bf16, rows padded by 8 elements so that the 8 rows one fragment load touches fall in distinct
// banks. Head dims are padded with zeros to HS_MAX (32, 64 or 128), so any head size up to 128
// runs; rows past S are zero and masked.
//
// Forward (grid: B·NH × query tiles, the last — longest — first). A warp keeps its 16 query rows
// as A fragments in registers. For each key tile up to its own (causal): S = Q·Kᵀ (16 × 64, eight
// accumulator tiles, K staged row-major is B = Kᵀ directly), the mask on the diagonal tile only,
// the online softmax in the log2 domain (each row's 64 scores are spread over the 4 lanes of a
// quad: max and sum are two xor-shuffles; the running sum stays per lane until the end), then
// O += P·V with P taken from the score accumulators as A fragments (no trip through shared
// memory) and V staged transposed so that B's words are contiguous.
//
// Backward (grid: B·NH × key tiles, the first — longest — first). A warp keeps dK and dV of its
// 16 keys in registers and walks the query tiles from its own to the last: Sᵀ = K·Qᵀ and
// dPᵀ = V·dOᵀ (keys as rows, so Pᵀ and dSᵀ come out as the A fragments of the next products),
// Pᵀ = exp2(Sᵀ·scale·log2 e − lse), dSᵀ = Pᵀ ∘ (dPᵀ − D), dV += Pᵀ·dO, dK += dSᵀ·Q; dS goes to
// shared memory (queries as rows) and each warp then forms dQ = dS·K for 16 of the tile's
// queries, added with f32 atomics to the dq scratch (several key tiles add to each query row).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/flash_attention_tc.h"
#include "kernels/cuda/mma.cuh"

namespace strata::kernels::cuda {
namespace {

constexpr int kTile = 64;
constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kTileLd = kTile + 8;     // row stride of a transposed tile (HS_MAX × kTile)
constexpr int kKeyFrags = kTile / 8;   // accumulator tiles across a tile of 64
constexpr int kKeySteps = kTile / 16;  // k-steps across a tile of 64
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <int HS_MAX>
struct Shape {
  static constexpr int kLd = HS_MAX + 8;         // row stride of a row-major tile (kTile × HS_MAX)
  static constexpr int kHeadFrags = HS_MAX / 8;  // accumulator tiles across the head dims
  static constexpr int kHeadSteps = HS_MAX / 16;     // k-steps across the head dims
  static constexpr int kRowTile = kTile * kLd;       // elements of a row-major tile
  static constexpr int kColTile = HS_MAX * kTileLd;  // elements of a transposed tile
  static constexpr size_t forward_smem = sizeof(bf16) * (2 * kRowTile + kColTile);
  static constexpr size_t backward_smem =
      sizeof(bf16) * (4 * kRowTile + 3 * kColTile + kTile * kTileLd) + sizeof(float) * 2 * kTile;
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

template <int HS_MAX>
__global__ void __launch_bounds__(kThreads)
    flash_tc_forward_kernel(bf16* out, float* lse, const bf16* qkv, int S, int NH, int HS,
                            float scale_log2, bool vec) {
  using Sh = Shape<HS_MAX>;
  bf16* q_s = dynamic_shared_bf16();  // (kTile, HS_MAX) queries of this block
  bf16* k_s = q_s + Sh::kRowTile;     // (kTile, HS_MAX) current key tile
  bf16* vt_s = k_s + Sh::kRowTile;    // (HS_MAX, kTile) current value tile, transposed

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
  const int qt = gridDim.y - 1 - blockIdx.y;
  const int q0 = qt * kTile;
  const int64_t ld = 3LL * NH * HS;  // token stride in qkv
  const bf16* q_g = qkv + static_cast<int64_t>(b) * S * ld + static_cast<int64_t>(h) * HS;
  const bf16* k_g = q_g + static_cast<int64_t>(NH) * HS;
  const bf16* v_g = q_g + 2LL * NH * HS;

  stage_tile<kTile, HS_MAX>(q_s, Sh::kLd, nullptr, 0, q_g, ld, q0, S, HS, vec);
  __syncthreads();
  uint32_t qa[Sh::kHeadSteps][4];
#pragma unroll
  for (int ks = 0; ks < Sh::kHeadSteps; ++ks) load_a(qa[ks], q_s, Sh::kLd, 16 * warp, 16 * ks);

  // This lane's rows: [0] = g, [1] = g + 8 of the warp's 16 (accumulator elements 0-1 and 2-3).
  const int row[2] = {q0 + 16 * warp + g, q0 + 16 * warp + g + 8};
  float o[Sh::kHeadFrags][4] = {};
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.f, 0.f};  // this lane's part of the row sums (quad-summed at the end)

  for (int kt = 0; kt <= qt; ++kt) {
    const int k0 = kt * kTile;
    __syncthreads();  // the previous tile's k_s and vt_s are no longer read
    stage_tile<kTile, HS_MAX>(k_s, Sh::kLd, nullptr, 0, k_g, ld, k0, S, HS, vec);
    stage_tile<kTile, HS_MAX>(nullptr, 0, vt_s, kTileLd, v_g, ld, k0, S, HS, vec);
    __syncthreads();

    float s[kKeyFrags][4] = {};
#pragma unroll
    for (int ks = 0; ks < Sh::kHeadSteps; ++ks)
#pragma unroll
      for (int j = 0; j < kKeyFrags; ++j) {
        uint32_t b0, b1;
        load_b(b0, b1, k_s, Sh::kLd, 8 * j, 16 * ks);
        mma_16816(s[j], qa[ks], b0, b1);
      }

    // Key 0 is visible to every row, so m is finite from the first tile on and a later masked
    // element never gives −inf − −inf. Keys past S only occur in the diagonal tile, where they
    // lie right of every row that is stored.
    const bool diagonal = kt == qt;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < kKeyFrags; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = k0 + 8 * j + 2 * t + e % 2;
        float v = s[j][e] * scale_log2;
        if (diagonal && col > row[e / 2]) v = -INFINITY;
        s[j][e] = v;
        mx[e / 2] = fmaxf(mx[e / 2], v);
      }
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float m_new = fmaxf(m[r], quad_max(mx[r]));
      alpha[r] = exp2f(m[r] - m_new);  // 0 on the first tile (m = −inf)
      m[r] = m_new;
      l[r] *= alpha[r];
    }
#pragma unroll
    for (int j = 0; j < kKeyFrags; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = exp2f(s[j][e] - m[e / 2]);
        l[e / 2] += p;
        s[j][e] = p;
      }
#pragma unroll
    for (int dn = 0; dn < Sh::kHeadFrags; ++dn)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[dn][e] *= alpha[e / 2];

#pragma unroll
    for (int kk = 0; kk < kKeySteps; ++kk) {
      uint32_t pa[4];
      accumulators_to_a(pa, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
      for (int dn = 0; dn < Sh::kHeadFrags; ++dn) {
        uint32_t b0, b1;
        load_b(b0, b1, vt_s, kTileLd, 8 * dn, 16 * kk);
        mma_16816(o[dn], pa, b0, b1);
      }
    }
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float sum = quad_sum(l[r]);
    const int i = row[r];
    if (i >= S) continue;
    const float inv = 1.f / sum;
    bf16* o_g = out + ((static_cast<int64_t>(b) * S + i) * NH + h) * HS;  // (HS)
#pragma unroll
    for (int dn = 0; dn < Sh::kHeadFrags; ++dn)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int d = 8 * dn + 2 * t + e;
        if (d < HS) o_g[d] = round_to_bf16(o[dn][2 * r + e] * inv);
      }
    if (t == 0) lse[static_cast<int64_t>(bh) * S + i] = (m[r] + log2f(sum)) * kLn2;
  }
}

template <int HS_MAX>
__global__ void __launch_bounds__(kThreads)
    flash_tc_backward_kernel(bf16* dqkv, float* dq_acc, const bf16* dout, const bf16* qkv,
                             const float* lse, const float* dsum, int S, int NH, int HS,
                             float scale, float scale_log2, bool vec) {
  using Sh = Shape<HS_MAX>;
  bf16* k_s = dynamic_shared_bf16();  // (kTile, HS_MAX)  this block's keys
  bf16* v_s = k_s + Sh::kRowTile;     // (kTile, HS_MAX)  this block's values
  bf16* kt_s = v_s + Sh::kRowTile;    // (HS_MAX, kTile)  keys, transposed
  bf16* q_s = kt_s + Sh::kColTile;    // (kTile, HS_MAX)  current query tile
  bf16* qt_s = q_s + Sh::kRowTile;    // (HS_MAX, kTile)  its transpose
  bf16* g_s = qt_s + Sh::kColTile;    // (kTile, HS_MAX)  its output gradient
  bf16* gt_s = g_s + Sh::kRowTile;    // (HS_MAX, kTile)  its transpose
  bf16* ds_s = gt_s + Sh::kColTile;   // (kTile queries, kTile keys)  dS
  float* lse_s = reinterpret_cast<float*>(ds_s + kTile * kTileLd);  // (kTile) log2 units
  float* d_s = lse_s + kTile;                                       // (kTile) D

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
  const int k0 = blockIdx.y * kTile;
  const int tiles = gridDim.y;
  const int64_t ld = 3LL * NH * HS;                   // token stride in qkv and dqkv
  const int64_t ldo = static_cast<int64_t>(NH) * HS;  // token stride in dout and dq_acc
  const int64_t head = static_cast<int64_t>(b) * S * ld + static_cast<int64_t>(h) * HS;
  const bf16* q_g = qkv + head;
  const bf16* k_g = q_g + ldo;
  const bf16* v_g = q_g + 2 * ldo;
  const bf16* g_g = dout + static_cast<int64_t>(b) * S * ldo + static_cast<int64_t>(h) * HS;
  float* dq_g = dq_acc + static_cast<int64_t>(b) * S * ldo + static_cast<int64_t>(h) * HS;
  const float* lse_g = lse + static_cast<int64_t>(bh) * S;
  const float* d_g = dsum + static_cast<int64_t>(bh) * S;

  stage_tile<kTile, HS_MAX>(k_s, Sh::kLd, kt_s, kTileLd, k_g, ld, k0, S, HS, vec);
  stage_tile<kTile, HS_MAX>(v_s, Sh::kLd, nullptr, 0, v_g, ld, k0, S, HS, vec);

  // This lane's keys: [0] = g, [1] = g + 8 of the warp's 16.
  const int key[2] = {k0 + 16 * warp + g, k0 + 16 * warp + g + 8};
  float dk[Sh::kHeadFrags][4] = {}, dv[Sh::kHeadFrags][4] = {};

  for (int qt = blockIdx.y; qt < tiles; ++qt) {
    const int q0 = qt * kTile;
    __syncthreads();  // the previous query tile and its dS are no longer read
    stage_tile<kTile, HS_MAX>(q_s, Sh::kLd, qt_s, kTileLd, q_g, ld, q0, S, HS, vec);
    stage_tile<kTile, HS_MAX>(g_s, Sh::kLd, gt_s, kTileLd, g_g, ldo, q0, S, HS, vec);
    for (int r = threadIdx.x; r < kTile; r += kThreads) {
      const bool in = q0 + r < S;
      lse_s[r] = in ? lse_g[q0 + r] * kLog2e : 0.f;
      d_s[r] = in ? d_g[q0 + r] : 0.f;
    }
    __syncthreads();

    // Sᵀ and dPᵀ for this warp's 16 keys × the tile's 64 queries.
    float p[kKeyFrags][4] = {}, ds[kKeyFrags][4] = {};
#pragma unroll
    for (int ks = 0; ks < Sh::kHeadSteps; ++ks) {
      uint32_t ka[4], va[4];
      load_a(ka, k_s, Sh::kLd, 16 * warp, 16 * ks);
      load_a(va, v_s, Sh::kLd, 16 * warp, 16 * ks);
#pragma unroll
      for (int j = 0; j < kKeyFrags; ++j) {
        uint32_t b0, b1;
        load_b(b0, b1, q_s, Sh::kLd, 8 * j, 16 * ks);
        mma_16816(p[j], ka, b0, b1);
        load_b(b0, b1, g_s, Sh::kLd, 8 * j, 16 * ks);
        mma_16816(ds[j], va, b0, b1);
      }
    }
    // Pᵀ and dSᵀ; a query before the key (causal) or past S contributes nothing.
    const bool edge = qt == static_cast<int>(blockIdx.y) || q0 + kTile > S;
#pragma unroll
    for (int j = 0; j < kKeyFrags; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qi = 8 * j + 2 * t + e % 2;
        const bool masked = edge && (q0 + qi < key[e / 2] || q0 + qi >= S);
        const float pe = masked ? 0.f : exp2f(p[j][e] * scale_log2 - lse_s[qi]);
        p[j][e] = pe;
        ds[j][e] = pe * (ds[j][e] - d_s[qi]);
      }

      // dV += Pᵀ·dO and dK += dSᵀ·Q (scale applied at the end), and dS to shared memory.
#pragma unroll
    for (int kk = 0; kk < kKeySteps; ++kk) {
      uint32_t pa[4], sa[4];
      accumulators_to_a(pa, p[2 * kk], p[2 * kk + 1]);
      accumulators_to_a(sa, ds[2 * kk], ds[2 * kk + 1]);
#pragma unroll
      for (int dn = 0; dn < Sh::kHeadFrags; ++dn) {
        uint32_t b0, b1;
        load_b(b0, b1, gt_s, kTileLd, 8 * dn, 16 * kk);
        mma_16816(dv[dn], pa, b0, b1);
        load_b(b0, b1, qt_s, kTileLd, 8 * dn, 16 * kk);
        mma_16816(dk[dn], sa, b0, b1);
      }
    }
#pragma unroll
    for (int j = 0; j < kKeyFrags; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        ds_s[(8 * j + 2 * t + e % 2) * kTileLd + 16 * warp + g + 8 * (e / 2)] =
            round_to_bf16(ds[j][e]);
    __syncthreads();

    // dQ for queries 16·warp .. +15 of the tile: dS (16 × 64 keys) · K, a quarter of the head
    // dims at a time to keep the accumulators few.
    constexpr int kChunk = Sh::kHeadFrags >= 4 ? 4 : Sh::kHeadFrags;
#pragma unroll
    for (int dn0 = 0; dn0 < Sh::kHeadFrags; dn0 += kChunk) {
      float dq[kChunk][4] = {};
#pragma unroll
      for (int kk = 0; kk < kKeySteps; ++kk) {
        uint32_t a[4];
        load_a(a, ds_s, kTileLd, 16 * warp, 16 * kk);
#pragma unroll
        for (int c = 0; c < kChunk; ++c) {
          uint32_t b0, b1;
          load_b(b0, b1, kt_s, kTileLd, 8 * (dn0 + c), 16 * kk);
          mma_16816(dq[c], a, b0, b1);
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

  bf16* dk_g = dqkv + head + ldo;  // (S, HS), stride ld
  bf16* dv_g = dk_g + ldo;
#pragma unroll
  for (int dn = 0; dn < Sh::kHeadFrags; ++dn)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int j = key[e / 2], d = 8 * dn + 2 * t + e % 2;
      if (j >= S || d >= HS) continue;
      const int64_t at = j * ld + d;
      dk_g[at] = round_to_bf16(scale * dk[dn][e]);
      dv_g[at] = round_to_bf16(dv[dn][e]);
    }
}

// One m16n8k16 product through load_a / load_b / mma_16816 (flash_attention.h's
// mma_fragment_product).
__global__ void mma_fragment_kernel(float* d, const bf16* a, const bf16* b) {
  __shared__ bf16 a_s[16 * 16], b_s[8 * 16];
  for (int i = threadIdx.x; i < 16 * 16; i += 32) a_s[i] = a[i];
  for (int i = threadIdx.x; i < 8 * 16; i += 32) b_s[i] = b[i];
  __syncthreads();
  uint32_t fa[4], b0, b1;
  load_a(fa, a_s, 16, 0, 0);
  load_b(b0, b1, b_s, 16, 0, 0);
  float acc[4] = {};
  mma_16816(acc, fa, b0, b1);
  const int g = threadIdx.x / 4, t = threadIdx.x % 4;
  for (int e = 0; e < 4; ++e) d[(g + 8 * (e / 2)) * 8 + 2 * t + e % 2] = acc[e];
}

// 16-byte loads: whole chunks of 8 head dims, every row start 16-byte aligned.
bool vector_loads(const void* base, int HS) {
  return HS % 8 == 0 && reinterpret_cast<uintptr_t>(base) % 16 == 0;
}

}  // namespace

cudaError_t flash_tc_forward(void* out, float* lse, const void* qkv, int B, int S, int NH, int HS,
                             cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(B * NH), static_cast<unsigned>((S + kTile - 1) / kTile));
  const float scale_log2 = kLog2e / std::sqrt(static_cast<float>(HS));
  return with_head_size(HS, [&](auto hs_max) {
    constexpr int HS_MAX = decltype(hs_max)::value;
    return launch_opted_in(flash_tc_forward_kernel<HS_MAX>, grid, kThreads,
                           Shape<HS_MAX>::forward_smem, stream, static_cast<bf16*>(out), lse,
                           static_cast<const bf16*>(qkv), S, NH, HS, scale_log2,
                           vector_loads(qkv, HS));
  });
}

cudaError_t flash_tc_backward(void* dqkv, float* dq_acc, const void* dout, const void* qkv,
                              const float* lse, const float* dsum, int B, int S, int NH, int HS,
                              cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(B * NH), static_cast<unsigned>((S + kTile - 1) / kTile));
  const float scale = 1.f / std::sqrt(static_cast<float>(HS));
  const bool vec = vector_loads(qkv, HS) && vector_loads(dout, HS);
  return with_head_size(HS, [&](auto hs_max) {
    constexpr int HS_MAX = decltype(hs_max)::value;
    return launch_opted_in(flash_tc_backward_kernel<HS_MAX>, grid, kThreads,
                           Shape<HS_MAX>::backward_smem, stream, static_cast<bf16*>(dqkv), dq_acc,
                           static_cast<const bf16*>(dout), static_cast<const bf16*>(qkv), lse, dsum,
                           S, NH, HS, scale, scale * kLog2e, vec);
  });
}

cudaError_t mma_fragment_product(float* d, const void* a, const void* b, cudaStream_t stream) {
  launch(mma_fragment_kernel, 1, 32, 0, stream, d, static_cast<const bf16*>(a),
         static_cast<const bf16*>(b));
  return cudaGetLastError();
}

}  // namespace strata::kernels::cuda
