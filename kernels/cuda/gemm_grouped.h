// gemm_grouped.h — row-major grouped GEMMs on cuBLAS's cublasGemmGroupedBatchedEx: one call for
// a list of independent GEMMs of different sizes (a mixture-of-experts layer's experts, each on
// its own rows).
//
// GemmGrouped::run computes, for every group g, on row-major buffers as GemmLt does,
//     C_g (M_g, N_g) = op(A_g) · op(B_g) + beta · C_g,     op(X) = Xᵀ when trans_x,
// with A_g (M_g, K_g) or, transposed, (K_g, M_g), row stride lda_g (B_g likewise (K_g, N_g) /
// (N_g, K_g), ldb_g). The transposes, the types and beta are shared by the groups. Compute type
// f32 (true fp32 for f32 operands: no TF32), as GemmLt's.
//
// Supported (cuBLAS's table for cublasGemmGroupedBatchedEx with CUBLAS_COMPUTE_32F): A, B and C
// all f32 or all bf16. Anything else, a toolkit older than cuBLAS 12.5 (which has no grouped
// GEMM) and the emulation build's stand-in for a malformed list return
// CUBLAS_STATUS_NOT_SUPPORTED or _INVALID_VALUE without running: the caller then runs a GEMM per
// group. Every group must have M, N, K > 0 (the caller leaves empty groups out).
//
// Row-major ↔ cuBLAS: as GemmLt, C = op(A)·op(B) runs as Cᵀ = op(B)ᵀ·op(A)ᵀ, operands swapped.
// cuBLAS reads the groups' matrix pointers from device memory: run() copies them to a device
// buffer it owns, ordered on the stream, so calls must be ordered (one stream).
//
// Thread-safety: one GemmGrouped per thread. Copy is deleted (it owns the cuBLAS handle).
#pragma once

#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

#include "kernels/cuda/elem_type.h"

namespace strata::kernels::cuda {

struct GroupedGemmProblem {
  int M = 0, N = 0, K = 0;
  const void* A = nullptr;
  int lda = 0;
  const void* B = nullptr;
  int ldb = 0;
  void* C = nullptr;
  int ldc = 0;
};

struct GroupedGemm {
  bool trans_a = false, trans_b = false;
  ElemType ab_type = ElemType::kF32;  // A and B
  ElemType c_type = ElemType::kF32;
  float beta = 0.f;
  std::vector<GroupedGemmProblem> groups;
};

// The refusals both builds' run() make first: CUBLAS_STATUS_NOT_SUPPORTED for types cuBLAS's
// grouped GEMM does not take, CUBLAS_STATUS_INVALID_VALUE for an empty list or a malformed
// shape or stride, else CUBLAS_STATUS_SUCCESS.
inline cublasStatus_t precheck(const GroupedGemm& g) {
  if (g.ab_type != g.c_type) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (g.groups.empty()) return CUBLAS_STATUS_INVALID_VALUE;
  for (const GroupedGemmProblem& p : g.groups) {
    const bool ok = p.M > 0 && p.N > 0 && p.K > 0 && p.lda >= (g.trans_a ? p.M : p.K) &&
                    p.ldb >= (g.trans_b ? p.K : p.N) && p.ldc >= p.N;
    if (!ok) return CUBLAS_STATUS_INVALID_VALUE;
  }
  return CUBLAS_STATUS_SUCCESS;
}

class GemmGrouped {
 public:
  // The handle is created here; check status() before the first run().
  GemmGrouped();
  ~GemmGrouped();
  GemmGrouped(const GemmGrouped&) = delete;
  GemmGrouped& operator=(const GemmGrouped&) = delete;

  cublasStatus_t status() const { return status_; }

  // Runs every group of g on `stream` (see the file comment for what returns without running).
  cublasStatus_t run(const GroupedGemm& g, cudaStream_t stream);

 private:
  void* handle_ = nullptr;  // cublasHandle_t (null in the emulation build)
  cublasStatus_t status_ = CUBLAS_STATUS_NOT_INITIALIZED;
  void** pointers_ = nullptr;  // device (3, capacity): the groups' A, B, C for cuBLAS
  size_t capacity_ = 0;
};

}  // namespace strata::kernels::cuda
