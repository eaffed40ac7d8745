// backend_cuda_gemm.cu — the CUDA backend's linear layers (backend_cuda.h): every GEMM on
// cuBLASLt (kernels/cuda/gemm_lt.h), compute type f32; the bias, the residual, dbias and GELU
// (bf16, tanh form) in cuBLASLt's epilogues where it has them, else a separate kernel; type
// mixes cuBLASLt cannot run are widened to f32.
#include "kernels/cuda/gemm_bias.h"
#include "runtime/backend/cuda/backend_cuda.h"

namespace strata::cuda_backend {

// ---- dense layers ----
// Row-major GEMMs of kernels/cuda/gemm_lt.h:
//   forward          out (N, OC)  = inp (N, C) · wᵀ            [+ bias epilogue]
//   backward input   dinp (N, C) += dout (N, OC) · w (OC, C)
//   backward weight  dw (OC, C)  += doutᵀ · inp (N, C)         [+ dbias: BGRADB epilogue]

void CudaBackend::matmul_forward(Tensor& out, const Tensor& inp, const Tensor& w,
                                 const Tensor* bias) {
  if (linear_dims(out, inp, w, bias).N == 0) return;
  if (!gemm_native(inp, w, out) || !run_forward_gemm(forward_gemm(out, inp, w), out, bias))
    matmul_forward_widened(out, inp, w, bias);
}

// The residual is cuBLASLt's C with beta 1 (out is its D): read once inside the GEMM.
void CudaBackend::matmul_residual_forward(Tensor& out, const Tensor& inp, const Tensor& w,
                                          const Tensor* bias, const Tensor& residual) {
  const int64_t N = linear_dims(out, inp, w, bias).N;
  expect_numel(residual, out.numel(), "matmul residual");
  if (N > 0 && gemm_native(inp, w, out) && same_dtype(out, residual)) {
    kc::Gemm g = forward_gemm(out, inp, w);
    g.beta = 1.f, g.C_in = residual.data();
    if (run_forward_gemm(g, out, bias)) return;
  }
  Backend::matmul_residual_forward(out, inp, w, bias, residual);
}

void CudaBackend::matmul_backward(Tensor* dinp, Tensor& dw, Tensor* dbias, const Tensor& dout,
                                  const Tensor& inp, const Tensor& w) {
  if (dinp) matmul_backward_input(*dinp, dout, w);
  matmul_backward_weight(dw, dbias, dout, inp);
}

void CudaBackend::matmul_backward_input(Tensor& dinp, const Tensor& dout, const Tensor& w) {
  if (linear_backward_input_dims(dinp, dout, w).N == 0) return;
  if (!gemm_native(dout, w, dinp)) return matmul_backward_input_widened(dinp, dout, w);
  if (run_gemm(backward_input_gemm(dinp, dout, w)) == GemmRun::kUnsupported)
    matmul_backward_input_widened(dinp, dout, w);
}

void CudaBackend::matmul_backward_weight(Tensor& dw, Tensor* dbias, const Tensor& dout,
                                         const Tensor& inp) {
  const auto [N, C, OC] = linear_backward_weight_dims(dw, dbias, dout, inp);
  if (N == 0) return;
  if (!gemm_native(dout, inp, dw)) return matmul_backward_weight_widened(dw, dbias, dout, inp);
  kc::Gemm g;
  g.trans_a = true;
  g.M = as_int(OC), g.N = as_int(C), g.K = as_int(N);
  g.A = dout.data(), g.lda = g.M;
  g.B = inp.data(), g.ldb = g.N;
  g.ab_type = et(dout);
  g.C = dw.data(), g.ldc = g.N, g.c_type = et(dw);
  g.beta = 1.f;
  // The BGRADB epilogue overwrites its vector (of dw's type), and dbias accumulates: it goes
  // to a temporary that is then added.
  Tensor db_tmp;
  if (dbias) {
    db_tmp = empty({OC}, MemCategory::kBuffers, dw.dtype());
    g.epilogue = kc::GemmEpilogue::kBiasGradA;
    g.bias_grad = db_tmp.data();
  }
  switch (run_gemm(g)) {
    case GemmRun::kUnsupported:
      return matmul_backward_weight_widened(dw, dbias, dout, inp);
    case GemmRun::kDone:
      if (dbias) add_inplace(*dbias, db_tmp);
      return;
    case GemmRun::kWithoutEpilogue:
      if (is_f32(*dbias)) {
        CUDA_CHECK(kc::bias_grad(dbias->f32(), dout.data(), et(dout), N, g.M, stream_));
      } else {
        Tensor acc = zeros({OC}, MemCategory::kBuffers);
        CUDA_CHECK(kc::bias_grad(acc.f32(), dout.data(), et(dout), N, g.M, stream_));
        add_inplace(*dbias, acc);
      }
      return;
  }
}

// ---- linear + GELU in one GEMM (cuBLASLt's GELU_AUX_BIAS and DGELU epilogues) ----
// Only in bf16, the training precision: fp32 is there to match the CPU to 1e-4, and
// cuBLASLt does not document how exactly its epilogue evaluates GELU, so fp32 keeps the
// separate kernels. Only the tanh form (GPT-2's): cuBLASLt's GELU is not the exact erf form
// BERT uses, which runs the GEMM and the GELU kernel. Where cuBLASLt has no such epilogue for
// the shape, the Backend default runs the two ops.

void CudaBackend::matmul_gelu_forward(Tensor& pre, Tensor& out, const Tensor& inp, const Tensor& w,
                                      const Tensor& bias, GeluKind kind) {
  const LinearDims d = linear_dims(pre, inp, w, &bias);  // pre: the GEMM's output
  expect_numel(out, d.N * d.OC, "gelu out");
  if (d.N > 0 && kind == GeluKind::kTanh && out.dtype() == DType::kBF16 &&
      all_same_dtype(out, inp, w, pre, bias)) {
    kc::Gemm g = forward_gemm(out, inp, w);
    g.epilogue = kc::GemmEpilogue::kGeluAuxBias;
    g.bias = bias.data(), g.bias_type = et(bias);
    g.aux = pre.data(), g.ld_aux = g.N;
    if (run_fused(g)) return;
  }
  Backend::matmul_gelu_forward(pre, out, inp, w, bias, kind);
}

void CudaBackend::matmul_backward_input_gelu(Tensor& dpre, const Tensor& dout, const Tensor& w,
                                             const Tensor& pre, GeluKind kind) {
  const LinearDims d = linear_backward_input_dims(dpre, dout, w);
  expect_numel(pre, d.N * d.C, "gelu pre-activation");
  if (d.N > 0 && kind == GeluKind::kTanh && dpre.dtype() == DType::kBF16 &&
      all_same_dtype(dpre, dout, w, pre)) {
    kc::Gemm g = backward_input_gemm(dpre, dout, w);
    g.epilogue = kc::GemmEpilogue::kDGelu;
    g.aux = pre.data(), g.ld_aux = g.N;
    if (run_fused(g)) return;
  }
  Backend::matmul_backward_input_gelu(dpre, dout, w, pre, kind);
}

// ---- grouped GEMMs over experts (cuBLAS's grouped GEMM) ----
// One cublasGemmGroupedBatchedEx call for every group with rows, where A, B and C are of one type
// (cuBLAS's rule; in bf16 runs the weight gradient is f32 from bf16 operands, and goes to the
// Backend default: a cuBLASLt GEMM per group). A toolkit without the grouped GEMM runs the
// default too. Groups are views of the operands, shapes checked as the default does.

void CudaBackend::grouped_matmul_forward(Tensor& out, const Tensor& inp, const Tensor& w,
                                         const std::vector<int64_t>& rows) {
  const GroupedDims d = grouped_matmul_dims(w, rows, inp, out, "grouped matmul weight",
                                            "grouped matmul inp", "grouped matmul out");
  if (all_same_dtype(out, inp, w)) {
    kc::GroupedGemm g;
    g.trans_b = true, g.ab_type = g.c_type = et(out);
    const size_t es = dtype_size(out.dtype());
    for (int64_t i = 0, r0 = 0; i < d.G; r0 += rows[i], ++i)
      if (rows[i] > 0)
        g.groups.push_back({as_int(rows[i]), as_int(d.O), as_int(d.I),
                            static_cast<const char*>(inp.data()) + r0 * d.I * es, as_int(d.I),
                            static_cast<const char*>(w.data()) + i * d.O * d.I * es, as_int(d.I),
                            static_cast<char*>(out.data()) + r0 * d.O * es, as_int(d.O)});
    if (g.groups.empty() || run_grouped(g)) return;
  }
  Backend::grouped_matmul_forward(out, inp, w, rows);
}

void CudaBackend::grouped_matmul_backward_input(Tensor& dinp, const Tensor& dout, const Tensor& w,
                                                const std::vector<int64_t>& rows) {
  const GroupedDims d = grouped_matmul_dims(w, rows, dinp, dout, "grouped matmul weight",
                                            "grouped matmul dinp", "grouped matmul dout");
  if (all_same_dtype(dinp, dout, w)) {
    kc::GroupedGemm g;
    g.ab_type = g.c_type = et(dinp);
    const size_t es = dtype_size(dinp.dtype());
    for (int64_t i = 0, r0 = 0; i < d.G; r0 += rows[i], ++i)
      if (rows[i] > 0)
        g.groups.push_back({as_int(rows[i]), as_int(d.I), as_int(d.O),
                            static_cast<const char*>(dout.data()) + r0 * d.O * es, as_int(d.O),
                            static_cast<const char*>(w.data()) + i * d.O * d.I * es, as_int(d.I),
                            static_cast<char*>(dinp.data()) + r0 * d.I * es, as_int(d.I)});
    if (g.groups.empty() || run_grouped(g)) return;
  }
  Backend::grouped_matmul_backward_input(dinp, dout, w, rows);
}

void CudaBackend::grouped_matmul_backward_weight(Tensor& dw, const Tensor& dout, const Tensor& inp,
                                                 const std::vector<int64_t>& rows) {
  const GroupedDims d = grouped_matmul_dims(dw, rows, inp, dout, "grouped matmul dweight",
                                            "grouped matmul inp", "grouped matmul dout");
  if (all_same_dtype(dw, dout, inp)) {
    kc::GroupedGemm g;
    g.trans_a = true, g.beta = 1.f, g.ab_type = g.c_type = et(dw);
    const size_t es = dtype_size(dw.dtype());
    for (int64_t i = 0, r0 = 0; i < d.G; r0 += rows[i], ++i)
      if (rows[i] > 0)
        g.groups.push_back({as_int(d.O), as_int(d.I), as_int(rows[i]),
                            static_cast<const char*>(dout.data()) + r0 * d.O * es, as_int(d.O),
                            static_cast<const char*>(inp.data()) + r0 * d.I * es, as_int(d.I),
                            static_cast<char*>(dw.data()) + i * d.O * d.I * es, as_int(d.I)});
    if (g.groups.empty() || run_grouped(g)) return;
  }
  Backend::grouped_matmul_backward_weight(dw, dout, inp, rows);
}

// Runs g: true when it ran, false when cuBLAS has no grouped GEMM for it (nothing ran: the
// caller takes the per-group default); any other status is fatal.
bool CudaBackend::run_grouped(const kc::GroupedGemm& g) {
  if (!grouped_) {
    grouped_ = std::make_unique<kc::GemmGrouped>();
    CUBLAS_CHECK(grouped_->status());
  }
  const cublasStatus_t st = grouped_->run(g, stream_);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED) return false;
  STRATA_CHECK(st == CUBLAS_STATUS_SUCCESS, "cuBLAS grouped GEMM ("
                                                << g.groups.size()
                                                << " groups) failed: " << cublasLtGetStatusName(st)
                                                << ": " << cublasLtGetStatusString(st));
  return true;
}

// ---- GEMM helpers ----

// Runs g. When cuBLASLt has no kernel for g's epilogue, runs it without (kWithoutEpilogue:
// the caller applies it); when it has none for g's types at all, runs nothing (kUnsupported:
// the caller widens the operands to f32). f32 GEMMs are always supported.
CudaBackend::GemmRun CudaBackend::run_gemm(kc::Gemm g) {
  cublasStatus_t st = gemm_->run(g, stream_);
  if (st == CUBLAS_STATUS_SUCCESS) return GemmRun::kDone;
  GemmRun plain = GemmRun::kUnsupported;
  if (st == CUBLAS_STATUS_NOT_SUPPORTED && g.epilogue != kc::GemmEpilogue::kNone) {
    g.epilogue = kc::GemmEpilogue::kNone;
    st = gemm_->run(g, stream_);
    plain = GemmRun::kWithoutEpilogue;
    if (st == CUBLAS_STATUS_SUCCESS) return plain;
  }
  const bool widenable = g.ab_type != kc::ElemType::kF32 || g.c_type != kc::ElemType::kF32;
  if (st == CUBLAS_STATUS_NOT_SUPPORTED && widenable) return GemmRun::kUnsupported;
  STRATA_CHECK(st == CUBLAS_STATUS_SUCCESS,
               "cuBLASLt GEMM (M " << g.M << ", N " << g.N << ", K " << g.K << ", A/B "
                                   << kc::to_string(g.ab_type) << ", C " << kc::to_string(g.c_type)
                                   << ") failed: " << cublasLtGetStatusName(st) << ": "
                                   << cublasLtGetStatusString(st));
  return plain;
}

// The GEMMs of a linear layer, shapes checked by the caller: out (N, OC) = inp (N, C) · wᵀ,
// and dinp (N, C) = dout (N, OC) · w with beta 0 (assigned, never read); no epilogue.
kc::Gemm CudaBackend::forward_gemm(const Tensor& out, const Tensor& inp, const Tensor& w) {
  kc::Gemm g;
  g.trans_b = true;
  g.M = as_int(rows(inp)), g.N = as_int(w.size(0)), g.K = as_int(inp.size(-1));
  g.A = inp.data(), g.lda = g.K;
  g.B = w.data(), g.ldb = g.K;
  g.ab_type = et(inp);
  g.C = out.data(), g.ldc = g.N, g.c_type = et(out);
  return g;
}

kc::Gemm CudaBackend::backward_input_gemm(const Tensor& dinp, const Tensor& dout, const Tensor& w) {
  kc::Gemm g;
  g.M = as_int(rows(dinp)), g.N = as_int(dinp.size(-1)), g.K = as_int(w.size(0));
  g.A = dout.data(), g.lda = g.K;
  g.B = w.data(), g.ldb = g.N;
  g.ab_type = et(dout);
  g.C = dinp.data(), g.ldc = g.N, g.c_type = et(dinp);
  return g;
}

// Runs a forward GEMM g (out its C) with the bias, if any, in its epilogue, or added by a
// separate kernel where cuBLASLt has no such epilogue. false: cuBLASLt cannot run g at all
// (nothing ran; the caller widens or takes the unfused ops).
bool CudaBackend::run_forward_gemm(kc::Gemm g, Tensor& out, const Tensor* bias) {
  if (bias) {
    g.epilogue = kc::GemmEpilogue::kBias;
    g.bias = bias->data();
    g.bias_type = et(*bias);
  }
  switch (run_gemm(g)) {
    case GemmRun::kUnsupported:
      return false;
    case GemmRun::kWithoutEpilogue:
      CUDA_CHECK(kc::add_bias(out.data(), et(out), bias->data(), et(*bias), g.M, g.N, stream_));
      return true;
    case GemmRun::kDone:
      break;
  }
  return true;
}

// Runs g, whose epilogue is the whole point: true when it ran, false when cuBLASLt has no
// kernel for it (nothing ran: the caller takes the unfused ops); any other status is fatal.
bool CudaBackend::run_fused(const kc::Gemm& g) {
  const cublasStatus_t st = gemm_->run(g, stream_);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED) return false;
  STRATA_CHECK(st == CUBLAS_STATUS_SUCCESS, "cuBLASLt GEMM with a GELU epilogue (M "
                                                << g.M << ", N " << g.N << ", K " << g.K
                                                << ") failed: " << cublasLtGetStatusName(st) << ": "
                                                << cublasLtGetStatusString(st));
  return true;
}

// The same ops on f32 copies of every bf16 operand: for type mixes cuBLASLt cannot run.
void CudaBackend::matmul_forward_widened(Tensor& out, const Tensor& inp, const Tensor& w,
                                         const Tensor* bias) {
  MixedPrecisionScope mp(*this);
  matmul_forward(mp.out(out), mp.in(inp), mp.in(w), mp.in(bias));
}

void CudaBackend::matmul_backward_input_widened(Tensor& dinp, const Tensor& dout, const Tensor& w) {
  MixedPrecisionScope mp(*this);
  matmul_backward_input(mp.out(dinp), mp.in(dout), mp.in(w));
}

void CudaBackend::matmul_backward_weight_widened(Tensor& dw, Tensor* dbias, const Tensor& dout,
                                                 const Tensor& inp) {
  MixedPrecisionScope mp(*this);
  matmul_backward_weight(mp.out(dw), mp.out(dbias), mp.in(dout), mp.in(inp));
}

}  // namespace strata::cuda_backend
