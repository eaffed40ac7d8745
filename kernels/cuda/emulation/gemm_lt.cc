// gemm_lt.cc (emulation) — GemmLt for the CUDA emulation build (STRATA_CUDA_EMULATION), which
// has no cuBLASLt: the same contract as kernels/cuda/gemm_lt.h, computed on the CPU, so that the
// CUDA backend's own code (its epilogue and widening fallbacks included) runs in CI without a
// GPU. Not a performance path.
//
// Device memory is host memory in this build, so every pointer of a Gemm is dereferenced
// directly, and the GEMM runs when run() is called, after the stream's earlier work (device.h
// before_launch): the result is complete when run() returns.
//
// Arithmetic, as cuBLASLt with CUBLAS_COMPUTE_32F: A and B widened to f32, the product
// accumulated in f32 (kernels/cpu gemm<float>, OpenBLAS), then alpha·AB + beta·C (old C read in
// C's type, and not at all when beta == 0, as cuBLAS documents), then the epilogue on the f32
// value, then one rounding to C's type at the store (bf16: nearest, ties to even).
//
// What is accepted mirrors kernels/cuda/gemm_lt.cc: the same precheck() (gemm_lt.h), then
// what the real code learns from cuBLASLt's heuristic, decided here by what cuBLASLt documents
// (see supported()).
//
// Thread-safety: run() touches only its arguments; one GemmLt per thread, as in the real one.
#include "kernels/cuda/gemm_lt.h"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/precision.h"
#include "kernels/cuda/emulation/device.h"

namespace strata::kernels::cuda {

namespace {

float load(const void* p, ElemType t, size_t i) {
  return t == ElemType::kBF16 ? cpu::bf16_to_f32(static_cast<const uint16_t*>(p)[i])
                              : static_cast<const float*>(p)[i];
}

void store(void* p, ElemType t, size_t i, float v) {
  if (t == ElemType::kBF16)
    static_cast<uint16_t*>(p)[i] = cpu::f32_to_bf16(v);
  else
    static_cast<float*>(p)[i] = v;
}

// A stored (rows, cols) matrix with row stride ld, as f32: the buffer itself when it is f32,
// else a packed (rows, cols) widened copy in `scratch`. Returns the pointer and sets *ld_out.
const float* as_f32(const void* p, ElemType t, int rows, int cols, int ld,
                    std::vector<float>& scratch, int* ld_out) {
  if (t == ElemType::kF32) {
    *ld_out = ld;
    return static_cast<const float*>(p);
  }
  scratch.resize(static_cast<size_t>(rows) * cols);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c)
      scratch[static_cast<size_t>(r) * cols + c] = load(p, t, static_cast<size_t>(r) * ld + c);
  *ld_out = cols;
  return scratch.data();
}

// cuBLASLt's tanh form of GELU, and its derivative.
constexpr float kGeluK = 0.7978845608028654f;  // √(2/π)
constexpr float kGeluC = 0.044715f;
float gelu(float x) {
  return 0.5f * x * (1.f + std::tanh(kGeluK * (x + kGeluC * x * x * x)));
}
// d/dx [x·σ(2u)], u = k(x + c·x³): σ + x·σ(1 − σ)·2k(1 + 3c·x²), with w·x multiplied in one
// factor at a time so that the tails stay finite (as kernels/cpu gelu_backward).
float gelu_grad(float x) {
  const float s = 1.f / (1.f + std::exp(-2.f * kGeluK * (x + kGeluC * x * x * x)));
  const float w = 2.f * kGeluK * s * (1.f - s);
  return s + w * x + 3.f * kGeluC * (((w * x) * x) * x);
}

// Whether cuBLASLt runs g's type/epilogue combination (gemm_lt.cc finds out from the heuristic,
// or from cublasLtMatmul refusing the epilogue, and returns NOT_SUPPORTED either way).
// Assumptions, from cuBLASLt's documentation:
//   - types: cublasLtMatmul's table for CUBLAS_COMPUTE_32F / scale CUDA_R_32F lists A/B 32F
//     with C 32F, and A/B 16BF with C 16BF or 32F; f32 A/B with a bf16 C is not listed;
//   - bias (kBias, kGeluAuxBias): CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE documents bias elements of
//     the output type for these types (the exceptions are IMMA and fp8), so another bias type
//     is refused; the bias gradient of kBiasGradA is of C's type by the contract;
//   - the GELU aux matrix is of C's type (EPILOGUE_AUX_DATA_TYPE unset), written by
//     GELU_AUX_BIAS and read by DGELU;
//   - any transpose combination and any pointer alignment have an algorithm: gemm_lt.cc tells
//     the heuristic the real alignments, and the documentation names no epilogue that needs
//     particular transposes. A GPU may still decline some of these (the tests allow it).
bool supported(const Gemm& g) {
  if (g.ab_type == ElemType::kF32 && g.c_type != ElemType::kF32) return false;
  return !uses_bias(g.epilogue) || g.bias_type == g.c_type;
}

}  // namespace

GemmLt::GemmLt(void* workspace, size_t workspace_bytes)
    : workspace_(workspace), workspace_bytes_(workspace_bytes) {
  status_ = CUBLAS_STATUS_SUCCESS;  // nothing to create: no handle, and plans_ stays empty
}

GemmLt::~GemmLt() = default;

cublasStatus_t GemmLt::run(const Gemm& g, cudaStream_t stream) {
  if (status_ != CUBLAS_STATUS_SUCCESS) return status_;
  if (const cublasStatus_t st = precheck(g); st != CUBLAS_STATUS_SUCCESS) return st;
  if (!supported(g)) return CUBLAS_STATUS_NOT_SUPPORTED;
  strata::cuda_emulation::before_launch(stream);  // after the stream's earlier work
  // Only here: on a GPU a missing buffer faults in the kernel; on the CPU it would crash this
  // process, so it is refused as a malformed call instead.
  const bool pointers_ok = g.A && g.B && g.C && (!uses_bias(g.epilogue) || g.bias) &&
                           (!uses_aux(g.epilogue) || g.aux) &&
                           (g.epilogue != GemmEpilogue::kBiasGradA || g.bias_grad);
  if (!pointers_ok) return CUBLAS_STATUS_INVALID_VALUE;

  const int M = g.M, N = g.N, K = g.K;
  // op(A) is (M, K): stored (M, K), or (K, M) when transposed; op(B) is (K, N) likewise.
  std::vector<float> a_scratch, b_scratch;
  int lda = 0, ldb = 0;
  const float* A = g.trans_a ? as_f32(g.A, g.ab_type, K, M, g.lda, a_scratch, &lda)
                             : as_f32(g.A, g.ab_type, M, K, g.lda, a_scratch, &lda);
  const float* B = g.trans_b ? as_f32(g.B, g.ab_type, N, K, g.ldb, b_scratch, &ldb)
                             : as_f32(g.B, g.ab_type, K, N, g.ldb, b_scratch, &ldb);

  // acc (M, N) = alpha · op(A) · op(B) in f32; C joins below so that beta == 0 never reads it.
  std::vector<float> acc(static_cast<size_t>(M) * N);
  cpu::gemm<float>(g.trans_a, g.trans_b, M, N, K, g.alpha, A, lda, B, ldb, 0.f, acc.data(), N);

  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      const size_t c_at = static_cast<size_t>(i) * g.ldc + j;
      float v = acc[static_cast<size_t>(i) * N + j];
      if (g.beta != 0.f) v += g.beta * load(c_in(g), g.c_type, c_at);
      switch (g.epilogue) {
        case GemmEpilogue::kBias:
          v += load(g.bias, g.bias_type, j);
          break;
        case GemmEpilogue::kGeluAuxBias:
          v += load(g.bias, g.bias_type, j);
          store(g.aux, g.c_type, static_cast<size_t>(i) * g.ld_aux + j, v);  // pre-activation
          v = gelu(v);
          break;
        case GemmEpilogue::kDGelu:
          v *= gelu_grad(load(g.aux, g.c_type, static_cast<size_t>(i) * g.ld_aux + j));
          break;
        case GemmEpilogue::kNone:
        case GemmEpilogue::kBiasGradA:
          break;
      }
      store(g.C, g.c_type, c_at, v);
    }

  if (g.epilogue == GemmEpilogue::kBiasGradA) {
    // bias_grad (M) = Σ_k op(A)[i][k], accumulated in f32 and overwritten, of C's type.
    for (int i = 0; i < M; ++i) {
      float s = 0.f;
      for (int k = 0; k < K; ++k)
        s += g.trans_a ? A[static_cast<size_t>(k) * lda + i] : A[static_cast<size_t>(i) * lda + k];
      store(g.bias_grad, g.c_type, i, s);
    }
  }
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace strata::kernels::cuda
