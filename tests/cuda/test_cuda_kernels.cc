// The CUDA kernels (kernels/cuda) and the CUDA backend's mixed-precision ops against the CPU
// reference (kernels/cpu, evaluated in f32 on the very values the GPU holds: bf16 inputs
// are rounded on the host first, so both sides start from identical numbers). Shapes are chosen
// not to be multiples of any tile (S = 1, 37, 130, 257; odd N, C, OC; head sizes 32, 64, 128 and
// in between). Every test skips visibly without a CUDA device.
//
// Tolerances, each relative to the largest magnitude of the expected result:
// - f32 results of f32 inputs: 1e-4. Both sides compute in float and differ only in the order of
//   sums (tiling, block reductions, atomics) and FMA contraction, ~1e-6 relative for the sums
//   here; 1e-4 leaves room and still catches any wrong or missing term.
// - f32 results of bf16 inputs (weight gradients, LayerNorm statistics, cross-entropy row
//   stats): 1e-3. Same inputs, f32 accumulation on both sides; the slack is for tensor-core
//   accumulation inside cuBLASLt, which is not guaranteed to round like IEEE f32 adds.
// - bf16 results: 1e-2. The GPU rounds each result once to bf16 (≤ 2^-9 ≈ 0.2% of its own
//   magnitude); a GEMM whose bias could not be fused rounds twice, and the attention backward's
//   D = rowsum(dout ∘ out) uses the bf16-rounded out, an error of the same size. The bf16
//   attention kernels (tensor cores, as FlashAttention-2) also round the probabilities and the
//   score gradients to bf16 where they enter the next product: their largest error here is
//   below 4e-3 (measured in the emulation build). 1e-2 is 2.5-5x those, while a wrong term, a
//   missing accumulation or a wrong index is far larger (two swapped registers of a tensor-core
//   fragment put 85% of the elements outside it).
// - exact (0): casts against the CPU's rounding function, permutations.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/gelu.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/optim.h"
#include "kernels/cpu/precision.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/swiglu.h"
#include "kernels/cuda/attention_decode.h"
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/layernorm.h"
#include "kernels/cuda/optim.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/swiglu.h"
#include "runtime/backend/backend.h"
#include "runtime/base/rng.h"
#include "runtime/comm/comm.h"
#include "tests/backend_test_util.h"
#include "tests/cuda/attention_reference.h"
#include "tests/cuda/device_buffers.h"

namespace strata {
namespace {

namespace kcpu = kernels::cpu;
namespace kc = kernels::cuda;
using namespace backend_test;
using namespace device_test;

constexpr double kTolF32 = 1e-4;
constexpr double kTolF32FromBf16 = 1e-3;
constexpr double kTolBf16 = 1e-2;

bool is_bf16(kc::ElemType t) {
  return t == kc::ElemType::kBF16;
}
const char* name(kc::ElemType t) {
  return kc::to_string(t);
}

// ---- backend tensors ----------------------------------------------------------------------

// Tolerance for a result of type `out` computed from inputs of type `in` (see the file comment).
double tol(DType out, DType in) {
  if (out == DType::kBF16) return kTolBf16;
  return in == DType::kBF16 ? kTolF32FromBf16 : kTolF32;
}

// ==== cast ===================================================================================

TEST(CudaKernels, CastRoundsToNearestEvenLikeTheCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  auto be = make_backend("cuda", 1);
  // Random values over many binades, plus the cases rounding gets wrong: ties (both parities),
  // just above/below a tie, ±0, ±inf, NaN, the largest float (rounds to inf), subnormals.
  std::vector<float> v = random(1000003, 1);
  for (size_t i = 0; i < v.size(); i += 7) v[i] *= std::ldexp(1.f, static_cast<int>(i % 200) - 100);
  const uint32_t special[] = {0x3f808000u, 0x3f818000u, 0x3f808001u, 0x3f807fffu, 0x00000000u,
                              0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00001u, 0x7f7fffffu,
                              0x00000001u, 0x807fffffu, 0x7f7f8000u};
  for (size_t k = 0; k < sizeof special / sizeof special[0]; ++k)
    std::memcpy(&v[k * 3], &special[k], sizeof(float));
  Tensor f = put(*be, {static_cast<int64_t>(v.size())}, v, DType::kF32);
  Tensor h = be->empty(f.shape(), MemCategory::kActivations, DType::kBF16);
  be->cast(h, f);
  std::vector<uint16_t> bits(v.size());
  be->download(bits.data(), h);
  int bad = 0;
  for (size_t i = 0; i < v.size(); ++i)
    if (bits[i] != kcpu::f32_to_bf16(v[i]) && bad++ < 3)
      ADD_FAILURE() << "cast of " << v[i] << ": cuda 0x" << std::hex << bits[i] << ", cpu 0x"
                    << kcpu::f32_to_bf16(v[i]) << std::dec;
  EXPECT_EQ(bad, 0);
  // Back to f32: exact widening (compared as bits, so NaN compares too).
  Tensor back = be->empty(f.shape(), MemCategory::kActivations, DType::kF32);
  be->cast(back, h);
  std::vector<float> w(v.size());
  be->download(w.data(), back);
  bad = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    const float want = kcpu::bf16_to_f32(bits[i]);
    if (std::memcmp(&w[i], &want, sizeof want) != 0 && bad++ < 3)
      ADD_FAILURE() << "widening of element " << i << ": " << w[i] << " vs " << want;
  }
  EXPECT_EQ(bad, 0);
  // Same type: a copy.
  Tensor copy = be->empty(f.shape(), MemCategory::kActivations, DType::kF32);
  be->cast(copy, f);
  EXPECT_EQ(std::memcmp(get(*be, copy).data(), v.data(), v.size() * sizeof(float)), 0);
}

// ==== GEMM (cuBLASLt) ==========================================================================

struct GemmCase {
  int M, N, K;
};

// A GemmLt with its 32 MiB workspace.
class GemmTester {
 public:
  GemmTester()
      : ws_(kc::GemmLt::kDefaultWorkspaceBytes),
        lt_(ws_.get(), kc::GemmLt::kDefaultWorkspaceBytes) {
    EXPECT_EQ(lt_.status(), CUBLAS_STATUS_SUCCESS);
  }
  kc::GemmLt& lt() { return lt_; }

 private:
  DeviceBuffer ws_;
  kc::GemmLt lt_;
};

TEST(CudaKernels, GemmLtMatchesCpuGemm) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  GemmTester t;
  const GemmCase cases[] = {{1, 1, 1}, {37, 29, 45}, {64, 128, 96}, {257, 130, 33}};
  const kc::ElemType types[][2] = {{kc::ElemType::kF32, kc::ElemType::kF32},
                                   {kc::ElemType::kBF16, kc::ElemType::kBF16},
                                   {kc::ElemType::kBF16, kc::ElemType::kF32}};
  int declined = 0;
  uint64_t key = 100;
  for (const GemmCase& c : cases)
    for (const auto& ty : types)
      for (int trans = 0; trans < 4; ++trans)
        for (int pad = 0; pad < 2; ++pad) {
          const bool ta = trans & 1, tb = trans & 2;
          const kc::ElemType ab = ty[0], ct = ty[1];
          // A (M, K) or (K, M); B (K, N) or (N, K); C (M, N); `pad` widens every row stride.
          const int lda = (ta ? c.M : c.K) + 3 * pad, ldb = (tb ? c.K : c.N) + 5 * pad;
          const int ldc = c.N + 2 * pad;
          const int rows_a = ta ? c.K : c.M, rows_b = tb ? c.N : c.K;
          const float alpha = 0.75f, beta = pad ? 1.f : 0.f;
          const auto a = rounded(random(static_cast<size_t>(rows_a) * lda, ++key), is_bf16(ab));
          const auto b = rounded(random(static_cast<size_t>(rows_b) * ldb, ++key), is_bf16(ab));
          auto want = rounded(random(static_cast<size_t>(c.M) * ldc, ++key), is_bf16(ct));
          DeviceArray A(a, ab), B(b, ab), C(want, ct);
          kc::Gemm g;
          g.trans_a = ta, g.trans_b = tb, g.M = c.M, g.N = c.N, g.K = c.K;
          g.A = A.get(), g.lda = lda, g.B = B.get(), g.ldb = ldb, g.ab_type = ab;
          g.C = C.get(), g.ldc = ldc, g.c_type = ct, g.alpha = alpha, g.beta = beta;
          const std::string what = std::string("gemm ") + name(ab) + "->" + name(ct) + " M " +
                                   std::to_string(c.M) + " N " + std::to_string(c.N) + " K " +
                                   std::to_string(c.K) + (ta ? " Aᵀ" : "") + (tb ? " Bᵀ" : "") +
                                   (pad ? " padded, beta 1" : "");
          const cublasStatus_t st = t.lt().run(g, nullptr);
          // f32 must always run, and bf16 on 16-byte-aligned rows (what the models use); other
          // bf16 strides may be declined (the backend then widens to f32).
          const bool aligned = !is_bf16(ab) || (lda % 8 == 0 && ldb % 8 == 0 && ldc % 8 == 0);
          if (st == CUBLAS_STATUS_NOT_SUPPORTED && !aligned) {
            ++declined;
            continue;
          }
          ASSERT_EQ(st, CUBLAS_STATUS_SUCCESS) << what;
          kcpu::gemm<float>(ta, tb, c.M, c.N, c.K, alpha, a.data(), lda, b.data(), ldb, beta,
                            want.data(), ldc);
          expect_close(what, C.host(), want,
                       is_bf16(ct)   ? kTolBf16
                       : is_bf16(ab) ? kTolF32FromBf16
                                     : kTolF32);
        }
  if (declined)
    std::cout << "[   NOTE   ] cuBLASLt declined " << declined
              << " bf16 GEMMs with unaligned strides\n";
}

TEST(CudaKernels, GemmLtEpilogues) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  GemmTester t;
  // (M, N, K) = (rows, out features, in features) of a linear layer; ld_aux is a multiple of 8.
  const GemmCase cases[] = {{64, 96, 80}, {37, 29, 45}};
  const kc::ElemType types[][2] = {{kc::ElemType::kF32, kc::ElemType::kF32},
                                   {kc::ElemType::kBF16, kc::ElemType::kBF16},
                                   {kc::ElemType::kBF16, kc::ElemType::kF32}};
  uint64_t key = 200;
  for (const GemmCase& c : cases)
    for (const auto& ty : types) {
      const kc::ElemType ab = ty[0], ct = ty[1];
      const double tol_c = is_bf16(ct) ? kTolBf16 : is_bf16(ab) ? kTolF32FromBf16 : kTolF32;
      const std::string shape = std::string(name(ab)) + "->" + name(ct) + " M " +
                                std::to_string(c.M) + " N " + std::to_string(c.N) + " K " +
                                std::to_string(c.K);
      const auto x = rounded(random(static_cast<size_t>(c.M) * c.K, ++key), is_bf16(ab));
      const auto w = rounded(random(static_cast<size_t>(c.N) * c.K, ++key), is_bf16(ab));
      const auto bias = rounded(random(c.N, ++key), is_bf16(ct));
      DeviceArray X(x, ab), W(w, ab), Bias(bias, ct);
      // out (M, N) = x · wᵀ + bias, then gelu(out) with the pre-activation in aux.
      std::vector<float> pre(static_cast<size_t>(c.M) * c.N);
      kcpu::matmul_forward<float>(pre.data(), x.data(), w.data(), bias.data(), c.M, c.K, c.N);
      for (int epi = 0; epi < 2; ++epi) {
        const bool gelu = epi == 1;
        const int ld_aux = (c.N + 7) / 8 * 8;
        DeviceArray Out(std::vector<float>(static_cast<size_t>(c.M) * c.N, 0.f), ct);
        DeviceArray Aux(std::vector<float>(static_cast<size_t>(c.M) * ld_aux, 0.f), ct);
        kc::Gemm g;
        g.trans_b = true, g.M = c.M, g.N = c.N, g.K = c.K;
        g.A = X.get(), g.lda = c.K, g.B = W.get(), g.ldb = c.K, g.ab_type = ab;
        g.C = Out.get(), g.ldc = c.N, g.c_type = ct;
        g.epilogue = gelu ? kc::GemmEpilogue::kGeluAuxBias : kc::GemmEpilogue::kBias;
        g.bias = Bias.get(), g.bias_type = ct;
        g.aux = Aux.get(), g.ld_aux = ld_aux;
        const std::string what = shape + (gelu ? " gelu_aux_bias" : " bias");
        const cublasStatus_t st = t.lt().run(g, nullptr);
        if (st == CUBLAS_STATUS_NOT_SUPPORTED) {
          std::cout << "[   NOTE   ] cuBLASLt declined the epilogue of " << what << "\n";
          continue;
        }
        ASSERT_EQ(st, CUBLAS_STATUS_SUCCESS) << what;
        std::vector<float> want = pre;
        if (gelu) {
          kcpu::gelu_forward<float>(want.data(), pre.data(), want.size());
          const std::vector<float> aux = Aux.host();
          std::vector<float> aux_used;
          for (int i = 0; i < c.M; ++i)
            aux_used.insert(aux_used.end(), aux.begin() + static_cast<size_t>(i) * ld_aux,
                            aux.begin() + static_cast<size_t>(i) * ld_aux + c.N);
          expect_close(what + " aux", aux_used, pre, tol_c);
        }
        expect_close(what, Out.host(), want, tol_c);
      }
      for (const bool with_bias : {true, false})
        for (const int shift : {0, 1}) {
          // A residual read from a separate C (C_in, beta 1) into an output of NaN: out (M, N) =
          // x · wᵀ [+ bias] + residual, written without reading out; the residual unchanged.
          // shift 1 starts C_in one element into its buffer, so it is less aligned than C (on a
          // GPU the plan chosen for the aligned C_in must not be reused for it).
          const auto res = rounded(random(static_cast<size_t>(c.M) * c.N, ++key), is_bf16(ct));
          std::vector<float> padded(static_cast<size_t>(shift), 0.f);
          padded.insert(padded.end(), res.begin(), res.end());
          DeviceArray Res(padded, ct);
          DeviceArray Out(std::vector<float>(res.size(), NAN), ct);
          kc::Gemm g;
          g.trans_b = true, g.M = c.M, g.N = c.N, g.K = c.K;
          g.A = X.get(), g.lda = c.K, g.B = W.get(), g.ldb = c.K, g.ab_type = ab;
          g.C = Out.get(), g.ldc = c.N, g.c_type = ct, g.beta = 1.f;
          g.C_in = static_cast<const char*>(Res.get()) + shift * kc::elem_size(ct);
          if (with_bias)
            g.epilogue = kc::GemmEpilogue::kBias, g.bias = Bias.get(), g.bias_type = ct;
          const std::string what = shape + " residual C_in" + (with_bias ? " + bias" : "") +
                                   (shift ? " (C_in unaligned)" : "");
          const cublasStatus_t st = t.lt().run(g, nullptr);
          if (st == CUBLAS_STATUS_NOT_SUPPORTED && (with_bias || shift)) {
            std::cout << "[   NOTE   ] cuBLASLt declined " << what << "\n";
            continue;
          }
          ASSERT_EQ(st, CUBLAS_STATUS_SUCCESS) << what;
          std::vector<float> want(res.size());
          kcpu::matmul_forward<float>(want.data(), x.data(), w.data(),
                                      with_bias ? bias.data() : nullptr, c.M, c.K, c.N);
          for (size_t i = 0; i < want.size(); ++i) want[i] += res[i];
          expect_close(what, Out.host(), want, tol_c);
          expect_close(what + " (C_in unchanged)", Res.host(), padded, kTolF32);
        }
      {
        // DGELU: out (M, N) = gelu'(aux) · (x · wᵀ), aux a saved pre-activation; out starts as
        // NaN bytes (beta 0 must not read it).
        const int ld_aux = (c.N + 7) / 8 * 8;
        const auto aux =
            rounded(random(static_cast<size_t>(c.M) * ld_aux, ++key, 3.f), is_bf16(ct));
        DeviceArray Aux(aux, ct);
        DeviceArray Out(std::vector<float>(static_cast<size_t>(c.M) * c.N, NAN), ct);
        kc::Gemm g;
        g.trans_b = true, g.M = c.M, g.N = c.N, g.K = c.K;
        g.A = X.get(), g.lda = c.K, g.B = W.get(), g.ldb = c.K, g.ab_type = ab;
        g.C = Out.get(), g.ldc = c.N, g.c_type = ct;
        g.epilogue = kc::GemmEpilogue::kDGelu;
        g.aux = Aux.get(), g.ld_aux = ld_aux;
        const std::string what = shape + " dgelu";
        const cublasStatus_t st = t.lt().run(g, nullptr);
        if (st == CUBLAS_STATUS_NOT_SUPPORTED) {
          std::cout << "[   NOTE   ] cuBLASLt declined the epilogue of " << what << "\n";
        } else {
          ASSERT_EQ(st, CUBLAS_STATUS_SUCCESS) << what;
          std::vector<float> prod(static_cast<size_t>(c.M) * c.N), pre_used, want(prod.size());
          kcpu::matmul_forward<float>(prod.data(), x.data(), w.data(), nullptr, c.M, c.K, c.N);
          for (int i = 0; i < c.M; ++i)
            pre_used.insert(pre_used.end(), aux.begin() + static_cast<size_t>(i) * ld_aux,
                            aux.begin() + static_cast<size_t>(i) * ld_aux + c.N);
          kcpu::gelu_backward<float>(want.data(), pre_used.data(), prod.data(), want.size());
          expect_close(what, Out.host(), want, tol_c);
        }
      }
      // dw (N, K) += doutᵀ · x and dbias (N) = Σ_rows dout: the weight gradient with BGRADB.
      const auto dout = rounded(random(static_cast<size_t>(c.M) * c.N, ++key), is_bf16(ab));
      auto dw = rounded(random(static_cast<size_t>(c.N) * c.K, ++key), is_bf16(ct));
      DeviceArray Dout(dout, ab), Dw(dw, ct);
      DeviceArray Db(std::vector<float>(c.N, 0.f), ct);
      kc::Gemm g;
      g.trans_a = true, g.M = c.N, g.N = c.K, g.K = c.M;
      g.A = Dout.get(), g.lda = c.N, g.B = X.get(), g.ldb = c.K, g.ab_type = ab;
      g.C = Dw.get(), g.ldc = c.K, g.c_type = ct, g.beta = 1.f;
      g.epilogue = kc::GemmEpilogue::kBiasGradA, g.bias_grad = Db.get();
      const std::string what = shape + " bias_grad";
      const cublasStatus_t st = t.lt().run(g, nullptr);
      if (st == CUBLAS_STATUS_NOT_SUPPORTED) {
        std::cout << "[   NOTE   ] cuBLASLt declined the epilogue of " << what << "\n";
        continue;
      }
      ASSERT_EQ(st, CUBLAS_STATUS_SUCCESS) << what;
      kcpu::gemm<float>(true, false, c.N, c.K, c.M, 1.f, dout.data(), c.N, x.data(), c.K, 1.f,
                        dw.data(), c.K);
      std::vector<float> db(c.N, 0.f);
      for (int i = 0; i < c.M; ++i)
        for (int j = 0; j < c.N; ++j) db[j] += dout[static_cast<size_t>(i) * c.N + j];
      expect_close(what + " dw", Dw.host(), dw, tol_c);
      expect_close(what + " dbias", Db.host(), db, tol_c);
    }
}

// ==== flash attention =========================================================================

// Multi-head attention (KVH = NH: the kernels as they were before grouped-query attention), then
// grouped-query attention with two query heads per key/value head and multi-query (one key/value
// head for eight query heads), whose backward sums each key/value head's gradient over its
// group — across query tiles and a change of head within one block's steps (S = 130, 257: three
// and five tiles).
std::vector<AttentionCase> attention_cases() {
  std::vector<AttentionCase> cases;
  for (int S : {1, 37, 130, 257})
    for (int HS : {32, 64, 128, 7, 48, 80}) cases.push_back({2, S, 3, 3, HS});
  for (int S : {37, 130})
    for (int HS : {32, 64, 128, 48}) cases.push_back({2, S, 4, 2, HS});
  for (int HS : {64, 128, 80}) cases.push_back({1, 257, 8, 1, HS});
  return cases;
}

TEST(CudaKernels, FlashAttentionForwardMatchesCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  uint64_t key = 300;
  for (kc::ElemType type : {kc::ElemType::kF32, kc::ElemType::kBF16})
    for (const AttentionCase& c : attention_cases()) {
      const std::string what = std::string("flash forward ") + name(type) + " " + c.str();
      const size_t tokens = c.tokens(), C = c.C();
      const auto qkv = rounded(random(tokens * c.width(), ++key), is_bf16(type));
      DeviceArray Qkv(qkv, type), Out(std::vector<float>(tokens * C, 0.f), type);
      DeviceArray Lse(std::vector<float>(c.rows(), 0.f), kc::ElemType::kF32);
      ASSERT_EQ(kc::flash_attention_forward(Out.get(), Lse.f32(), Qkv.get(), type, c.B, c.S, c.NH,
                                            c.KVH, c.HS, nullptr),
                cudaSuccess)
          << what;
      std::vector<float> out(tokens * C), att(c.rows() * c.S);
      kcpu::attention_forward<float>(out.data(), att.data(), qkv.data(), c.B, c.S, c.NH, c.KVH,
                                     c.HS);
      expect_close(what + " out", Out.host(), out, is_bf16(type) ? kTolBf16 : kTolF32);
      // The log-sum-exp is f32 whatever the type, from the same (rounded) inputs.
      expect_close(what + " lse", Lse.host(), reference_lse(qkv, c), kTolF32);
      if (!is_bf16(type)) continue;
        // The bf16 forward's two tilings (16 and 32 query rows per warp; the default, checked
        // above, is one of them by head size) give the same results: a sum over the same keys in
        // the same order, so bit for bit in the emulation build. On a GPU the two kernels are
        // compiled apart and nvcc may fuse a multiply and an add (an FMA) in one and not the
        // other: up to a rounding of the output.
#ifdef STRATA_CUDA_EMULATION
      constexpr double kTolOut = 0.0, kTolLse = 0.0;
#else
      constexpr double kTolOut = kTolBf16, kTolLse = kTolF32;
#endif
      std::vector<float> tiled_out[2], tiled_lse[2];
      for (const int m : {0, 1}) {
        DeviceArray OutR(std::vector<float>(tokens * C, 0.f), type);
        DeviceArray LseR(std::vector<float>(c.rows(), 0.f), kc::ElemType::kF32);
        ASSERT_EQ(
            kc::flash_attention_forward_bf16_warp_rows(OutR.get(), LseR.f32(), Qkv.get(), c.B, c.S,
                                                       c.NH, c.KVH, c.HS, 16 * (m + 1), nullptr),
            cudaSuccess)
            << what << ", " << 16 * (m + 1) << " rows per warp";
        tiled_out[m] = OutR.host();
        tiled_lse[m] = LseR.host();
      }
      expect_close(what + " out, 16 against 32 rows per warp", tiled_out[0], tiled_out[1], kTolOut);
      expect_close(what + " lse, 16 against 32 rows per warp", tiled_lse[0], tiled_lse[1], kTolLse);
    }
}

TEST(CudaKernels, FlashAttentionWarpRowsRefusesWhatItCannotRun) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  // Rows per warp come in whole m-tiles of 16, one or two of them.
  for (const int rows : {0, 24, 48})
    EXPECT_EQ(kc::flash_attention_forward_bf16_warp_rows(nullptr, nullptr, nullptr, 1, 4, 1, 1, 64,
                                                         rows, nullptr),
              cudaErrorInvalidValue)
        << rows << " rows per warp";
}

TEST(CudaKernels, FlashAttentionBackwardMatchesCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  uint64_t key = 400;
  for (kc::ElemType type : {kc::ElemType::kF32, kc::ElemType::kBF16})
    for (const AttentionCase& c : attention_cases()) {
      const std::string what = std::string("flash backward ") + name(type) + " " + c.str();
      const size_t tokens = c.tokens(), C = c.C();
      const auto qkv = rounded(random(tokens * c.width(), ++key), is_bf16(type));
      const auto dout = rounded(random(tokens * C, ++key), is_bf16(type));
      // dqkv starts non-zero (of the gradient's size): the kernel must assign it (as the CPU's
      // does), so a kernel that read and added it would miss by the starting values.
      auto dqkv = rounded(random(tokens * c.width(), ++key, 0.5f), is_bf16(type));
      DeviceArray Qkv(qkv, type), Out(std::vector<float>(tokens * C, 0.f), type);
      DeviceArray Dout(dout, type), Dqkv(dqkv, type);
      DeviceArray Lse(std::vector<float>(c.rows(), 0.f), kc::ElemType::kF32);
      DeviceBuffer scratch(kc::flash_attention_backward_scratch_bytes(c.B, c.S, c.NH, c.KVH, c.HS));
      ASSERT_EQ(kc::flash_attention_forward(Out.get(), Lse.f32(), Qkv.get(), type, c.B, c.S, c.NH,
                                            c.KVH, c.HS, nullptr),
                cudaSuccess)
          << what;
      ASSERT_EQ(
          kc::flash_attention_backward(Dqkv.get(), Dout.get(), Qkv.get(), Out.get(), Lse.f32(),
                                       type, c.B, c.S, c.NH, c.KVH, c.HS, scratch.get(), nullptr),
          cudaSuccess)
          << what;
      std::vector<float> out(tokens * C), att(c.rows() * c.S);
      std::vector<float> cpu_scratch(kcpu::attention_scratch_elems(c.S));
      kcpu::attention_forward<float>(out.data(), att.data(), qkv.data(), c.B, c.S, c.NH, c.KVH,
                                     c.HS);
      kcpu::attention_backward<float>(dqkv.data(), dout.data(), qkv.data(), att.data(),
                                      cpu_scratch.data(), c.B, c.S, c.NH, c.KVH, c.HS);
      expect_close(what + " dqkv", Dqkv.host(), dqkv, is_bf16(type) ? kTolBf16 : kTolF32);
    }
}

// The tensor-core fragment layouts the bf16 attention kernels assume (kernels/cuda/mma.cuh): a
// 16 × 16 × 16 product through their cp.async staging and ldmatrix fragment loads — b as a key
// tile (a · bᵀ), b as a value tile (a · b, b read transposed) and a as dSᵀ (aᵀ · b) — against
// the CPU product. Small integers make every product and sum exact in f32, so the comparison is
// exact: a lane, register or matrix off by one moves whole values. In the emulation build this
// checks the emulator against the same layouts; on a GPU it checks them against the hardware.
TEST(CudaKernels, TensorCoreFragmentLayoutMatchesCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  std::vector<float> a(16 * 16), b(16 * 16);
  for (size_t i = 0; i < a.size(); ++i)
    a[i] = static_cast<float>(static_cast<int>(i * 7 % 23) - 11);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(static_cast<int>(i * 5 % 19) - 9);
  DeviceArray A(a, kc::ElemType::kBF16), B(b, kc::ElemType::kBF16);
  using Op = kc::MmaFragmentOperands;
  for (const Op op : {Op::kABt, Op::kAB, Op::kAtB}) {
    DeviceArray D(std::vector<float>(16 * 16, 0.f), kc::ElemType::kF32);
    ASSERT_EQ(kc::mma_fragment_product(D.f32(), A.get(), B.get(), op, nullptr), cudaSuccess);
    std::vector<float> d(16 * 16, 0.f);
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < 16; ++j)
        for (int k = 0; k < 16; ++k)
          d[i * 16 + j] += (op == Op::kAtB ? a[k * 16 + i] : a[i * 16 + k]) *
                           (op == Op::kABt ? b[j * 16 + k] : b[k * 16 + j]);
    const char* what = op == Op::kABt ? "a·bT" : op == Op::kAB ? "a·b" : "aT·b";
    expect_close(std::string("m16n8k16 product ") + what, D.host(), d, 0.0);
  }
}

TEST(CudaKernels, FlashAttentionRefusesHeadSizesAbove128) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  EXPECT_EQ(kc::flash_attention_forward(nullptr, nullptr, nullptr, kc::ElemType::kF32, 1, 4, 1, 1,
                                        kc::kFlashMaxHeadSize + 1, nullptr),
            cudaErrorInvalidValue);
}

// Key/value head counts that do not divide the query heads (or are not positive) are refused
// before anything runs, forward and backward, never rounded to a group size.
TEST(CudaKernels, FlashAttentionRefusesKeyValueHeadsThatDoNotDivide) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  for (const int kvh : {0, 3, 5})
    for (kc::ElemType type : {kc::ElemType::kF32, kc::ElemType::kBF16}) {
      EXPECT_EQ(
          kc::flash_attention_forward(nullptr, nullptr, nullptr, type, 1, 4, 4, kvh, 64, nullptr),
          cudaErrorInvalidValue)
          << "KVH " << kvh;
      EXPECT_EQ(kc::flash_attention_backward(nullptr, nullptr, nullptr, nullptr, nullptr, type, 1,
                                             4, 4, kvh, 64, nullptr, nullptr),
                cudaErrorInvalidValue)
          << "KVH " << kvh;
    }
}

// ==== multi-tensor optimizer kernels ============================================================

TEST(CudaKernels, MultiTensorAdamWMatchesCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  // 41 segments (more than one launch's table), sizes around the 4096-element chunk, and odd
  // offsets into one allocation (so segments are not 16-byte aligned).
  std::vector<int64_t> sizes = {1, 4095, 4096, 4097, 100003, 7, 0, 12289};
  for (int k = 0; sizes.size() < 41; ++k)
    sizes.push_back(1 + static_cast<int64_t>(mix64(k) % 3000));
  int64_t total = 0;
  for (int64_t n : sizes) total += n;
  const auto p0 = random(total, 500), g = random(total, 501);
  DeviceArray P(p0, kc::ElemType::kF32), G(g, kc::ElemType::kF32);
  DeviceArray M(std::vector<float>(total, 0.f), kc::ElemType::kF32);
  DeviceArray V(std::vector<float>(total, 0.f), kc::ElemType::kF32);
  std::vector<kc::AdamWSegment> segs;
  int64_t at = 0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    kc::AdamWSegment s;
    s.param = P.f32() + at, s.grad = G.f32() + at, s.m = M.f32() + at, s.v = V.f32() + at;
    s.n = sizes[k], s.decay = k % 3 != 1;
    segs.push_back(s);
    at += sizes[k];
  }
  kc::AdamWHyper h;
  h.lr = 1e-2f, h.beta1 = 0.9f, h.beta2 = 0.95f, h.eps = 1e-8f, h.weight_decay = 0.1f;
  std::vector<float> p = p0, m(total, 0.f), v(total, 0.f);
  for (int step = 1; step <= 3; ++step) {
    h.step = step;
    h.grad_scale = step == 2 ? 0.37f : 1.f;  // a clipped step between two unclipped ones
    ASSERT_EQ(kc::adamw_multi_tensor(segs.data(), static_cast<int>(segs.size()), h, nullptr),
              cudaSuccess);
    at = 0;
    for (size_t k = 0; k < sizes.size(); ++k) {
      kcpu::adamw_update(p.data() + at, g.data() + at, m.data() + at, v.data() + at,
                         static_cast<size_t>(sizes[k]), h.lr, h.beta1, h.beta2, h.eps,
                         segs[k].decay ? h.weight_decay : 0.f, step, h.grad_scale);
      at += sizes[k];
    }
  }
  // Elementwise with no sums: only FMA contraction and division rounding differ (a few ulp).
  expect_close("adamw param", P.host(), p, 1e-5);
  expect_close("adamw m", M.host(), m, 1e-5);
  expect_close("adamw v", V.host(), v, 1e-5);
  expect_close("adamw gradients unchanged", G.host(), g, 0.0);
}

TEST(CudaKernels, MultiTensorSumSquaresMatchesCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  std::vector<std::unique_ptr<DeviceArray>> arrays;
  std::vector<kc::SumSquaresSegment> segs;
  double want = 0;
  for (int k = 0; k < 37; ++k) {
    const int64_t n = k == 5 ? 0 : 1 + static_cast<int64_t>(mix64(100 + k) % 9000);
    const kc::ElemType type = k % 2 ? kc::ElemType::kBF16 : kc::ElemType::kF32;
    // Every third segment starts one element into its buffer, so it is not 16-byte aligned and
    // is read element by element; the others are read as vectors.
    const int64_t skip = k % 3 == 2 ? 1 : 0;
    const auto x = rounded(random(n + skip, 600 + k), is_bf16(type));
    for (int64_t i = skip; i < n + skip; ++i) want += static_cast<double>(x[i]) * x[i];
    arrays.push_back(std::make_unique<DeviceArray>(x, type));
    segs.push_back(
        {static_cast<char*>(arrays.back()->get()) + skip * kc::elem_size(type), type, n});
  }
  DeviceBuffer out(sizeof(double));
  const double start = 2.5;  // the kernel adds to what is there
  ASSERT_EQ(cudaMemcpy(out.get(), &start, sizeof start, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(kc::sum_squares_multi_tensor(static_cast<double*>(out.get()), segs.data(),
                                         static_cast<int>(segs.size()), nullptr),
            cudaSuccess);
  double got = 0;
  ASSERT_EQ(cudaMemcpy(&got, out.get(), sizeof got, cudaMemcpyDeviceToHost), cudaSuccess);
  // Squares of floats are exact in double; only the order of the double sums differs.
  EXPECT_NEAR(got, start + want, 1e-10 * (start + want));
}

// ==== LayerNorm backward =========================================================================
// What the backend's LayerNorm test (below) cannot reach: weights of the other type than the
// activations, row pointers that are not 16-byte aligned although C is a multiple of 8, and
// enough rows that every warp of the parameter-gradient kernel sums many. mean and rstd come from
// the CPU, so both sides start from the same statistics; dinp, dweight and dbias start nonzero, as
// they are accumulated into.

TEST(CudaKernels, LayerNormBackwardMatchesCpuForMixedTypesAndUnalignedRows) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  using ET = kc::ElemType;
  struct Case {
    int N, C;
    ET act, w;
    int skip;  // elements before dinp, dout, inp and weight in their buffers: 1 misaligns them
  };
  const Case cases[] = {
      // 2 column tiles of 256 (the second 8 columns wide), 132 row slices of 8: 9 or 10 rows per
      // warp, 16-byte vectors.
      {10037, 264, ET::kBF16, ET::kF32, 0},
      // rows of 1536 bytes start 2 bytes into the buffers: element by element throughout.
      {300, 768, ET::kBF16, ET::kF32, 1},
      // f32 rows of 400 bytes move as vectors but for each row's last, partial group.
      {1000, 100, ET::kF32, ET::kBF16, 0},
      {37, 130, ET::kF32, ET::kBF16, 1},
      {1, 7, ET::kBF16, ET::kBF16, 0},
  };
  uint64_t key = 1700;
  for (const Case& c : cases) {
    const std::string what = std::string("layernorm backward N ") + std::to_string(c.N) + " C " +
                             std::to_string(c.C) + " " + name(c.act) + "/" + name(c.w) +
                             (c.skip ? " unaligned" : "");
    const size_t n = static_cast<size_t>(c.N) * c.C;
    const bool ab = is_bf16(c.act), wb = is_bf16(c.w);
    auto x = random(n, ++key);
    for (float& v : x) v += 3.f;  // a mean far from 0, as in the residual stream
    x = rounded(x, ab);
    const auto dy = rounded(random(n, ++key), ab), dx0 = rounded(random(n, ++key), ab);
    const auto w = rounded(random(c.C, ++key), wb), b = random(c.C, ++key);
    const auto dw0 = random(c.C, ++key), db0 = random(c.C, ++key);
    std::vector<float> y(n), mean(c.N), rstd(c.N);
    kcpu::layernorm_forward<float>(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(),
                                   c.N, c.C);
    // The device arrays hold `skip` zeros, then the values.
    const auto padded = [&](const std::vector<float>& v) {
      std::vector<float> p(c.skip, 0.f);
      p.insert(p.end(), v.begin(), v.end());
      return p;
    };
    const auto unpadded = [&](std::vector<float> v) {
      v.erase(v.begin(), v.begin() + c.skip);
      return v;
    };
    DeviceArray dX(padded(dx0), c.act), dY(padded(dy), c.act), X(padded(x), c.act);
    DeviceArray W(padded(w), c.w), Mean(mean, ET::kF32), Rstd(rstd, ET::kF32);
    DeviceArray dW(dw0, ET::kF32), dB(db0, ET::kF32);
    const auto at = [&](const DeviceArray& a) {
      return static_cast<char*>(a.get()) + c.skip * kc::elem_size(a.type());
    };
    ASSERT_EQ(kc::layernorm_backward(at(dX), dW.f32(), dB.f32(), at(dY), at(X), c.act, at(W), c.w,
                                     Mean.f32(), Rstd.f32(), c.N, c.C, nullptr),
              cudaSuccess)
        << what;
    std::vector<float> dx = dx0, dw = dw0, db = db0;
    kcpu::layernorm_backward<float>(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(),
                                    mean.data(), rstd.data(), c.N, c.C);
    // dinp is rounded to act; it and the parameter gradients are f32 sums of act-type inputs
    // (and, for dinp, of the weights).
    const double dx_tol = ab ? kTolBf16 : wb ? kTolF32FromBf16 : kTolF32;
    const double dwb_tol = ab ? kTolF32FromBf16 : kTolF32;
    expect_close(what + " dinp", unpadded(dX.host()), dx, dx_tol);
    expect_close(what + " dweight", dW.host(), dw, dwb_tol);
    expect_close(what + " dbias", dB.host(), db, dwb_tol);
  }
  // No rows: nothing to do, and no pointer is touched.
  EXPECT_EQ(kc::layernorm_backward(nullptr, nullptr, nullptr, nullptr, nullptr, ET::kBF16, nullptr,
                                   ET::kF32, nullptr, nullptr, 0, 768, nullptr),
            cudaSuccess);
}

// ==== Llama-family kernels: RMSNorm, RoPE, SwiGLU ===============================================

// RMSNorm forward and backward against kernels/cpu/rmsnorm.h, with the LayerNorm test's shapes
// and type mixes: rows that move as 16-byte vectors (768, 2048) and rows that do not (45, 130,
// 1031: a partial last group), many rows per warp of the weight-gradient kernel (8203), and a
// weight of the other type. dinp and dweight start non-zero: both accumulate.
TEST(CudaKernels, RmsNormMatchesCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  using ET = kc::ElemType;
  struct Case {
    int N, C;
    ET act, w;
  };
  const Case cases[] = {{37, 45, ET::kF32, ET::kF32},     {5, 1031, ET::kBF16, ET::kBF16},
                        {300, 768, ET::kBF16, ET::kF32},  {9, 2048, ET::kF32, ET::kF32},
                        {8203, 24, ET::kBF16, ET::kBF16}, {37, 130, ET::kF32, ET::kBF16},
                        {1, 7, ET::kBF16, ET::kF32}};
  const float eps = 1e-5f;
  uint64_t key = 3100;
  for (const Case& c : cases) {
    const std::string what = std::string("rmsnorm N ") + std::to_string(c.N) + " C " +
                             std::to_string(c.C) + " " + name(c.act) + "/" + name(c.w);
    const size_t n = static_cast<size_t>(c.N) * c.C;
    const bool ab = is_bf16(c.act), wb = is_bf16(c.w);
    const auto x = rounded(random(n, ++key, 2.f), ab), w = rounded(random(c.C, ++key), wb);
    const auto dy = rounded(random(n, ++key), ab), dx0 = rounded(random(n, ++key), ab);
    const auto dw0 = random(c.C, ++key);
    DeviceArray X(x, c.act), W(w, c.w), Y(std::vector<float>(n, 0.f), c.act);
    DeviceArray Rstd(std::vector<float>(c.N, 0.f), ET::kF32);
    DeviceArray dY(dy, c.act), dX(dx0, c.act), dW(dw0, ET::kF32);
    ASSERT_EQ(kc::rmsnorm_forward(Y.get(), Rstd.f32(), X.get(), c.act, W.get(), c.w, eps, c.N, c.C,
                                  nullptr),
              cudaSuccess)
        << what;
    ASSERT_EQ(kc::rmsnorm_backward(dX.get(), dW.f32(), dY.get(), X.get(), c.act, W.get(), c.w,
                                   Rstd.f32(), c.N, c.C, nullptr),
              cudaSuccess)
        << what;
    std::vector<float> y(n), rstd(c.N), dx = dx0, dw = dw0;
    kcpu::rmsnorm_forward<float>(y.data(), rstd.data(), x.data(), w.data(), c.N, c.C, eps);
    kcpu::rmsnorm_backward<float>(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(),
                                  c.N, c.C);
    // out and dinp are rounded to act; rstd and dweight are f32 sums of act-type inputs.
    const double stat_tol = ab ? kTolF32FromBf16 : kTolF32;
    const double act_tol = ab ? kTolBf16 : wb ? kTolF32FromBf16 : kTolF32;
    expect_close(what + " out", Y.host(), y, act_tol);
    expect_close(what + " rstd", Rstd.host(), rstd, stat_tol);
    expect_close(what + " dinp", dX.host(), dx, act_tol);
    expect_close(what + " dweight", dW.host(), dw, stat_tol);
  }
  EXPECT_EQ(kc::rmsnorm_forward(nullptr, nullptr, nullptr, ET::kBF16, nullptr, ET::kF32, eps, 0,
                                768, nullptr),
            cudaSuccess);
}

// The per-head RMSNorm of the query and key heads, forward and backward in place, against
// kernels/cpu/rmsnorm.h: grouped-query, multi-head and multi-query layouts; head sizes that move
// as 16-byte vectors (128, 64) and that do not (45, 6, 7: partial groups, rows not 16-byte
// aligned); many rows per warp of the weight-gradient kernels (B·S = 2·300 positions); weights of
// the other type. dq_weight and dk_weight start non-zero (they accumulate). The value heads must
// come back bit for bit, in the forward's qkv and in the backward's dqkv.
TEST(CudaKernels, QkRmsNormMatchesCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  using ET = kc::ElemType;
  struct Case {
    AttentionCase a;
    ET act, w;
  };
  const Case cases[] = {
      {{2, 37, 4, 2, 128}, ET::kBF16, ET::kBF16}, {{2, 37, 4, 2, 128}, ET::kF32, ET::kF32},
      {{2, 300, 8, 1, 64}, ET::kBF16, ET::kF32},  {{1, 19, 3, 3, 45}, ET::kF32, ET::kBF16},
      {{3, 5, 2, 1, 6}, ET::kBF16, ET::kBF16},    {{1, 1, 1, 1, 7}, ET::kF32, ET::kF32},
  };
  const float eps = 1e-6f;
  uint64_t key = 3150;
  for (const Case& c : cases) {
    const AttentionCase& a = c.a;
    const std::string what =
        std::string("qk_rmsnorm ") + a.str() + " " + name(c.act) + "/" + name(c.w);
    const int N = static_cast<int>(a.tokens()), W = static_cast<int>(a.width());
    const size_t n = a.tokens() * a.width(), stats = a.tokens() * (a.NH + a.KVH);
    const bool ab = is_bf16(c.act), wb = is_bf16(c.w);
    const auto x = rounded(random(n, ++key, 2.f), ab), dy = rounded(random(n, ++key), ab);
    const auto qw = rounded(random(a.HS, ++key), wb), kw = rounded(random(a.HS, ++key), wb);
    const auto dq0 = random(a.HS, ++key), dk0 = random(a.HS, ++key);
    DeviceArray Qkv(x, c.act), Pre(x, c.act), D(dy, c.act), Qw(qw, c.w), Kw(kw, c.w);
    DeviceArray Rstd(std::vector<float>(stats, 0.f), ET::kF32);
    DeviceArray dQ(dq0, ET::kF32), dK(dk0, ET::kF32);
    ASSERT_EQ(kc::qk_rmsnorm_forward(Qkv.get(), c.act, Rstd.f32(), Qw.get(), Kw.get(), c.w, eps, N,
                                     a.NH, a.KVH, a.HS, nullptr),
              cudaSuccess)
        << what;
    ASSERT_EQ(kc::qk_rmsnorm_backward(D.get(), dQ.f32(), dK.f32(), Pre.get(), c.act, Qw.get(),
                                      Kw.get(), c.w, Rstd.f32(), N, a.NH, a.KVH, a.HS, nullptr),
              cudaSuccess)
        << what;
    std::vector<float> y = x, rstd(stats), dx = dy, dq = dq0, dk = dk0;
    kcpu::qk_rmsnorm_forward<float>(y.data(), rstd.data(), qw.data(), kw.data(), N, a.NH, a.KVH,
                                    a.HS, eps);
    kcpu::qk_rmsnorm_backward<float>(dx.data(), dq.data(), dk.data(), x.data(), qw.data(),
                                     kw.data(), rstd.data(), N, a.NH, a.KVH, a.HS);
    const auto got_y = Qkv.host(), got_dx = D.host();
    int moved = 0;  // value-head elements that differ from what they were
    for (int t = 0; t < N; ++t)
      for (int e = (a.NH + a.KVH) * a.HS; e < W; ++e) {
        const size_t i = static_cast<size_t>(t) * W + e;
        moved += (got_y[i] != x[i]) + (got_dx[i] != dy[i]);
      }
    EXPECT_EQ(moved, 0) << what << ": value heads changed";
    // qkv and dqkv are rounded to act; rstd and the weight gradients are f32 sums of act-type
    // inputs (tolerances as RmsNormMatchesCpu's).
    const double stat_tol = ab ? kTolF32FromBf16 : kTolF32;
    const double act_tol = ab ? kTolBf16 : wb ? kTolF32FromBf16 : kTolF32;
    expect_close(what + " qkv", got_y, y, act_tol);
    expect_close(what + " rstd", Rstd.host(), rstd, stat_tol);
    expect_close(what + " dqkv", got_dx, dx, act_tol);
    expect_close(what + " dq_weight", dQ.host(), dq, stat_tol);
    expect_close(what + " dk_weight", dK.host(), dk, stat_tol);
  }
  // No positions: nothing runs; a layout without key heads is refused.
  EXPECT_EQ(kc::qk_rmsnorm_forward(nullptr, ET::kBF16, nullptr, nullptr, nullptr, ET::kBF16, eps, 0,
                                   4, 2, 128, nullptr),
            cudaSuccess);
  EXPECT_EQ(kc::qk_rmsnorm_backward(nullptr, nullptr, nullptr, nullptr, ET::kBF16, nullptr, nullptr,
                                    ET::kBF16, nullptr, 5, 4, 0, 128, nullptr),
            cudaErrorInvalidValue);
}

// The (S_max, HS) table of backend.h: row s = [cos(s·θ_i) | sin(s·θ_i)], θ_i = 10000^(−2i/HS).
std::vector<float> rope_table(int S_max, int HS) {
  std::vector<float> t(static_cast<size_t>(S_max) * HS);
  for (int s = 0; s < S_max; ++s)
    for (int i = 0; i < HS / 2; ++i) {
      const double a = s * std::pow(10000.0, -2.0 * i / HS);
      t[static_cast<size_t>(s) * HS + i] = static_cast<float>(std::cos(a));
      t[static_cast<size_t>(s) * HS + HS / 2 + i] = static_cast<float>(std::sin(a));
    }
  return t;
}

// RoPE forward and backward in place against kernels/cpu/rope.h, multi-head, grouped-query and
// multi-query layouts, a table longer than the sequence (S_max > S), head sizes that are and are
// not multiples of 8. The value heads must come back untouched (the comparison covers them).
TEST(CudaKernels, RopeMatchesCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const AttentionCase cases[] = {
      {2, 37, 3, 3, 64}, {2, 130, 4, 2, 128}, {1, 19, 8, 1, 6}, {3, 1, 2, 1, 32}};
  uint64_t key = 3200;
  for (kc::ElemType type : {kc::ElemType::kF32, kc::ElemType::kBF16})
    for (const AttentionCase& c : cases) {
      const std::string what = std::string("rope ") + name(type) + " " + c.str();
      const auto table = rope_table(c.S + 5, c.HS);
      const auto qkv0 = rounded(random(c.tokens() * c.width(), ++key), is_bf16(type));
      DeviceArray Qkv(qkv0, type), Table(table, kc::ElemType::kF32);
      ASSERT_EQ(
          kc::rope_forward(Qkv.get(), type, Table.f32(), c.B, c.S, c.NH, c.KVH, c.HS, nullptr),
          cudaSuccess)
          << what;
      auto qkv = qkv0;
      kcpu::rope_forward<float>(qkv.data(), table.data(), c.B, c.S, c.NH, c.KVH, c.HS);
      // One rounding of each stored element (bf16), or the sum order of two products (f32).
      const double t = is_bf16(type) ? kTolBf16 : kTolF32;
      expect_close(what + " forward", Qkv.host(), qkv, t);
      // The backward on a fresh gradient, in place.
      const auto d0 = rounded(random(qkv0.size(), ++key), is_bf16(type));
      DeviceArray D(d0, type);
      ASSERT_EQ(kc::rope_backward(D.get(), type, Table.f32(), c.B, c.S, c.NH, c.KVH, c.HS, nullptr),
                cudaSuccess)
          << what;
      auto d = d0;
      kcpu::rope_backward<float>(d.data(), table.data(), c.B, c.S, c.NH, c.KVH, c.HS);
      expect_close(what + " backward", D.host(), d, t);
    }
  // An odd head size has no pairs: refused before anything runs.
  EXPECT_EQ(kc::rope_forward(nullptr, kc::ElemType::kF32, nullptr, 1, 4, 2, 1, 7, nullptr),
            cudaErrorInvalidValue);
}

// SwiGLU forward and backward against kernels/cpu/swiglu.h: widths that move as 16-byte vectors
// (F = 64, 96) and widths that go element by element (45, 7), gates far into both tails (scale
// 12: σ saturates). dgate_up starts as NaN: it is assigned, never read.
TEST(CudaKernels, SwigluMatchesCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const int shapes[][2] = {{37, 64}, {5, 45}, {300, 96}, {1, 7}};
  uint64_t key = 3300;
  for (kc::ElemType type : {kc::ElemType::kF32, kc::ElemType::kBF16})
    for (const auto& nf : shapes) {
      const int N = nf[0], F = nf[1];
      const std::string what = std::string("swiglu ") + name(type) + " N " + std::to_string(N) +
                               " F " + std::to_string(F);
      const size_t n = static_cast<size_t>(N) * F;
      const auto gu = rounded(random(2 * n, ++key, 12.f), is_bf16(type));
      const auto dy = rounded(random(n, ++key), is_bf16(type));
      DeviceArray GU(gu, type), Y(std::vector<float>(n, 0.f), type), dY(dy, type);
      DeviceArray dGU(std::vector<float>(2 * n, NAN), type);
      ASSERT_EQ(kc::swiglu_forward(Y.get(), GU.get(), type, N, F, nullptr), cudaSuccess) << what;
      ASSERT_EQ(kc::swiglu_backward(dGU.get(), dY.get(), GU.get(), type, N, F, nullptr),
                cudaSuccess)
          << what;
      std::vector<float> y(n), dgu(2 * n);
      kcpu::swiglu_forward<float>(y.data(), gu.data(), N, F);
      kcpu::swiglu_backward<float>(dgu.data(), dy.data(), gu.data(), N, F);
      // Elementwise: exp and the division may differ from the host's by an ulp or two (f32), or
      // the result is rounded once (bf16).
      const double t = is_bf16(type) ? kTolBf16 : kTolF32;
      expect_close(what + " out", Y.host(), y, t);
      expect_close(what + " dgate_up", dGU.host(), dgu, t);
    }
}

// ==== generation with a key/value cache ==========================================================

// Decode shapes: T new tokens at positions pos0 … pos0 + T − 1 of a cache of S_max.
struct DecodeCase {
  int B, T, S_max, NH, KVH, HS, pos0;
  int width() const { return (NH + 2 * KVH) * HS; }
  size_t qkv_elems() const { return static_cast<size_t>(B) * T * width(); }
  size_t q_elems() const { return static_cast<size_t>(B) * T * NH * HS; }
  size_t cache_elems() const { return static_cast<size_t>(B) * S_max * KVH * HS; }
  std::string str() const {
    return "B " + std::to_string(B) + " T " + std::to_string(T) + " S_max " +
           std::to_string(S_max) + " NH " + std::to_string(NH) + " KVH " + std::to_string(KVH) +
           " HS " + std::to_string(HS) + " pos0 " + std::to_string(pos0);
  }
};

// The host reference of kv_cache_append (runtime/backend/backend.h): a copy loop.
void append_on_host(std::vector<float>& q, std::vector<float>& k, std::vector<float>& v,
                    const std::vector<float>& qkv, const DecodeCase& c) {
  const size_t HS = static_cast<size_t>(c.HS), W = static_cast<size_t>(c.width());
  const size_t qw = c.NH * HS, kv = c.KVH * HS;
  for (size_t b = 0; b < static_cast<size_t>(c.B); ++b)
    for (size_t t = 0; t < static_cast<size_t>(c.T); ++t) {
      const float* row = qkv.data() + (b * c.T + t) * W;
      std::copy(row, row + qw, q.data() + (b * c.T + t) * qw);
      const size_t at = (b * c.S_max + c.pos0 + t) * kv;
      std::copy(row + qw, row + qw + kv, k.data() + at);
      std::copy(row + qw + kv, row + W, v.data() + at);
    }
}

// kv_cache_append and attention_decode against the host copy loop and
// kernels/cpu/attention.h's attention_decode: grouped-query (4/2), multi-query (8/1) and
// multi-head layouts, an empty cache (pos0 = 0) and a filled one, one new token and several, a
// block filling the cache to its end, head sizes 32, 64, 128 and 48 (not whole warps of lanes).
// The caches start with random values (earlier positions, and positions the append must leave
// alone); q and out start as NaN (assigned, never read). The append is a copy: exact.
TEST(CudaKernels, KvCacheAppendAndAttentionDecodeMatchCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const DecodeCase cases[] = {{2, 1, 40, 4, 2, 64, 0},  {2, 1, 40, 4, 2, 64, 37},
                              {1, 5, 70, 8, 1, 128, 0}, {2, 3, 70, 8, 1, 32, 50},
                              {3, 4, 20, 4, 4, 32, 16}, {1, 7, 130, 4, 2, 128, 100},
                              {2, 2, 9, 2, 1, 48, 3}};
  uint64_t key = 3400;
  for (kc::ElemType type : {kc::ElemType::kF32, kc::ElemType::kBF16})
    for (const DecodeCase& c : cases) {
      const std::string what = std::string("decode ") + name(type) + " " + c.str();
      const auto qkv = rounded(random(c.qkv_elems(), ++key), is_bf16(type));
      auto k = rounded(random(c.cache_elems(), ++key), is_bf16(type));
      auto v = rounded(random(c.cache_elems(), ++key), is_bf16(type));
      DeviceArray Qkv(qkv, type), K(k, type), V(v, type);
      DeviceArray Q(std::vector<float>(c.q_elems(), NAN), type);
      DeviceArray Out(std::vector<float>(c.q_elems(), NAN), type);
      ASSERT_EQ(kc::kv_cache_append(Q.get(), K.get(), V.get(), Qkv.get(), type, c.B, c.T, c.S_max,
                                    c.NH, c.KVH, c.HS, c.pos0, nullptr),
                cudaSuccess)
          << what;
      std::vector<float> q(c.q_elems());
      append_on_host(q, k, v, qkv, c);
      expect_close(what + " q", Q.host(), q, 0.0);
      expect_close(what + " key cache", K.host(), k, 0.0);
      expect_close(what + " value cache", V.host(), v, 0.0);
      ASSERT_EQ(kc::attention_decode(Out.get(), Q.get(), K.get(), V.get(), type, c.B, c.T, c.S_max,
                                     c.NH, c.KVH, c.HS, c.pos0, nullptr),
                cudaSuccess)
          << what;
      std::vector<float> out(c.q_elems());
      kcpu::attention_decode<float>(out.data(), q.data(), k.data(), v.data(), c.B, c.T, c.S_max,
                                    c.NH, c.KVH, c.HS, c.pos0);
      // f32: the sums' order and exp's last bits; bf16: one rounding at the store.
      expect_close(what + " out", Out.host(), out, is_bf16(type) ? kTolBf16 : kTolF32);
    }
}

// Shapes the decode kernels cannot run are refused before anything is launched.
TEST(CudaKernels, DecodeRefusesBadShapes) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const kc::ElemType f = kc::ElemType::kF32;
  // (B, T, S_max, NH, KVH, HS, pos0)
  EXPECT_EQ(
      kc::attention_decode(nullptr, nullptr, nullptr, nullptr, f, 1, 1, 8, 2, 1, 129, 0, nullptr),
      cudaErrorInvalidValue);  // head size above 128
  EXPECT_EQ(
      kc::attention_decode(nullptr, nullptr, nullptr, nullptr, f, 1, 1, 8, 3, 2, 32, 0, nullptr),
      cudaErrorInvalidValue);  // key/value heads that do not divide the query heads
  EXPECT_EQ(
      kc::attention_decode(nullptr, nullptr, nullptr, nullptr, f, 1, 2, 8, 2, 1, 32, 7, nullptr),
      cudaErrorInvalidValue);  // positions beyond the cache
  EXPECT_EQ(
      kc::kv_cache_append(nullptr, nullptr, nullptr, nullptr, f, 1, 2, 8, 2, 1, 32, 7, nullptr),
      cudaErrorInvalidValue);
  EXPECT_EQ(
      kc::kv_cache_append(nullptr, nullptr, nullptr, nullptr, f, 1, 1, 8, 2, 0, 32, 0, nullptr),
      cudaErrorInvalidValue);  // no key/value heads
  EXPECT_EQ(
      kc::kv_cache_append(nullptr, nullptr, nullptr, nullptr, f, 1, 1, 8, 2, 1, 32, -1, nullptr),
      cudaErrorInvalidValue);
}

// ==== the backend's ops in f32 and bf16 ========================================================
// Parameterised by the activation type; weights (compute copies) have the same type, statistics
// and parameter gradients are f32, as train.precision = bf16 lays them out.

class CudaBackendOps : public ::testing::TestWithParam<DType> {
 protected:
  DType act() const { return GetParam(); }
  bool bf16() const { return GetParam() == DType::kBF16; }
  std::vector<float> host(size_t n, uint64_t key, float scale = 1.f) const {
    return rounded(random(n, key, scale), bf16());
  }
};

TEST_P(CudaBackendOps, Matmul) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  auto be = make_backend("cuda", 1);
  const GemmCase cases[] = {{37, 45, 29}, {64, 128, 96}};  // (N, C, OC)
  uint64_t key = 700;
  for (const GemmCase& c : cases) {
    const int N = c.M, C = c.N, OC = c.K;
    const std::string shape =
        " N " + std::to_string(N) + " C " + std::to_string(C) + " OC " + std::to_string(OC);
    const auto x = host(static_cast<size_t>(N) * C, ++key),
               w = host(static_cast<size_t>(OC) * C, ++key);
    const auto b = host(OC, ++key), g = host(static_cast<size_t>(N) * OC, ++key);
    auto dx = host(static_cast<size_t>(N) * C, ++key);
    auto dw = random(static_cast<size_t>(OC) * C, ++key), db = random(OC, ++key);  // f32
    Tensor X = put(*be, {N, C}, x, act()), W = put(*be, {OC, C}, w, act());
    Tensor Bi = put(*be, {OC}, b, act()), G = put(*be, {N, OC}, g, act());
    Tensor Y = be->empty({N, OC}, MemCategory::kActivations, act());
    Tensor dX = put(*be, {N, C}, dx, act()), dW = put(*be, {OC, C}, dw, DType::kF32);
    Tensor dB = put(*be, {OC}, db, DType::kF32);
    be->matmul_forward(Y, X, W, &Bi);
    be->matmul_backward(&dX, dW, &dB, G, X, W);
    std::vector<float> y(static_cast<size_t>(N) * OC);
    kcpu::matmul_forward<float>(y.data(), x.data(), w.data(), b.data(), N, C, OC);
    kcpu::matmul_backward<float>(dx.data(), dw.data(), db.data(), g.data(), x.data(), w.data(), N,
                                 C, OC);
    expect_close("matmul out" + shape, get(*be, Y), y, tol(act(), act()));
    expect_close("matmul dinp" + shape, get(*be, dX), dx, tol(act(), act()));
    expect_close("matmul dweight" + shape, get(*be, dW), dw, tol(DType::kF32, act()));
    expect_close("matmul dbias" + shape, get(*be, dB), db, tol(DType::kF32, act()));

    // A projection joining the residual stream, with and without a bias, into a buffer of NaN
    // (written, never read); the residual stays as it was.
    const auto r = host(static_cast<size_t>(N) * OC, ++key);
    const Tensor R = put(*be, {N, OC}, r, act());
    for (const bool with_bias : {true, false}) {
      const std::string what = std::string(" residual") + (with_bias ? " + bias" : "") + shape;
      Tensor Yr = put(*be, {N, OC}, std::vector<float>(r.size(), NAN), act());
      be->matmul_residual_forward(Yr, X, W, with_bias ? &Bi : nullptr, R);
      std::vector<float> yr(r.size());
      kcpu::matmul_forward<float>(yr.data(), x.data(), w.data(), with_bias ? b.data() : nullptr, N,
                                  C, OC);
      for (size_t i = 0; i < yr.size(); ++i) yr[i] += r[i];
      expect_close("matmul out" + what, get(*be, Yr), yr, tol(act(), act()));
      expect_close("matmul residual unchanged" + shape, get(*be, R), r, kTolF32);
    }
  }
}

// The MLP's linear + GELU and its input gradient through GELU, which the backend fuses into
// cuBLASLt's epilogues in bf16 where the output width is a multiple of 8 (64, 96), and runs as
// two ops otherwise (29; and fp32 always): both ways against the CPU's two ops.
TEST_P(CudaBackendOps, MatmulGelu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  auto be = make_backend("cuda", 1);
  const GemmCase cases[] = {{37, 45, 64}, {64, 128, 96}, {37, 45, 29}};  // (N, C, F)
  uint64_t key = 750;
  for (const GemmCase& c : cases) {
    const int N = c.M, C = c.N, F = c.K;
    const std::string shape =
        " N " + std::to_string(N) + " C " + std::to_string(C) + " F " + std::to_string(F);
    const auto x = host(static_cast<size_t>(N) * C, ++key),
               w = host(static_cast<size_t>(F) * C, ++key), b = host(F, ++key);
    Tensor X = put(*be, {N, C}, x, act()), W = put(*be, {F, C}, w, act());
    Tensor Bi = put(*be, {F}, b, act());
    Tensor Pre = be->empty({N, F}, MemCategory::kActivations, act());
    Tensor Y = be->empty({N, F}, MemCategory::kActivations, act());
    be->matmul_gelu_forward(Pre, Y, X, W, Bi);
    std::vector<float> pre(static_cast<size_t>(N) * F), y(pre.size());
    kcpu::matmul_forward<float>(pre.data(), x.data(), w.data(), b.data(), N, C, F);
    kcpu::gelu_forward<float>(y.data(), pre.data(), y.size());
    expect_close("matmul_gelu pre" + shape, get(*be, Pre), pre, tol(act(), act()));
    expect_close("matmul_gelu out" + shape, get(*be, Y), y, tol(act(), act()));

    // The next layer (F -> C) carried back through the GELU: dpre = gelu'(pre) · (dout · w2),
    // into a buffer of NaN (assigned, never read).
    const auto pre_in = host(static_cast<size_t>(N) * F, ++key, 3.f);
    const auto dout = host(static_cast<size_t>(N) * C, ++key);
    const auto w2 = host(static_cast<size_t>(C) * F, ++key);
    Tensor P = put(*be, {N, F}, pre_in, act()), G = put(*be, {N, C}, dout, act());
    Tensor W2 = put(*be, {C, F}, w2, act());
    Tensor dP = put(*be, {N, F}, std::vector<float>(static_cast<size_t>(N) * F, NAN), act());
    be->matmul_backward_input_gelu(dP, G, W2, P);
    std::vector<float> dact(static_cast<size_t>(N) * F), dpre(dact.size());
    kcpu::gemm<float>(false, false, N, F, C, 1.f, dout.data(), C, w2.data(), F, 0.f, dact.data(),
                      F);
    kcpu::gelu_backward<float>(dpre.data(), pre_in.data(), dact.data(), dpre.size());
    expect_close("matmul_backward_input_gelu dpre" + shape, get(*be, dP), dpre, tol(act(), act()));
  }
}

// BERT's attention: bidirectional, over the real keys of padded sequences (key lengths on the
// device), through the CUDA backend (Strata's flash kernels: f32 on CUDA cores, bf16 on tensor
// cores) against the CPU backend: outputs and the assigned dqkv (padded keys get 0), for a key
// tile entirely of padding (S = 130, 40 real keys: tiles 64..127 and 128..129 see no query),
// a single real key, grouped-query heads, causal with padding, and no padding at all.
TEST_P(CudaBackendOps, BidirectionalPaddedAttention) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  auto gpu = make_backend("cuda", 1);
  auto cpu = make_backend("cpu", 1);
  struct Case {
    int B, S, NH, KVH, HS;
    bool causal;
    std::vector<int32_t> len;  // empty: no padding
  };
  const Case cases[] = {{2, 37, 3, 3, 32, false, {37, 20}}, {2, 130, 4, 2, 64, false, {130, 40}},
                        {2, 130, 2, 2, 48, true, {100, 7}}, {2, 70, 2, 2, 64, false, {1, 70}},
                        {1, 257, 8, 1, 64, false, {}},      {2, 65, 4, 4, 128, false, {65, 64}}};
  uint64_t key = 1600;
  for (const Case& c : cases) {
    std::string what = " B " + std::to_string(c.B) + " S " + std::to_string(c.S) + " NH " +
                       std::to_string(c.NH) + " KVH " + std::to_string(c.KVH) + " HS " +
                       std::to_string(c.HS) + (c.causal ? " causal" : " bidirectional");
    for (int32_t l : c.len) what += " " + std::to_string(l);
    const int64_t W = static_cast<int64_t>(c.NH + 2 * c.KVH) * c.HS, O = int64_t{c.NH} * c.HS;
    const auto qkv = host(static_cast<size_t>(c.B * c.S * W), ++key, 1.5f);
    const auto dout = host(static_cast<size_t>(c.B * c.S * O), ++key);
    std::vector<std::vector<float>> out(2), dqkv(2);
    Backend* backends[] = {gpu.get(), cpu.get()};
    for (int k = 0; k < 2; ++k) {
      Backend& be = *backends[k];
      Tensor Q = put(be, {c.B, c.S, W}, qkv, act()), G = put(be, {c.B, c.S, O}, dout, act());
      Tensor Len = c.len.empty() ? Tensor() : put_i32(be, {c.B}, c.len);
      AttentionMask mask;
      mask.causal = c.causal;
      mask.key_lengths = c.len.empty() ? nullptr : &Len;
      Tensor Out = be.empty({c.B, c.S, O}, MemCategory::kActivations, act());
      Tensor Saved = be.empty(be.attention_saved_shape(c.B, c.NH, c.S), MemCategory::kActivations);
      // dqkv starts as NaN: it is assigned, padded keys included.
      Tensor D = put(be, {c.B, c.S, W}, std::vector<float>(qkv.size(), NAN), act());
      be.attention_forward(Out, Saved, Q, c.NH, c.KVH, mask);
      be.attention_backward(D, G, Q, Out, Saved, c.NH, c.KVH, mask);
      out[static_cast<size_t>(k)] = get(be, Out);
      dqkv[static_cast<size_t>(k)] = get(be, D);
    }
    expect_close("padded attention out" + what, out[0], out[1], tol(act(), act()));
    expect_close("padded attention dqkv" + what, dqkv[0], dqkv[1], tol(act(), act()));
  }
}

// BERT's other ops through the CUDA backend against the CPU backend: the exact (erf) GELU alone
// and behind a linear layer (never cuBLASLt's tanh epilogue), its input gradient through the next
// layer, tanh and its gradient, and a LayerNorm with eps 1e-12 on rows of small variance.
TEST_P(CudaBackendOps, GeluErfTanhAndLayerNormEps) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  auto gpu = make_backend("cuda", 1);
  auto cpu = make_backend("cpu", 1);
  const int N = 37, C = 64, F = 96;
  uint64_t key = 1700;
  const auto x = host(N * C, ++key), w = host(F * C, ++key), b = host(F, ++key);
  const auto pre = host(N * F, ++key, 3.f), dout = host(N * C, ++key), w2 = host(C * F, ++key);
  const auto small = host(N * C, ++key, 1e-4f), lw = host(C, ++key), lb = host(C, ++key);
  std::vector<std::vector<std::vector<float>>> r(2);
  Backend* backends[] = {gpu.get(), cpu.get()};
  for (int k = 0; k < 2; ++k) {
    Backend& be = *backends[k];
    std::vector<std::vector<float>>& o = r[static_cast<size_t>(k)];
    Tensor X = put(be, {N, C}, x, act()), Wt = put(be, {F, C}, w, act()),
           Bi = put(be, {F}, b, act());
    Tensor Pre = be.empty({N, F}, MemCategory::kActivations, act());
    Tensor Y = be.empty({N, F}, MemCategory::kActivations, act());
    be.matmul_gelu_forward(Pre, Y, X, Wt, Bi, GeluKind::kErf);
    o.push_back(get(be, Y));
    Tensor P = put(be, {N, F}, pre, act()), G = put(be, {N, C}, dout, act()),
           W2 = put(be, {C, F}, w2, act());
    Tensor dP = put(be, {N, F}, std::vector<float>(pre.size(), NAN), act());
    be.matmul_backward_input_gelu(dP, G, W2, P, GeluKind::kErf);
    o.push_back(get(be, dP));
    Tensor T = be.empty({N, F}, MemCategory::kActivations, act());
    be.tanh_forward(T, P);
    o.push_back(get(be, T));
    Tensor Gf = put(be, {N, F}, pre, act());
    Tensor dT = put(be, {N, F}, std::vector<float>(pre.size(), NAN), act());
    be.tanh_backward(dT, T, Gf);
    o.push_back(get(be, dT));
    Tensor S = put(be, {N, C}, small, act()), LW = put(be, {C}, lw, act()),
           LB = put(be, {C}, lb, act());
    Tensor Ln = be.empty({N, C}, MemCategory::kActivations, act());
    Tensor Mean = be.empty({N}, MemCategory::kActivations),
           Rstd = be.empty({N}, MemCategory::kActivations);
    be.layernorm_forward(Ln, Mean, Rstd, S, LW, LB, 1e-12f);
    o.push_back(get(be, Ln));
    o.push_back(get(be, Rstd));
  }
  const char* names[] = {"matmul_gelu erf out",
                         "matmul_backward_input_gelu erf dpre",
                         "tanh out",
                         "tanh dinp",
                         "layernorm eps 1e-12 out",
                         "layernorm eps 1e-12 rstd"};
  for (size_t i = 0; i < r[0].size(); ++i)
    expect_close(names[i], r[0][i], r[1][i], i == 5 ? kTolF32 : tol(act(), act()));
}

TEST_P(CudaBackendOps, LayerNorm) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  auto be = make_backend("cuda", 1);
  // (N, C): rows of 7, 45, 130 and 1031 columns are no multiple of 8 and go element by element
  // (a partial last group per row; 7: that group alone); rows of 100 move as 16-byte vectors in
  // f32 but for their last, partial group, and element by element in bf16; rows of 96, 768 and
  // 2048 move as vectors (2048: 8 groups per lane, and 8 column tiles of 256 in the
  // parameter-gradient kernel; 1031: 5 tiles, the last part empty). 1 and 37 rows leave the
  // last block of 8 rows part empty; of 8203 rows each warp of the parameter-gradient kernel
  // sums 3 or 4 (264 row slices of 8). The kernel-level test above adds mixed weight types,
  // unaligned rows and many rows per warp.
  const int shapes[][2] = {{37, 45},   {5, 1031}, {37, 96},    {9, 2048}, {8203, 24},
                           {300, 768}, {1, 7},    {1000, 100}, {37, 130}, {1, 768}};
  uint64_t key = 800;
  for (const auto& nc : shapes) {
    const int N = nc[0], C = nc[1];
    const std::string shape = " N " + std::to_string(N) + " C " + std::to_string(C);
    const size_t n = static_cast<size_t>(N) * C;
    auto x = random(n, ++key);
    for (size_t i = 0; i < n; ++i) x[i] += 3.f;  // a mean far from 0, as in the residual stream
    x = rounded(x, bf16());
    const auto w = host(C, ++key), b = host(C, ++key), g = host(n, ++key);
    auto dx = host(n, ++key);
    auto dw = random(C, ++key), db = random(C, ++key);
    Tensor X = put(*be, {N, C}, x, act()), W = put(*be, {C}, w, act()), B = put(*be, {C}, b, act());
    Tensor Y = be->empty({N, C}, MemCategory::kActivations, act());
    Tensor Mean = be->empty({N}, MemCategory::kActivations),
           Rstd = be->empty({N}, MemCategory::kActivations);
    Tensor G = put(*be, {N, C}, g, act()), dX = put(*be, {N, C}, dx, act());
    Tensor dW = put(*be, {C}, dw, DType::kF32), dB = put(*be, {C}, db, DType::kF32);
    be->layernorm_forward(Y, Mean, Rstd, X, W, B);
    be->layernorm_backward(dX, dW, dB, G, X, W, Mean, Rstd);
    std::vector<float> y(n), mean(N), rstd(N);
    kcpu::layernorm_forward<float>(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(),
                                   N, C);
    kcpu::layernorm_backward<float>(dx.data(), dw.data(), db.data(), g.data(), x.data(), w.data(),
                                    mean.data(), rstd.data(), N, C);
    expect_close("layernorm out" + shape, get(*be, Y), y, tol(act(), act()));
    expect_close("layernorm mean" + shape, get(*be, Mean), mean, tol(DType::kF32, act()));
    expect_close("layernorm rstd" + shape, get(*be, Rstd), rstd, tol(DType::kF32, act()));
    expect_close("layernorm dinp" + shape, get(*be, dX), dx, tol(act(), act()));
    expect_close("layernorm dweight" + shape, get(*be, dW), dw, tol(DType::kF32, act()));
    expect_close("layernorm dbias" + shape, get(*be, dB), db, tol(DType::kF32, act()));
  }
}

TEST_P(CudaBackendOps, Gelu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  auto be = make_backend("cuda", 1);
  const int64_t n = 37 * 45 * 7;
  const auto x = host(n, 900, 3.f), g = host(n, 901);
  auto dx = host(n, 902);
  Tensor X = put(*be, {n}, x, act()), G = put(*be, {n}, g, act()), dX = put(*be, {n}, dx, act());
  Tensor Y = be->empty({n}, MemCategory::kActivations, act());
  be->gelu_forward(Y, X);
  be->gelu_backward(dX, X, G);
  std::vector<float> y(n);
  kcpu::gelu_forward<float>(y.data(), x.data(), n);
  kcpu::gelu_backward<float>(dx.data(), x.data(), g.data(), n);
  expect_close("gelu out", get(*be, Y), y, tol(act(), act()));
  expect_close("gelu dinp", get(*be, dX), dx, tol(act(), act()));
}

TEST_P(CudaBackendOps, Embedding) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  auto be = make_backend("cuda", 1);
  // A vocabulary shard [10, 60) of 70 tokens: some tokens fall outside it and contribute 0.
  const int B = 2, S = 19, C = 45, V_local = 50, vocab_start = 10, S_max = 23;
  std::vector<int32_t> tok(B * S);
  for (size_t i = 0; i < tok.size(); ++i) tok[i] = static_cast<int32_t>(mix64(i) % 70);
  tok[3] = tok[11];  // a repeated token: its dwte row sums two positions
  const auto wte = host(static_cast<size_t>(V_local) * C, 1000),
             wpe = host(static_cast<size_t>(S_max) * C, 1001);
  const auto g = host(static_cast<size_t>(B) * S * C, 1002);
  auto dwte = random(static_cast<size_t>(V_local) * C, 1003),
       dwpe = random(static_cast<size_t>(S_max) * C, 1004);
  Tensor T = put_i32(*be, {B, S}, tok), E = put(*be, {V_local, C}, wte, act());
  Tensor P = put(*be, {S_max, C}, wpe, act()), G = put(*be, {B, S, C}, g, act());
  Tensor Y = be->empty({B, S, C}, MemCategory::kActivations, act());
  Tensor dE = put(*be, {V_local, C}, dwte, DType::kF32),
         dP = put(*be, {S_max, C}, dwpe, DType::kF32);
  be->embedding_forward(Y, T, E, &P, vocab_start);
  be->embedding_backward(dE, &dP, G, T, vocab_start);
  std::vector<float> y(static_cast<size_t>(B) * S * C);
  kcpu::embedding_forward<float>(y.data(), tok.data(), wte.data(), wpe.data(), B, S, C, vocab_start,
                                 V_local);
  kcpu::embedding_backward<float>(dwte.data(), dwpe.data(), g.data(), tok.data(), B, S, C,
                                  vocab_start, V_local);
  expect_close("embedding out", get(*be, Y), y, tol(act(), act()));
  expect_close("embedding dwte", get(*be, dE), dwte, tol(DType::kF32, act()));
  expect_close("embedding dwpe", get(*be, dP), dwpe, tol(DType::kF32, act()));
}

TEST_P(CudaBackendOps, CrossEntropy) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  auto be = make_backend("cuda", 1);
  // Shards starting at vocabulary index 5: 67 columns (61 real, 6 padding), rows that are no
  // multiple of 8 and so go element by element; 136 columns (129 real), whose rows move as
  // 16-byte vectors with the padding masked inside the last group; and 136 columns of which 3
  // are real, where all but one thread of the online max/Σexp pass hold no value to merge.
  const int shards[][2] = {{67, 61}, {136, 129}, {136, 3}};  // (ld, valid)
  for (const auto& shard : shards) {
    const int N = 37, ld = shard[0], valid = shard[1], vocab_start = 5;
    const std::string shape = " ld " + std::to_string(ld) + " valid " + std::to_string(valid);
    const float scale = 1.f / N;
    auto logits = host(static_cast<size_t>(N) * ld, 1100 + ld + valid, 3.f);
    // Row 0 rises to its last column, so the running max grows at every group and every merge;
    // row 1 falls from its first. Row 2 spans ±60: exp of it unscaled would overflow f32 sums.
    for (int j = 0; j < ld; ++j) {
      logits[static_cast<size_t>(j)] = 0.05f * j;
      logits[static_cast<size_t>(ld + j)] = -0.05f * j;
      logits[static_cast<size_t>(2 * ld + j)] = j % 2 ? 60.f - j : -60.f + j;
    }
    logits = rounded(logits, bf16());
    std::vector<int32_t> targets(N);
    for (int n = 0; n < N; ++n) targets[n] = static_cast<int32_t>(mix64(50 + n) % (ld + 13));
    Tensor L = put(*be, {N, ld}, logits, act()), T = put_i32(*be, {N}, targets);
    const MemCategory a = MemCategory::kActivations;
    Tensor mx = be->empty({N}, a), se = be->empty({N}, a), tl = be->empty({N}, a),
           ls = be->empty({N}, a);
    be->ce_row_stats(mx, se, L, valid);
    be->ce_target_logit(tl, L, T, vocab_start, valid);
    be->ce_losses(ls, mx, se, tl, nullptr);
    // dlogits into an f32 tensor, and in place over the logits (as the model does to save
    // memory).
    Tensor dL = be->empty({N, ld}, a);
    be->ce_backward(dL, L, mx, se, T, scale, vocab_start, valid, nullptr);
    be->ce_backward(L, L, mx, se, T, scale, vocab_start, valid, nullptr);
    std::vector<float> m(N), s(N), t(N), l(N), d(static_cast<size_t>(N) * ld);
    kcpu::ce_row_max<float>(m.data(), logits.data(), N, ld, valid);
    kcpu::ce_row_sumexp<float>(s.data(), logits.data(), m.data(), N, ld, valid);
    kcpu::ce_target_logit<float>(t.data(), logits.data(), targets.data(), N, ld, vocab_start,
                                 valid);
    kcpu::ce_losses<float>(l.data(), m.data(), s.data(), t.data(), nullptr, N);
    kcpu::ce_backward<float>(d.data(), logits.data(), m.data(), s.data(), targets.data(), nullptr,
                             scale, N, ld, vocab_start, valid);
    expect_close("ce row_max" + shape, get(*be, mx), m, kTolF32);  // a max of the same values
    expect_close("ce row_sumexp" + shape, get(*be, se), s, tol(DType::kF32, act()));
    expect_close("ce target_logit" + shape, get(*be, tl), t, kTolF32);
    expect_close("ce losses" + shape, get(*be, ls), l, tol(DType::kF32, act()));
    expect_close("ce dlogits (f32)" + shape, get(*be, dL), d, tol(DType::kF32, act()));
    expect_close("ce dlogits (in place)" + shape, get(*be, L), d, tol(act(), act()));
    // A tensor group's max above this shard's own: the shard's sum scales by exp(local − group).
    std::vector<float> group_max(N), want_se(N);
    for (int n = 0; n < N; ++n) {
      group_max[n] = m[n] + 0.25f * static_cast<float>(n % 5);
      want_se[n] = s[n] * std::exp(m[n] - group_max[n]);
    }
    Tensor Gm = put(*be, {N}, group_max, DType::kF32);
    be->ce_rescale_sumexp(se, mx, Gm);
    expect_close("ce rescaled row_sumexp" + shape, get(*be, se), want_se, tol(DType::kF32, act()));
  }
  {
    // A NaN logit makes its row's loss NaN, as on the CPU: row 0 has NaN in columns 0-7 (the
    // first thread's only group, which the online pass must not skip as empty), row 1 in one
    // column; row 2 is finite.
    const int N = 3, ld = 136, valid = 129;
    auto logits = host(static_cast<size_t>(N) * ld, 1190, 3.f);
    for (int j = 0; j < 8; ++j) logits[static_cast<size_t>(j)] = NAN;
    logits[static_cast<size_t>(ld + 50)] = NAN;
    Tensor L = put(*be, {N, ld}, logits, act()), T = put_i32(*be, {N}, {100, 100, 100});
    const MemCategory a = MemCategory::kActivations;
    Tensor mx = be->empty({N}, a), se = be->empty({N}, a), tl = be->empty({N}, a),
           ls = be->empty({N}, a);
    be->ce_row_stats(mx, se, L, valid);
    be->ce_target_logit(tl, L, T, 0, valid);
    be->ce_losses(ls, mx, se, tl, nullptr);
    const std::vector<float> l = get(*be, ls);
    EXPECT_TRUE(std::isnan(l[0])) << "loss of a row whose first 8 logits are NaN: " << l[0];
    EXPECT_TRUE(std::isnan(l[1])) << "loss of a row with one NaN logit: " << l[1];
    EXPECT_TRUE(std::isfinite(l[2])) << "loss of a finite row: " << l[2];
  }
}

// The loss mask as per-row weights, against the CPU's weighted kernels on the same values.
// Rows 3 and 10 weigh 0 and hold a NaN logit (row 3, in the first thread's group) and ±inf
// logits with the target −100 (row 10): their losses and dlogits rows must be exactly 0 (an
// ignored position is ignored, as PyTorch's ignore_index), in f32 and in place over the logits.
TEST_P(CudaBackendOps, CrossEntropyWeighted) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  auto be = make_backend("cuda", 1);
  const int shards[][2] = {{67, 61}, {136, 129}};  // (ld, valid): element by element, vectors
  for (const auto& shard : shards) {
    const int N = 37, ld = shard[0], valid = shard[1], vocab_start = 5;
    const std::string shape = " ld " + std::to_string(ld) + " valid " + std::to_string(valid);
    const float scale = 1.f / N;
    auto logits = host(static_cast<size_t>(N) * ld, 1300 + ld, 3.f);
    logits[3 * static_cast<size_t>(ld) + 2] = NAN;
    logits[10 * static_cast<size_t>(ld) + 7] = INFINITY;
    logits[10 * static_cast<size_t>(ld) + 40] = -INFINITY;
    std::vector<int32_t> targets(N);
    std::vector<float> weights(N);
    for (int n = 0; n < N; ++n) {
      targets[n] = static_cast<int32_t>(mix64(70 + n) % (ld + 13));
      weights[n] = n % 4 == 1 ? 0.f : 0.5f * static_cast<float>(n % 5);  // 0, 0.5, 1, 1.5, 2
    }
    weights[3] = weights[10] = 0.f;
    targets[10] = -100;
    Tensor L = put(*be, {N, ld}, logits, act()), T = put_i32(*be, {N}, targets);
    Tensor W = put(*be, {N}, weights, DType::kF32);
    const MemCategory a = MemCategory::kActivations;
    Tensor mx = be->empty({N}, a), se = be->empty({N}, a), tl = be->empty({N}, a),
           ls = be->empty({N}, a);
    be->ce_row_stats(mx, se, L, valid);
    be->ce_target_logit(tl, L, T, vocab_start, valid);
    be->ce_losses(ls, mx, se, tl, &W);
    Tensor dL = put(*be, {N, ld}, std::vector<float>(static_cast<size_t>(N) * ld, NAN));
    be->ce_backward(dL, L, mx, se, T, scale, vocab_start, valid, &W);
    be->ce_backward(L, L, mx, se, T, scale, vocab_start, valid, &W);
    std::vector<float> m(N), s(N), t(N), l(N), d(static_cast<size_t>(N) * ld);
    kcpu::ce_row_max<float>(m.data(), logits.data(), N, ld, valid);
    kcpu::ce_row_sumexp<float>(s.data(), logits.data(), m.data(), N, ld, valid);
    kcpu::ce_target_logit<float>(t.data(), logits.data(), targets.data(), N, ld, vocab_start,
                                 valid);
    kcpu::ce_losses<float>(l.data(), m.data(), s.data(), t.data(), weights.data(), N);
    kcpu::ce_backward<float>(d.data(), logits.data(), m.data(), s.data(), targets.data(),
                             weights.data(), scale, N, ld, vocab_start, valid);
    const std::vector<float> gl = get(*be, ls), gd = get(*be, dL), gi = get(*be, L);
    for (int n : {3, 10}) {
      EXPECT_EQ(gl[n], 0.f) << "loss of zero-weight row " << n << shape;
      for (int j = 0; j < ld; ++j) {
        const size_t i = static_cast<size_t>(n) * ld + j;
        ASSERT_EQ(gd[i], 0.f) << "dlogits of zero-weight row " << n << ", column " << j << shape;
        ASSERT_EQ(gi[i], 0.f) << "in-place dlogits of zero-weight row " << n << ", column " << j
                              << shape;
      }
    }
    expect_close("weighted ce losses" + shape, gl, l, tol(DType::kF32, act()));
    expect_close("weighted ce dlogits (f32)" + shape, gd, d, tol(DType::kF32, act()));
    expect_close("weighted ce dlogits (in place)" + shape, gi, d, tol(act(), act()));
  }
}

TEST_P(CudaBackendOps, ElementwiseAndReductionsMixTypes) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  auto be = make_backend("cuda", 1);
  const DType other = bf16() ? DType::kF32 : DType::kBF16;
  const int64_t n = 100003;
  const auto y0 = host(n, 1200), x = rounded(random(n, 1201), other == DType::kBF16);
  Tensor Y = put(*be, {n}, y0, act()), X = put(*be, {n}, x, other);
  Tensor Out = be->empty({n}, MemCategory::kActivations, other);
  be->add(Out, Y, X);     // other = act + other
  be->add_inplace(Y, X);  // act += other
  be->scale_inplace(Y, 0.5f);
  std::vector<float> sum(n), y(n);
  double want_sum = 0, want_abs = 0, want_sq = 0;
  for (int64_t i = 0; i < n; ++i) {
    sum[i] = y0[i] + x[i];
    y[i] = 0.5f * (y0[i] + x[i]);
  }
  expect_close("add", get(*be, Out), sum, tol(other, act()));
  expect_close("add_inplace, scale_inplace", get(*be, Y), y, tol(act(), other));
  for (float v : y0) {
    want_sum += v;
    want_abs += std::fabs(v);
    want_sq += static_cast<double>(v) * v;
  }
  // Both accumulate exact float values in double; only the order of the additions differs.
  Tensor Y0 = put(*be, {n}, y0, act());
  EXPECT_NEAR(be->sum(Y0), want_sum, 1e-12 * want_abs);
  EXPECT_NEAR(be->sum_squares(Y0), want_sq, 1e-12 * want_sq);

  // Views one element in are not 16-byte aligned: the same ops then go element by element.
  Tensor Ys = put(*be, {n}, y0, act()), Xs = put(*be, {n}, x, other);
  Tensor Outs = be->empty({n}, MemCategory::kActivations, other);
  Tensor y1 = Ys.view(1, {n - 1}), x1 = Xs.view(1, {n - 1}), out1 = Outs.view(1, {n - 1});
  be->add(out1, y1, x1);
  be->add_inplace(y1, x1);
  be->scale_inplace(y1, 0.5f);
  expect_close("add (unaligned)", get(*be, out1), {sum.begin() + 1, sum.end()}, tol(other, act()));
  expect_close("add_inplace, scale_inplace (unaligned)", get(*be, y1), {y.begin() + 1, y.end()},
               tol(act(), other));
}

TEST_P(CudaBackendOps, SequenceParallelLayout) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  auto be = make_backend("cuda", 1);
  const int B = 2, S = 21, C = 5, t = 3, Sl = S / t;
  const auto x = host(static_cast<size_t>(B) * S * C, 1300);
  Tensor X = put(*be, {B, S, C}, x, act());
  Tensor Ch = be->empty({t, B, Sl, C}, MemCategory::kActivations, act());
  Tensor Back = be->empty({B, S, C}, MemCategory::kActivations, act());
  be->seq_deinterleave(Ch, X, t);
  be->seq_interleave(Back, Ch, t);
  std::vector<float> ch(x.size());
  for (int r = 0; r < t; ++r)
    for (int b = 0; b < B; ++b)
      for (int s = 0; s < Sl; ++s)
        for (int c = 0; c < C; ++c)
          ch[((static_cast<size_t>(r) * B + b) * Sl + s) * C + c] =
              x[(static_cast<size_t>(b) * S + r * Sl + s) * C + c];
  expect_close("seq_deinterleave", get(*be, Ch), ch, 0.0);
  expect_close("seq_interleave", get(*be, Back), x, 0.0);
}

TEST_P(CudaBackendOps, Attention) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  auto be = make_backend("cuda", 1);
  const int B = 2, S = 37, NH = 3, HS = 16, C = NH * HS;
  const auto qkv = host(static_cast<size_t>(B) * S * 3 * C, 1400);
  const auto g = host(static_cast<size_t>(B) * S * C, 1401);
  auto dqkv = host(qkv.size(), 1402, 0.5f);
  EXPECT_EQ(be->attention_saved_shape(B, NH, S), (Shape{B, NH, S}));
  Tensor Q = put(*be, {B, S, 3 * C}, qkv, act()), G = put(*be, {B, S, C}, g, act());
  Tensor O = be->empty({B, S, C}, MemCategory::kActivations, act());
  Tensor Saved = be->empty(be->attention_saved_shape(B, NH, S), MemCategory::kActivations);
  Tensor dQ = put(*be, {B, S, 3 * C}, dqkv, act());
  be->attention_forward(O, Saved, Q, NH, NH);
  be->attention_backward(dQ, G, Q, O, Saved, NH, NH);
  std::vector<float> out(static_cast<size_t>(B) * S * C), att(static_cast<size_t>(B) * NH * S * S);
  std::vector<float> scratch(kcpu::attention_scratch_elems(S));
  kcpu::attention_forward<float>(out.data(), att.data(), qkv.data(), B, S, NH, NH, HS);
  kcpu::attention_backward<float>(dqkv.data(), g.data(), qkv.data(), att.data(), scratch.data(), B,
                                  S, NH, NH, HS);
  expect_close("attention out", get(*be, O), out, tol(act(), act()));
  expect_close("attention dqkv", get(*be, dQ), dqkv, tol(act(), act()));
}

// RMSNorm through the backend: bf16 activations and weights, f32 rstd and dweight (the layout
// train.precision = bf16 uses), and f32.
TEST_P(CudaBackendOps, RmsNorm) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  auto be = make_backend("cuda", 1);
  const int shapes[][2] = {{37, 45}, {300, 768}, {1, 7}};
  const float eps = 1e-6f;
  uint64_t key = 3400;
  for (const auto& nc : shapes) {
    const int N = nc[0], C = nc[1];
    const std::string shape = " N " + std::to_string(N) + " C " + std::to_string(C);
    const size_t n = static_cast<size_t>(N) * C;
    const auto x = host(n, ++key, 2.f), w = host(C, ++key), g = host(n, ++key);
    auto dx = host(n, ++key);
    auto dw = random(C, ++key);
    Tensor X = put(*be, {N, C}, x, act()), W = put(*be, {C}, w, act());
    Tensor Y = be->empty({N, C}, MemCategory::kActivations, act());
    Tensor Rstd = be->empty({N}, MemCategory::kActivations);
    Tensor G = put(*be, {N, C}, g, act()), dX = put(*be, {N, C}, dx, act());
    Tensor dW = put(*be, {C}, dw, DType::kF32);
    be->rmsnorm_forward(Y, Rstd, X, W, eps);
    be->rmsnorm_backward(dX, dW, G, X, W, Rstd);
    std::vector<float> y(n), rstd(N);
    kcpu::rmsnorm_forward<float>(y.data(), rstd.data(), x.data(), w.data(), N, C, eps);
    kcpu::rmsnorm_backward<float>(dx.data(), dw.data(), g.data(), x.data(), w.data(), rstd.data(),
                                  N, C);
    expect_close("rmsnorm out" + shape, get(*be, Y), y, tol(act(), act()));
    expect_close("rmsnorm rstd" + shape, get(*be, Rstd), rstd, tol(DType::kF32, act()));
    expect_close("rmsnorm dinp" + shape, get(*be, dX), dx, tol(act(), act()));
    expect_close("rmsnorm dweight" + shape, get(*be, dW), dw, tol(DType::kF32, act()));
  }
}

// The per-head RMSNorm of the query and key heads through the backend, in place: activations and
// weights of the parameter's type, rstd and the weight gradients f32; Qwen3's head size (128) and
// an odd one.
TEST_P(CudaBackendOps, QkRmsNorm) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  auto be = make_backend("cuda", 1);
  const AttentionCase cases[] = {{2, 37, 4, 2, 128}, {1, 19, 3, 1, 45}};
  const float eps = 1e-6f;
  uint64_t key = 3450;
  for (const AttentionCase& c : cases) {
    const std::string what = " " + c.str();
    const int N = static_cast<int>(c.tokens()), W = static_cast<int>(c.width());
    const int64_t heads = static_cast<int64_t>(N) * (c.NH + c.KVH);
    const size_t n = c.tokens() * c.width();
    const auto x = host(n, ++key, 2.f), g = host(n, ++key);
    const auto qw = host(c.HS, ++key), kw = host(c.HS, ++key);
    auto dq = random(c.HS, ++key), dk = random(c.HS, ++key);  // f32, accumulated into
    Tensor Qkv = put(*be, {c.B, c.S, W}, x, act()), Pre = put(*be, {c.B, c.S, W}, x, act());
    Tensor D = put(*be, {c.B, c.S, W}, g, act());
    Tensor Qw = put(*be, {c.HS}, qw, act()), Kw = put(*be, {c.HS}, kw, act());
    Tensor Rstd = be->empty({heads}, MemCategory::kActivations);
    Tensor dQ = put(*be, {c.HS}, dq, DType::kF32), dK = put(*be, {c.HS}, dk, DType::kF32);
    be->qk_rmsnorm_forward(Qkv, Rstd, Qw, Kw, c.NH, c.KVH, eps);
    be->qk_rmsnorm_backward(D, dQ, dK, Pre, Qw, Kw, Rstd, c.NH, c.KVH);
    std::vector<float> y = x, rstd(static_cast<size_t>(heads)), dx = g;
    kcpu::qk_rmsnorm_forward<float>(y.data(), rstd.data(), qw.data(), kw.data(), N, c.NH, c.KVH,
                                    c.HS, eps);
    kcpu::qk_rmsnorm_backward<float>(dx.data(), dq.data(), dk.data(), x.data(), qw.data(),
                                     kw.data(), rstd.data(), N, c.NH, c.KVH, c.HS);
    expect_close("qk_rmsnorm qkv" + what, get(*be, Qkv), y, tol(act(), act()));
    expect_close("qk_rmsnorm rstd" + what, get(*be, Rstd), rstd, tol(DType::kF32, act()));
    expect_close("qk_rmsnorm dqkv" + what, get(*be, D), dx, tol(act(), act()));
    expect_close("qk_rmsnorm dq_weight" + what, get(*be, dQ), dq, tol(DType::kF32, act()));
    expect_close("qk_rmsnorm dk_weight" + what, get(*be, dK), dk, tol(DType::kF32, act()));
  }
}

// RoPE through the backend on a grouped-query qkv, with an f32 table (as the model keeps it) and
// a bf16 one (widened by the backend).
TEST_P(CudaBackendOps, Rope) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  auto be = make_backend("cuda", 1);
  const int B = 2, S = 37, NH = 4, KVH = 2, HS = 16, W = (NH + 2 * KVH) * HS;
  for (const DType table_type : {DType::kF32, DType::kBF16}) {
    const std::string what = std::string(" table ") + to_string(table_type);
    const auto table = rounded(rope_table(S + 3, HS), table_type == DType::kBF16);
    const auto qkv0 = host(static_cast<size_t>(B) * S * W, 3500);
    const auto d0 = host(qkv0.size(), 3501);
    Tensor T = put(*be, {S + 3, HS}, table, table_type);
    Tensor Q = put(*be, {B, S, W}, qkv0, act()), D = put(*be, {B, S, W}, d0, act());
    be->rope_forward(Q, T, NH, KVH);
    be->rope_backward(D, T, NH, KVH);
    auto qkv = qkv0, d = d0;
    kcpu::rope_forward<float>(qkv.data(), table.data(), B, S, NH, KVH, HS);
    kcpu::rope_backward<float>(d.data(), table.data(), B, S, NH, KVH, HS);
    expect_close("rope forward" + what, get(*be, Q), qkv, tol(act(), act()));
    expect_close("rope backward" + what, get(*be, D), d, tol(act(), act()));
  }
}

TEST_P(CudaBackendOps, Swiglu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  auto be = make_backend("cuda", 1);
  const int N = 37, F = 48;
  const size_t n = static_cast<size_t>(N) * F;
  const auto gu = host(2 * n, 3600, 4.f), g = host(n, 3601);
  Tensor GU = put(*be, {N, 2 * F}, gu, act()), G = put(*be, {N, F}, g, act());
  Tensor Y = be->empty({N, F}, MemCategory::kActivations, act());
  Tensor dGU = put(*be, {N, 2 * F}, std::vector<float>(2 * n, NAN), act());  // assigned
  be->swiglu_forward(Y, GU);
  be->swiglu_backward(dGU, G, GU);
  std::vector<float> y(n), dgu(2 * n);
  kcpu::swiglu_forward<float>(y.data(), gu.data(), N, F);
  kcpu::swiglu_backward<float>(dgu.data(), g.data(), gu.data(), N, F);
  expect_close("swiglu out", get(*be, Y), y, tol(act(), act()));
  expect_close("swiglu dgate_up", get(*be, dGU), dgu, tol(act(), act()));
}

// Grouped-query and multi-query attention through the backend (the fused kernels), against the
// CPU kernels of the same layout.
TEST_P(CudaBackendOps, GroupedQueryAttention) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  auto be = make_backend("cuda", 1);
  const int heads[][2] = {{4, 2}, {8, 1}};
  uint64_t key = 3700;
  for (const auto& hk : heads) {
    const int B = 2, S = 37, NH = hk[0], KVH = hk[1], HS = 16, C = NH * HS;
    const int W = (NH + 2 * KVH) * HS;
    const std::string what = " NH " + std::to_string(NH) + " KVH " + std::to_string(KVH);
    const auto qkv = host(static_cast<size_t>(B) * S * W, ++key);
    const auto g = host(static_cast<size_t>(B) * S * C, ++key);
    auto dqkv = host(qkv.size(), ++key, 0.5f);
    Tensor Q = put(*be, {B, S, W}, qkv, act()), G = put(*be, {B, S, C}, g, act());
    Tensor O = be->empty({B, S, C}, MemCategory::kActivations, act());
    Tensor Saved = be->empty(be->attention_saved_shape(B, NH, S), MemCategory::kActivations);
    Tensor dQ = put(*be, {B, S, W}, dqkv, act());
    be->attention_forward(O, Saved, Q, NH, KVH);
    be->attention_backward(dQ, G, Q, O, Saved, NH, KVH);
    std::vector<float> out(static_cast<size_t>(B) * S * C);
    std::vector<float> att(static_cast<size_t>(B) * NH * S * S);
    std::vector<float> scratch(kcpu::attention_scratch_elems(S));
    kcpu::attention_forward<float>(out.data(), att.data(), qkv.data(), B, S, NH, KVH, HS);
    kcpu::attention_backward<float>(dqkv.data(), g.data(), qkv.data(), att.data(), scratch.data(),
                                    B, S, NH, KVH, HS);
    expect_close("attention out" + what, get(*be, O), out, tol(act(), act()));
    expect_close("attention dqkv" + what, get(*be, dQ), dqkv, tol(act(), act()));
  }
}

// Generation on the backend: a prompt of 5 tokens into an empty cache, then one token at a time
// (pos0 5, 6), grouped-query (4/2) and multi-query (8/1), against the host copy loop and the CPU
// kernel on the same values. A decode output of the other type (bf16 into f32, f32 into bf16)
// goes through MixedPrecisionScope, as does an append into caches of the other type.
TEST_P(CudaBackendOps, DecodeWithKeyValueCache) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  auto be = make_backend("cuda", 1);
  const DType other = bf16() ? DType::kF32 : DType::kBF16;
  const int heads[][2] = {{4, 2}, {8, 1}};
  uint64_t key = 3800;
  for (const auto& hk : heads) {
    const int B = 2, S_max = 12, NH = hk[0], KVH = hk[1], HS = 32;
    DecodeCase c{B, 5, S_max, NH, KVH, HS, 0};
    std::vector<float> k(c.cache_elems(), 0.f), v(c.cache_elems(), 0.f);
    Tensor K = put(*be, {B, S_max, KVH, HS}, k, act()), V = put(*be, {B, S_max, KVH, HS}, v, act());
    for (int T : {5, 1, 1}) {
      c.T = T;
      const std::string what = " " + c.str();
      const auto qkv = host(c.qkv_elems(), ++key);
      Tensor Qkv = put(*be, {B, T, c.width()}, qkv, act());
      Tensor Q = be->empty({B, T, NH, HS}, MemCategory::kActivations, act());
      be->kv_cache_append(Q, K, V, Qkv, NH, KVH, c.pos0);
      std::vector<float> q(c.q_elems());
      append_on_host(q, k, v, qkv, c);
      expect_close("kv_cache_append q" + what, get(*be, Q), q, 0.0);
      expect_close("kv_cache_append key cache" + what, get(*be, K), k, 0.0);
      expect_close("kv_cache_append value cache" + what, get(*be, V), v, 0.0);
      Tensor O = be->empty({B, T, NH, HS}, MemCategory::kActivations, act());
      Tensor Oo = be->empty({B, T, NH, HS}, MemCategory::kActivations, other);
      be->attention_decode(O, Q, K, V, NH, KVH, c.pos0);
      be->attention_decode(Oo, Q, K, V, NH, KVH, c.pos0);
      std::vector<float> out(c.q_elems());
      kcpu::attention_decode<float>(out.data(), q.data(), k.data(), v.data(), B, T, S_max, NH, KVH,
                                    HS, c.pos0);
      expect_close("attention_decode out" + what, get(*be, O), out, tol(act(), act()));
      expect_close("attention_decode out (" + std::string(to_string(other)) + ")" + what,
                   get(*be, Oo), out, tol(other, act()));
      c.pos0 += T;
    }
    // An append into caches of the other type: rounded (or widened) where stored.
    c.T = 1;
    const auto qkv = host(c.qkv_elems(), ++key);
    Tensor Qkv = put(*be, {B, 1, c.width()}, qkv, act());
    Tensor Q = be->empty({B, 1, NH, HS}, MemCategory::kActivations, act());
    Tensor Ko = put(*be, {B, S_max, KVH, HS}, rounded(k, true), other);
    Tensor Vo = put(*be, {B, S_max, KVH, HS}, rounded(v, true), other);
    be->kv_cache_append(Q, Ko, Vo, Qkv, NH, KVH, c.pos0);
    std::vector<float> q(c.q_elems());
    k = rounded(k, true), v = rounded(v, true);
    append_on_host(q, k, v, qkv, c);  // qkv holds act() values: exact in f32, rounded in bf16
    expect_close("kv_cache_append q (caches " + std::string(to_string(other)) + ")", get(*be, Q), q,
                 0.0);
    expect_close("kv_cache_append key cache (" + std::string(to_string(other)) + ")", get(*be, Ko),
                 rounded(k, other == DType::kBF16), 0.0);
    expect_close("kv_cache_append value cache (" + std::string(to_string(other)) + ")",
                 get(*be, Vo), rounded(v, other == DType::kBF16), 0.0);
  }
}

INSTANTIATE_TEST_SUITE_P(Types, CudaBackendOps, ::testing::Values(DType::kF32, DType::kBF16),
                         [](const ::testing::TestParamInfo<DType>& param_info) {
                           return std::string(to_string(param_info.param));
                         });

// Type mixes without a native kernel go through MixedPrecisionScope (f32 temporaries).
TEST(CudaBackendMixed, UnusualTypeMixesAreWidened) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  auto be = make_backend("cuda", 1);
  const int N = 37, C = 45, OC = 29;
  const auto x = random(static_cast<size_t>(N) * C, 1500);  // f32
  const auto w = rounded(random(static_cast<size_t>(OC) * C, 1501), true);
  const auto b = random(OC, 1502);
  // f32 input with bf16 weights into a bf16 output: cuBLASLt needs one A/B type.
  Tensor X = put(*be, {N, C}, x, DType::kF32), W = put(*be, {OC, C}, w, DType::kBF16);
  Tensor Bi = put(*be, {OC}, b, DType::kF32);
  Tensor Y = be->empty({N, OC}, MemCategory::kActivations, DType::kBF16);
  be->matmul_forward(Y, X, W, &Bi);
  std::vector<float> y(static_cast<size_t>(N) * OC);
  kcpu::matmul_forward<float>(y.data(), x.data(), w.data(), b.data(), N, C, OC);
  expect_close("matmul f32 x bf16 -> bf16", get(*be, Y), y, kTolBf16);
  // A bf16 input into an f32 output, and LayerNorm statistics kept in bf16.
  const auto xb = rounded(x, true);
  Tensor Xb = put(*be, {N, C}, xb, DType::kBF16);
  Tensor Gf = be->empty({N, C}, MemCategory::kActivations, DType::kF32);
  be->gelu_forward(Gf, Xb);
  std::vector<float> gf(xb.size());
  kcpu::gelu_forward<float>(gf.data(), xb.data(), gf.size());
  expect_close("gelu bf16 -> f32", get(*be, Gf), gf, kTolF32);
  const auto lw = random(C, 1503), lb = random(C, 1504);
  Tensor LW = put(*be, {C}, lw, DType::kF32), LB = put(*be, {C}, lb, DType::kF32);
  Tensor Ln = be->empty({N, C}, MemCategory::kActivations, DType::kF32);
  Tensor Mean = be->empty({N}, MemCategory::kActivations, DType::kBF16);
  Tensor Rstd = be->empty({N}, MemCategory::kActivations, DType::kBF16);
  be->layernorm_forward(Ln, Mean, Rstd, Xb, LW, LB);
  std::vector<float> ln(xb.size()), mean(N), rstd(N);
  kcpu::layernorm_forward<float>(ln.data(), mean.data(), rstd.data(), xb.data(), lw.data(),
                                 lb.data(), N, C);
  expect_close("layernorm bf16 -> f32 out", get(*be, Ln), ln, kTolF32);
  expect_close("layernorm bf16 mean", get(*be, Mean), mean, kTolBf16);
}

}  // namespace
}  // namespace strata
