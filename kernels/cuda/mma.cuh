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
// The CUDA emulation build runs the product, and ldmatrix, as warp-collective steps (all 32 lanes
// hand in their fragments or row addresses, scheduler.cc assembles the matrices by the layouts
// above and hands each lane its part), and cp.async at either extreme of when its copies may
// land; so a kernel that gets a layout, a wait or a barrier wrong fails its CPU comparison there
// too.
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

// d0 += a · b0 and d1 += a · b1 for the two B fragments one load_b_pair / load_b_pair_trans
// gives (b[0], b[1] and b[2], b[3]): adjacent 8-column accumulator tiles.
__device__ __forceinline__ void mma_16816_pair(float (&d0)[4], float (&d1)[4],
                                               const uint32_t (&a)[4], const uint32_t (&b)[4]) {
  mma_16816(d0, a, b[0], b[1]);
  mma_16816(d1, a, b[2], b[3]);
}

// ---- fragments from shared memory, by ldmatrix ------------------------------------------------
// ldmatrix.x4 reads four 8 × 8 bf16 matrices, each row 16 bytes given by one lane (lane 8m + i:
// row i of matrix m), and hands lane l the pair at row l / 4, columns 2(l % 4) and 2(l % 4) + 1
// of each matrix — with .trans, at column l / 4, rows 2(l % 4) and 2(l % 4) + 1. Those are the
// fragment positions above, so a tile in shared memory becomes A or B fragments in one
// instruction per four registers: row-major as stored, or transposed (.trans) where the product
// wants the other orientation. Rows must be 16-byte aligned: tiles have row strides of a multiple
// of 8 elements and fragments start at multiples of 8 columns.

template <bool kTrans>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const bf16* row) {
#if defined(STRATA_CUDA_EMULATION)
  cuda_emulation::ldmatrix_x4(r, row, kTrans);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto addr = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  if constexpr (kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
#elif defined(__CUDA_ARCH__)
  __trap();  // the bf16 kernels need sm_80 (see mma_16816)
#endif
}

// The A fragment of rows [row0, row0 + 16) and columns [k0, k0 + 16) of a row-major bf16 tile
// with row stride `ld`: matrices (rows 0-7, k 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15).
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const bf16* s, int ld, int row0, int k0) {
  const int lane = threadIdx.x % 32, m = lane / 8;
  ldmatrix_x4<false>(a, s + (row0 + lane % 8 + 8 * (m % 2)) * ld + k0 + 8 * (m / 2));
}

// The same A fragment, of a tile stored transposed: `s` holds Aᵀ row-major (k, row), row stride
// `ld`.
__device__ __forceinline__ void load_a_trans(uint32_t (&a)[4], const bf16* s, int ld, int row0,
                                             int k0) {
  const int lane = threadIdx.x % 32, m = lane / 8;
  ldmatrix_x4<true>(a, s + (k0 + lane % 8 + 8 * (m / 2)) * ld + row0 + 8 * (m % 2));
}

// B fragments of B = Mᵀ for columns [n0, n0 + 8) (b[0], b[1]) and [n0 + 8, n0 + 16) (b[2],
// b[3]), rows [k0, k0 + 16), from M stored row-major (n, k) with row stride `ld`: B's columns are
// M's rows (a tile of keys as Kᵀ).
__device__ __forceinline__ void load_b_pair(uint32_t (&b)[4], const bf16* m, int ld, int n0,
                                            int k0) {
  const int lane = threadIdx.x % 32, q = lane / 8;
  ldmatrix_x4<false>(b, m + (n0 + lane % 8 + 8 * (q / 2)) * ld + k0 + 8 * (q % 2));
}

// The same two B fragments of B itself stored row-major (k, n) with row stride `ld` (a tile of
// values, as the B of P·V), read transposed.
__device__ __forceinline__ void load_b_pair_trans(uint32_t (&b)[4], const bf16* m, int ld, int n0,
                                                  int k0) {
  const int lane = threadIdx.x % 32, q = lane / 8;
  ldmatrix_x4<true>(b, m + (k0 + lane % 8 + 8 * (q % 2)) * ld + n0 + 8 * (q / 2));
}

// The A fragment (16 × 16) made of two accumulator tiles holding columns 0-7 and 8-15 of it.
__device__ __forceinline__ void accumulators_to_a(uint32_t (&a)[4], const float (&lo)[4],
                                                  const float (&hi)[4]) {
  a[0] = pack_bf16(lo[0], lo[1]);
  a[1] = pack_bf16(lo[2], lo[3]);
  a[2] = pack_bf16(hi[0], hi[1]);
  a[3] = pack_bf16(hi[2], hi[3]);
}

// ---- tiles into shared memory, by cp.async ----------------------------------------------------
// cp.async copies global memory to shared memory without passing through registers; a thread's
// copies are grouped by commit and waited for by group (wait<N>: all but the N most recent
// groups have landed), so a kernel can stage the next tile while it computes on this one. What a
// thread waited for is visible to the others after a __syncthreads.

// 16 bytes from `src` (its first `src_bytes`, the rest zero) to `dst` in shared memory.
__device__ __forceinline__ void cp_async_16(bf16* dst, const bf16* src, int src_bytes) {
#if defined(STRATA_CUDA_EMULATION)
  cuda_emulation::cp_async_16(dst, src, src_bytes);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto addr = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(addr),
               "l"(__cvta_generic_to_global(src)), "r"(src_bytes)
               : "memory");
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if defined(STRATA_CUDA_EMULATION)
  cuda_emulation::cp_async_commit();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(STRATA_CUDA_EMULATION)
  cuda_emulation::cp_async_wait(N);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// Stages rows [row0, row0 + ROWS) × columns [0, COLS) of a bf16 matrix (row stride `ld`; `rows`
// rows and `cols` columns in use, the rest of the tile zero) into shared memory as `tile` (ROWS ×
// COLS, row stride tile_ld, a multiple of 8). With `vec` (`cols` and `ld` multiples of 8, `src`
// 16-byte aligned) each chunk of 8 columns is one cp.async, which lands when the caller waits for
// the group it commits next; otherwise the chunks are gathered element by element and stored at
// once. Every thread of the block takes part.
template <int ROWS, int COLS>
__device__ __forceinline__ void stage_tile(bf16* tile, int tile_ld, const bf16* src, int64_t ld,
                                           int row0, int rows, int cols, bool vec) {
  static_assert(COLS % 8 == 0, "tiles are staged in chunks of 8 columns");
  constexpr int kChunks = ROWS * COLS / 8;
  for (int idx = threadIdx.x; idx < kChunks; idx += blockDim.x) {
    const int r = idx / (COLS / 8), c = idx % (COLS / 8) * 8;
    const int row = row0 + r;
    bf16* dst = tile + r * tile_ld + c;
    if (vec) {
      const bool in = row < rows && c < cols;
      cp_async_16(dst, in ? src + row * ld + c : src, in ? 16 : 0);
    } else {
      uint32_t w[4] = {0, 0, 0, 0};  // the 8 elements as 4 pairs, lower column in the low half
#pragma unroll
      for (int e = 0; e < 8; ++e)
        if (row < rows && c + e < cols)
          w[e / 2] |= static_cast<uint32_t>(__bfloat16_as_ushort(src[row * ld + c + e]))
                      << (16 * (e % 2));
      *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
}

}  // namespace strata::kernels::cuda
