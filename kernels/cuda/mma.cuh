// mma.cuh — warp-level bf16 tensor-core products (mma.sync.m16n8k16, sm_80 and newer) and the
// shared-memory tile staging they read from; device-side only, used by flash_attention_tc.cu.
//
// One mma_16816 is D (16 × 8, f32) += A (16 × 16, bf16) · B (16 × 8, bf16) by the 32 lanes of a
// warp together. Each lane holds a fixed part of each operand (PTX ISA, "Matrix Fragments for
// mma.m16n8k16 with floating point type"); with g = lane / 4 and t = lane % 4:
//   A: 4 registers of two bf16 (the lower k in the low half): a0 = A[g][2t, 2t+1],
//      a1 = A[g+8][2t, 2t+1], a2 = A[g][2t+8, 2t+9], a3 = A[g+8][2t+8, 2t+9];
//   B: 2 registers: b0 = B[2t, 2t+1][g], b1 = B[2t+8, 2t+9][g];
//   D: 4 floats: d0, d1 = D[g][2t, 2t+1], d2, d3 = D[g+8][2t, 2t+1].
// So an accumulator tile pair D(:, 0..7), D(:, 8..15) is, element for element, the A fragment of
// a 16 × 16 product that follows (packed to bf16): attention turns scores into the next product's
// operand without leaving registers. mma_fragment_product (flash_attention.h) checks this layout
// against a CPU product on the GPU itself.
//
// The CUDA emulation build runs the product as one warp-collective step (all 32 lanes hand in
// their fragments, scheduler.cc assembles A and B by the layout above and hands each lane its
// part of D), so a kernel that gets the layout wrong fails its CPU comparison there too.
#pragma once

#include <cstdint>

#include "kernels/cuda/device_util.cuh"

namespace strata::kernels::cuda {

// Two values rounded to bf16 in one register, `lo` (the lower index) in bits 0-15.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(round_to_bf16(lo))) |
         (static_cast<uint32_t>(__bfloat16_as_ushort(round_to_bf16(hi))) << 16);
}

// d += a · b for one m16n8k16 tile (fragments as in the file comment).
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
#if defined(STRATA_CUDA_EMULATION)
  const uint32_t b[2] = {b0, b1};
  cuda_emulation::mma_bf16_16816(d, a, b);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#elif defined(__CUDA_ARCH__)
  __trap();  // no bf16 tensor cores below sm_80; CMAKE_CUDA_ARCHITECTURES builds none of those
#endif
}

__device__ __forceinline__ uint32_t word_at(const bf16* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// The A fragment of rows [row0, row0 + 16) and columns [k0, k0 + 16) of a row-major bf16 tile
// with row stride `ld` (even).
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const bf16* s, int ld, int row0, int k0) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const bf16* p = s + (row0 + g) * ld + k0 + 2 * t;
  a[0] = word_at(p);
  a[1] = word_at(p + 8 * ld);
  a[2] = word_at(p + 8);
  a[3] = word_at(p + 8 * ld + 8);
}

// The B fragment of B = Mᵀ, columns [n0, n0 + 8) and rows [k0, k0 + 16), from M stored row-major
// (n, k) with row stride `ld`: B's columns are M's rows, so each register is one aligned word.
__device__ __forceinline__ void load_b(uint32_t& b0, uint32_t& b1, const bf16* m, int ld, int n0,
                                       int k0) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const bf16* p = m + (n0 + g) * ld + k0 + 2 * t;
  b0 = word_at(p);
  b1 = word_at(p + 8);
}

// The A fragment (16 × 16) made of two accumulator tiles holding columns 0-7 and 8-15 of it.
__device__ __forceinline__ void accumulators_to_a(uint32_t (&a)[4], const float (&lo)[4],
                                                  const float (&hi)[4]) {
  a[0] = pack_bf16(lo[0], lo[1]);
  a[1] = pack_bf16(lo[2], lo[3]);
  a[2] = pack_bf16(hi[0], hi[1]);
  a[3] = pack_bf16(hi[2], hi[3]);
}

// Stages rows [row0, row0 + ROWS) × columns [0, COLS) of a bf16 matrix (row stride `ld`, `rows`
// rows and `cols` columns in use; the rest of the tile is zero) into shared memory, as `tile`
// (ROWS × COLS, row stride ROWS_LD) and/or its transpose `tile_t` (COLS × ROWS, row stride
// COLS_LD); either may be null. `vec` says 16-byte loads are safe: `cols` and `ld` multiples of
// 8 and `src` 16-byte aligned. Every thread of the block takes part.
template <int ROWS, int COLS>
__device__ __forceinline__ void stage_tile(bf16* tile, int tile_ld, bf16* tile_t, int tile_t_ld,
                                           const bf16* src, int64_t ld, int row0, int rows,
                                           int cols, bool vec) {
  static_assert(COLS % 8 == 0, "tiles are staged in chunks of 8 columns");
  constexpr int kChunks = ROWS * COLS / 8;
  for (int idx = threadIdx.x; idx < kChunks; idx += blockDim.x) {
    const int r = idx / (COLS / 8), c = idx % (COLS / 8) * 8;
    const int row = row0 + r;
    uint32_t w[4] = {0, 0, 0, 0};  // the 8 elements as 4 pairs, lower column in the low half
    if (vec) {
      if (row < rows && c < cols) {
        const uint4 v = *reinterpret_cast<const uint4*>(src + row * ld + c);
        w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
      }
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e)
        if (row < rows && c + e < cols)
          w[e / 2] |= static_cast<uint32_t>(__bfloat16_as_ushort(src[row * ld + c + e]))
                      << (16 * (e % 2));
    }
    if (tile != nullptr)
      *reinterpret_cast<uint4*>(tile + r * tile_ld + c) = make_uint4(w[0], w[1], w[2], w[3]);
    if (tile_t != nullptr) {
#pragma unroll
      for (int e = 0; e < 8; ++e)
        tile_t[(c + e) * tile_t_ld + r] =
            __ushort_as_bfloat16(static_cast<unsigned short>(w[e / 2] >> (16 * (e % 2))));
    }
  }
}

}  // namespace strata::kernels::cuda
