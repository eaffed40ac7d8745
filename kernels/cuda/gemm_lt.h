// gemm_lt.h — row-major GEMMs on cuBLASLt, with fused bias / GELU / bias-gradient epilogues.
//
// GemmLt::run computes, on row-major buffers as kernels/cpu gemm does,
//     C (M, N) = alpha · op(A) · op(B) + beta · C,     op(X) = Xᵀ when trans_x,
// where A is (M, K) or, transposed, (K, M) with row stride lda (B likewise (K, N) / (N, K), ldb),
// so strided sub-matrices work directly. beta ≠ 0 accumulates into C in place, or, with C_in
// set, reads the beta term from C_in (same type and row stride as C) and writes C: out of place,
// as a residual add riding on a projection's GEMM does.
//
// Types: A and B share one element type (cuBLASLt's rule); C is f32 or bf16. Supported by
// cuBLASLt with compute type CUBLAS_COMPUTE_32F: A/B f32 with C f32 (true fp32, no TF32 — the
// fp32 path must match the CPU to 1e-4), and A/B bf16 with C bf16 or f32 (f32 accumulation). Any
// other combination, and any epilogue cuBLASLt's heuristic finds no algorithm for, returns
// CUBLAS_STATUS_NOT_SUPPORTED without running: the caller then widens operands or applies the
// epilogue separately. The result is cached per shape, so a rejected case costs one query.
//
// Epilogues (row-major terms):
//   kBias         C[i][j] = alpha·(op(A)·op(B))[i][j] + beta·C[i][j] + bias[j]   (bias: N)
//   kGeluAuxBias  pre = the kBias result, written to aux (M, N) with row stride ld_aux (a
//                 multiple of 8, cuBLASLt's rule); C = gelu(pre) (cuBLASLt's tanh form)
//   kDGelu        C[i][j] = gelu'(aux[i][j]) · (alpha·(op(A)·op(B)) + beta·C)[i][j], aux the
//                 pre-activation kGeluAuxBias saved (M, N), same ld_aux rule: the input
//                 gradient of the layer after a GELU, carried through the GELU in one pass
//   kBiasGradA    as kNone, and bias_grad[i] = Σ_k op(A)[i][k] (M), OVERWRITTEN (not
//                 accumulated) and of C's type — the dbias of a weight gradient dW = doutᵀ·x
//
// Row-major ↔ cuBLASLt: cuBLASLt is column-major, and a row-major (r, c) buffer is the
// column-major (c, r) one, so C = op(A)·op(B) runs as Cᵀ = op(B)ᵀ·op(A)ᵀ with the operands
// swapped: m = N, n = M, and the row-major column vector (bias over j) is cuBLASLt's per-row one.
//
// Workspace: the caller's device buffer (32 MiB is cuBLASLt's recommendation for Hopper), used
// by every call, so calls must be ordered (one stream, or synchronised streams).
//
// Thread-safety: one GemmLt per thread (the descriptor cache is not locked). Copy is deleted
// (it owns the cuBLASLt handle and descriptors).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>

#include "kernels/cuda/elem_type.h"

namespace strata::kernels::cuda {

enum class GemmEpilogue { kNone, kBias, kGeluAuxBias, kDGelu, kBiasGradA };

// Whether epilogue e reads or writes the aux matrix (and so needs aux and ld_aux).
inline bool uses_aux(GemmEpilogue e) {
  return e == GemmEpilogue::kGeluAuxBias || e == GemmEpilogue::kDGelu;
}
// Whether epilogue e adds a bias vector (and so needs bias and bias_type).
inline bool uses_bias(GemmEpilogue e) {
  return e == GemmEpilogue::kBias || e == GemmEpilogue::kGeluAuxBias;
}

struct Gemm {
  bool trans_a = false, trans_b = false;
  int M = 0, N = 0, K = 0;
  const void* A = nullptr;
  int lda = 0;
  const void* B = nullptr;
  int ldb = 0;
  ElemType ab_type = ElemType::kF32;  // A and B
  void* C = nullptr;
  int ldc = 0;
  ElemType c_type = ElemType::kF32;
  float alpha = 1.f, beta = 0.f;
  const void* C_in = nullptr;  // beta ≠ 0: the matrix beta scales (M, N) ldc of c_type; null: C

  GemmEpilogue epilogue = GemmEpilogue::kNone;
  const void* bias = nullptr;  // kBias, kGeluAuxBias: (N) of bias_type
  ElemType bias_type = ElemType::kF32;
  void* bias_grad = nullptr;  // kBiasGradA: (M) of c_type
  void* aux = nullptr;        // kGeluAuxBias (written), kDGelu (read): (M, N) of c_type, row
                              // stride ld_aux
  int ld_aux = 0;
};

// The matrix beta scales: C_in where given, else C itself.
inline const void* c_in(const Gemm& g) {
  return g.C_in ? g.C_in : g.C;
}

// The refusals GemmLt::run makes before any cuBLASLt call (both builds' run() start here):
// CUBLAS_STATUS_INVALID_VALUE for a malformed shape or stride, CUBLAS_STATUS_NOT_SUPPORTED for an
// aux row stride cuBLASLt cannot use, else CUBLAS_STATUS_SUCCESS.
inline cublasStatus_t precheck(const Gemm& g) {
  const bool shape_ok = g.M > 0 && g.N > 0 && g.K > 0 && g.lda >= (g.trans_a ? g.M : g.K) &&
                        g.ldb >= (g.trans_b ? g.K : g.N) && g.ldc >= g.N &&
                        (!uses_aux(g.epilogue) || g.ld_aux >= g.N);
  if (!shape_ok) return CUBLAS_STATUS_INVALID_VALUE;
  if (uses_aux(g.epilogue) && g.ld_aux % 8 != 0) return CUBLAS_STATUS_NOT_SUPPORTED;
  return CUBLAS_STATUS_SUCCESS;
}

class GemmLt {
 public:
  static constexpr size_t kDefaultWorkspaceBytes = size_t{32} << 20;

  // The handle is created here; check status() before the first run().
  GemmLt(void* workspace, size_t workspace_bytes);
  ~GemmLt();
  GemmLt(const GemmLt&) = delete;
  GemmLt& operator=(const GemmLt&) = delete;

  cublasStatus_t status() const { return status_; }

  // Runs `g` on `stream`. CUBLAS_STATUS_NOT_SUPPORTED: nothing ran (see the file comment);
  // CUBLAS_STATUS_INVALID_VALUE: a malformed shape; anything else comes from cuBLASLt.
  cublasStatus_t run(const Gemm& g, cudaStream_t stream);

 private:
  struct Plan;  // descriptors + chosen algorithm of one shape/type/alignment combination
  using Key = std::array<int64_t, 20>;
  static Key key_of(const Gemm& g);
  Plan* plan_for(const Gemm& g);

  cublasLtHandle_t handle_ = nullptr;
  cublasStatus_t status_ = CUBLAS_STATUS_NOT_INITIALIZED;
  void* workspace_;
  size_t workspace_bytes_;
  std::map<Key, Plan*> plans_;  // owned; a few dozen shapes per model
};

}  // namespace strata::kernels::cuda
