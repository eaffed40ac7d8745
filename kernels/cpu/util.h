// util.h — helpers shared by the kernels/cpu .cc files, not part of their interface: a float exp
// the vectorised loops can call, and the column chunks of the column-parallel reductions.
//
// Reductions whose result lands in a shared gradient (dbias, LayerNorm's dweight/dbias, the
// embedding scatter) are parallelised over the output columns rather than the rows, so that no
// two threads write one element and each of these sums is taken in the same order whatever the
// thread count. Only sum_squares (a norm for clipping) reduces across threads, in an order that
// depends on their number; what the GEMMs do is OpenBLAS's choice.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace strata::kernels::cpu {

// STRATA_CPU_CLONES before a function compiles it once per vector width — AVX-512, AVX2 and the
// baseline SSE2 — and the program runs the widest this CPU has, chosen when it loads (GCC's
// target_clones). Only for loops whose lanes are independent, each element computed by the same
// operations whatever the width: kernels/ is compiled with -ffp-contract=off, so no clone fuses
// a·b + c into an FMA, and every clone gives the same bits (a reduction's order would change with
// the width). Off under the sanitizers, whose start-up runs after the clones' resolvers.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define STRATA_CPU_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define STRATA_CPU_CLONES
#endif

// [begin, end): the calling thread's share of n items inside an OpenMP parallel region, the
// contiguous block schedule(static) would give it.
inline void thread_share(size_t n, int thread, int threads, size_t& begin, size_t& end) {
  const size_t base = n / threads, extra = n % threads;
  const size_t t = static_cast<size_t>(thread);
  begin = t * base + std::min(t, extra);
  end = begin + base + (t < extra ? 1 : 0);
}

// Columns per task of the column-parallel reductions: wide enough that the inner loop over a
// row's chunk vectorises, narrow enough that C = 384 still splits across several threads.
constexpr int kColumnChunk = 64;

// The column-parallel reduction's loop: columns [0, C) in chunks of kColumnChunk, one OpenMP
// task each; sum_chunk(c0, c1) reduces columns [c0, c1) over the rows, in row order, and adds the
// sums to its outputs (no other chunk writes them).
template <class SumChunk>
void for_column_chunks(int C, SumChunk&& sum_chunk) {
  const int chunks = (C + kColumnChunk - 1) / kColumnChunk;
#pragma omp parallel for schedule(static)
  for (int chunk = 0; chunk < chunks; ++chunk) {
    const int c0 = chunk * kColumnChunk;
    sum_chunk(c0, std::min(C, c0 + kColumnChunk));
  }
}

// e^x for float without a library call, so that the loops calling it (softmax, GELU,
// cross-entropy) vectorise: glibc's expf is a scalar call that blocks vectorisation unless
// -ffast-math, and GELU over the (B, S, 4C) activation spent more time in tanhf than the MLP's
// GEMMs. Cephes' expf: x = n·ln2 + r with |r| ≤ ln2/2 (ln2 split in two so n·ln2 is exact), e^r
// by 1 + r + r²·P5(r) (measured worst relative error 8.3e-8, 1.4 ulp, over all floats in
// [-87, 87]), 2^n written into the exponent bits.
// Outside |x| ≤ 87, where 2^n would leave the normal range, the result saturates: 0 below −87
// and inf above 87 (libm returns ~1e-38 and up to 3.4e38 in the last unit of that band; no
// caller can tell: they add the term to 1 or divide by 1 + it). NaN propagates. The range tests
// compare bit patterns as integers: a float comparison would keep GCC from vectorising the loop
// unless -fno-trapping-math.
inline float exp_fast(float x) {
  int32_t ix;
  std::memcpy(&ix, &x, sizeof ix);
  const int32_t kLimitBits = 0x42AE0000;  // 87.0f
  const int32_t kInfBits = 0x7F800000;
  const int32_t mag = ix & 0x7FFFFFFF;
  // All-ones where 87 < |x| ≤ inf (not NaN). Selections are written as masks: GCC turns ?: on
  // them into branches here, which stops vectorisation.
  const int32_t outside = -static_cast<int32_t>((mag > kLimitBits) & (mag <= kInfBits));
  const int32_t saturated = -static_cast<int32_t>(ix >= 0) & kInfBits;  // e^x there: 0 or inf
  // Evaluate the outside lanes at ±87 (discarded below) so that n stays in range.
  const int32_t clamped = (ix & std::numeric_limits<int32_t>::min()) | kLimitBits;
  const int32_t iy = (ix & ~outside) | (clamped & outside);
  std::memcpy(&x, &iy, sizeof x);
  // Adding 1.5·2^23 rounds to an integer held in the low mantissa bits (round to nearest).
  const float kRound = 12582912.0f;
  const int32_t kRoundBits = 0x4B400000;  // bit pattern of kRound
  const float t = x * 1.44269504088896341f + kRound;
  const float n = t - kRound;
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t tbits;
  std::memcpy(&tbits, &t, sizeof tbits);
  // 2^n as float bits, in unsigned arithmetic: for a NaN input t is NaN and tbits - kRoundBits
  // is far outside n's range, so the signed product overflowed (undefined behaviour); the
  // unsigned one wraps, and the NaN in p makes y NaN whatever the scale. Same bits as the
  // signed product wherever that one was defined.
  const uint32_t ebits = (static_cast<uint32_t>(tbits) - static_cast<uint32_t>(kRoundBits) + 127u)
                         << 23;
  float scale;
  std::memcpy(&scale, &ebits, sizeof scale);
  const float y = p * scale;
  int32_t ybits;
  std::memcpy(&ybits, &y, sizeof ybits);
  ybits = (ybits & ~outside) | (saturated & outside);
  float result;
  std::memcpy(&result, &ybits, sizeof result);
  return result;
}

// The double instantiation is the finite-difference reference: libm's exp, exact to rounding.
inline float exp_t(float x) {
  return exp_fast(x);
}
inline double exp_t(double x) {
  return std::exp(x);
}

}  // namespace strata::kernels::cpu
