// gemm_grouped.cc (emulation) — GemmGrouped for the CUDA emulation build, which has no cuBLAS:
// the same row-major contract as kernels/cuda/gemm_grouped.h, each group computed on the CPU
// (A and B widened to f32, kernels/cpu gemm<float>, then beta·C, one rounding to C's type), so
// that the CUDA backend's grouped path runs in CI without a GPU. It holds the backend's use of the
// row-major contract, not the real file's mapping onto cuBLAS's column-major call, which only a
// GPU checks. Not a performance path.
//
// Device memory is host memory in this build: the pointers are dereferenced directly, after the
// stream's earlier work (device.h before_launch).
#include "kernels/cuda/gemm_grouped.h"

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/precision.h"
#include "kernels/cuda/emulation/device.h"

namespace strata::kernels::cuda {

namespace {

// The stored (rows, cols) matrix with row stride ld, widened and packed.
std::vector<float> packed_f32(const void* p, ElemType t, int rows, int cols, int ld) {
  std::vector<float> v(static_cast<size_t>(rows) * cols);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      const size_t i = static_cast<size_t>(r) * ld + c;
      v[static_cast<size_t>(r) * cols + c] =
          t == ElemType::kBF16 ? cpu::bf16_to_f32(static_cast<const uint16_t*>(p)[i])
                               : static_cast<const float*>(p)[i];
    }
  return v;
}

}  // namespace

GemmGrouped::GemmGrouped() : status_(CUBLAS_STATUS_SUCCESS) {}
GemmGrouped::~GemmGrouped() = default;

cublasStatus_t GemmGrouped::run(const GroupedGemm& g, cudaStream_t stream) {
  const cublasStatus_t pre = precheck(g);
  if (pre != CUBLAS_STATUS_SUCCESS) return pre;
  cuda_emulation::before_launch(stream);
  for (const GroupedGemmProblem& p : g.groups) {
    const int ar = g.trans_a ? p.K : p.M, ac = g.trans_a ? p.M : p.K;
    const int br = g.trans_b ? p.N : p.K, bc = g.trans_b ? p.K : p.N;
    const std::vector<float> a = packed_f32(p.A, g.ab_type, ar, ac, p.lda);
    const std::vector<float> b = packed_f32(p.B, g.ab_type, br, bc, p.ldb);
    std::vector<float> c(static_cast<size_t>(p.M) * p.N, 0.f);
    cpu::gemm<float>(g.trans_a, g.trans_b, p.M, p.N, p.K, 1.f, a.data(), ac, b.data(), bc, 0.f,
                     c.data(), p.N);
    for (int r = 0; r < p.M; ++r)
      for (int col = 0; col < p.N; ++col) {
        const size_t i = static_cast<size_t>(r) * p.ldc + col;
        float v = c[static_cast<size_t>(r) * p.N + col];
        if (g.c_type == ElemType::kBF16) {
          uint16_t* out = static_cast<uint16_t*>(p.C);
          if (g.beta != 0.f) v += g.beta * cpu::bf16_to_f32(out[i]);
          out[i] = cpu::f32_to_bf16(v);
        } else {
          float* out = static_cast<float*>(p.C);
          if (g.beta != 0.f) v += g.beta * out[i];
          out[i] = v;
        }
      }
  }
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace strata::kernels::cuda
