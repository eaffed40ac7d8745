// gemm_grouped.cc — GemmGrouped on cuBLAS (kernels/cuda/gemm_grouped.h).
#include "kernels/cuda/gemm_grouped.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <vector>

namespace strata::kernels::cuda {

GemmGrouped::GemmGrouped() {
  cublasHandle_t h = nullptr;
  status_ = cublasCreate(&h);
  handle_ = h;
}

GemmGrouped::~GemmGrouped() {
  if (pointers_) cudaFree(pointers_);
  if (handle_) cublasDestroy(static_cast<cublasHandle_t>(handle_));
}

cublasStatus_t GemmGrouped::run(const GroupedGemm& g, cudaStream_t stream) {
  const cublasStatus_t pre = precheck(g);
  if (pre != CUBLAS_STATUS_SUCCESS) return pre;
#if defined(CUBLAS_VERSION) && CUBLAS_VERSION >= 120500
  const size_t n = g.groups.size();
  if (n > capacity_) {
    if (pointers_) cudaFree(pointers_);
    pointers_ = nullptr, capacity_ = 0;
    if (cudaMalloc(reinterpret_cast<void**>(&pointers_), 3 * n * sizeof(void*)) != cudaSuccess)
      return CUBLAS_STATUS_ALLOC_FAILED;
    capacity_ = n;
  }
  // Cᵀ = op(B)ᵀ · op(A)ᵀ in cuBLAS's column-major terms: m = N, n = M, A and B swapped.
  std::vector<const void*> ptrs(3 * n);  // (3, n): cuBLAS's A (our B), its B (our A), C
  std::vector<int> m(n), nn(n), k(n), lda(n), ldb(n), ldc(n), one(n, 1);
  std::vector<float> alpha(n, 1.f), beta(n, g.beta);
  std::vector<cublasOperation_t> ta(n, g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N);
  std::vector<cublasOperation_t> tb(n, g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N);
  for (size_t i = 0; i < n; ++i) {
    const GroupedGemmProblem& p = g.groups[i];
    m[i] = p.N, nn[i] = p.M, k[i] = p.K;
    ptrs[i] = p.B, ptrs[n + i] = p.A, ptrs[2 * n + i] = p.C;
    lda[i] = p.ldb, ldb[i] = p.lda, ldc[i] = p.ldc;
  }
  // Pageable host memory: the copy has read ptrs when it returns, and runs in stream order.
  if (cudaMemcpyAsync(pointers_, ptrs.data(), 3 * n * sizeof(void*), cudaMemcpyHostToDevice,
                      stream) != cudaSuccess)
    return CUBLAS_STATUS_EXECUTION_FAILED;
  cublasHandle_t h = static_cast<cublasHandle_t>(handle_);
  cublasStatus_t st = cublasSetStream(h, stream);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  const cudaDataType_t ab = g.ab_type == ElemType::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
  const cudaDataType_t c = g.c_type == ElemType::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
  return cublasGemmGroupedBatchedEx(h, ta.data(), tb.data(), m.data(), nn.data(), k.data(),
                                    alpha.data(), const_cast<const void* const*>(pointers_), ab,
                                    lda.data(), const_cast<const void* const*>(pointers_ + n), ab,
                                    ldb.data(), beta.data(), pointers_ + 2 * n, c, ldc.data(),
                                    static_cast<int>(n), one.data(), CUBLAS_COMPUTE_32F);
#else
  (void)stream;
  return CUBLAS_STATUS_NOT_SUPPORTED;
#endif
}

}  // namespace strata::kernels::cuda
