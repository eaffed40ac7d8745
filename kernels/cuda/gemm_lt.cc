// gemm_lt.cc — GemmLt: cuBLASLt descriptors, heuristic and matmul for gemm_lt.h.
//
// A Plan is built once per key (shape, types, epilogue, beta ≠ 0 and the pointers' alignments:
// cuBLASLt assumes 256-byte-aligned buffers unless told otherwise, and views into a larger
// tensor are often less aligned, so the real alignment is both told to the heuristic and part
// of the key). Only the pointers change between runs of one plan; the bias / aux pointers live
// in the matmul descriptor and are set again on each run.
#include "kernels/cuda/gemm_lt.h"

#include <cstdint>

namespace strata::kernels::cuda {

namespace {

cudaDataType_t data_type(ElemType t) {
  return t == ElemType::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
}

// Largest power of two ≤ 256 that divides the address (256 for null: not dereferenced).
uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al != 0) al /= 2;
  return al;
}

cublasLtEpilogue_t lt_epilogue(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::kBias:
      return CUBLASLT_EPILOGUE_BIAS;
    case GemmEpilogue::kGeluAuxBias:
      return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case GemmEpilogue::kDGelu:
      return CUBLASLT_EPILOGUE_DGELU;
    case GemmEpilogue::kBiasGradA:
      // Our A is cuBLASLt's B (see the header), and the reduction runs over K.
      return CUBLASLT_EPILOGUE_BGRADB;
    case GemmEpilogue::kNone:
      break;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

// The vector the epilogue reads or writes through CUBLASLT_MATMUL_DESC_BIAS_POINTER.
const void* epilogue_vector(const Gemm& g) {
  return g.epilogue == GemmEpilogue::kBiasGradA ? g.bias_grad : g.bias;
}

#define STRATA_LT_TRY(expr)                       \
  do {                                            \
    const cublasStatus_t strata_lt_rc_ = (expr);  \
    if (strata_lt_rc_ != CUBLAS_STATUS_SUCCESS) { \
      return strata_lt_rc_;                       \
    }                                             \
  } while (0)

template <class V>
cublasStatus_t set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, V v) {
  return cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof v);
}
template <class V>
cublasStatus_t set_pref(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr,
                        V v) {
  return cublasLtMatmulPreferenceSetAttribute(p, attr, &v, sizeof v);
}

// The per-run pointers of the epilogue.
cublasStatus_t set_epilogue_pointers(cublasLtMatmulDesc_t desc, const Gemm& g) {
  if (uses_bias(g.epilogue) || g.epilogue == GemmEpilogue::kBiasGradA)
    STRATA_LT_TRY(set_desc(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, epilogue_vector(g)));
  if (uses_aux(g.epilogue))
    STRATA_LT_TRY(set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g.aux));
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

struct GemmLt::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // cuBLASLt's A, B, C (= D)
  cublasLtMatmulAlgo_t algo{};
  bool supported = false;

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }

  // Descriptors for g (in cuBLASLt's column-major terms) and the heuristic's first choice;
  // `supported` stays false when cuBLASLt offers no algorithm.
  cublasStatus_t build(const Gemm& g, cublasLtHandle_t handle, size_t workspace_bytes) {
    STRATA_LT_TRY(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t op_a = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // on our B
    const cublasOperation_t op_b = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // on our A
    STRATA_LT_TRY(set_desc(desc, CUBLASLT_MATMUL_DESC_TRANSA, op_a));
    STRATA_LT_TRY(set_desc(desc, CUBLASLT_MATMUL_DESC_TRANSB, op_b));
    if (g.epilogue != GemmEpilogue::kNone) {
      STRATA_LT_TRY(set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, lt_epilogue(g.epilogue)));
      if (uses_bias(g.epilogue))  // a bias gradient is of C's type
        STRATA_LT_TRY(set_desc(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                               static_cast<int32_t>(data_type(g.bias_type))));
      if (uses_aux(g.epilogue))
        STRATA_LT_TRY(
            set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, static_cast<int64_t>(g.ld_aux)));
      STRATA_LT_TRY(set_epilogue_pointers(desc, g));
    }
    // cuBLASLt's A is our B: column-major (N, K), or (K, N) when transposed.
    const cudaDataType_t ab = data_type(g.ab_type);
    STRATA_LT_TRY(
        cublasLtMatrixLayoutCreate(&a, ab, g.trans_b ? g.K : g.N, g.trans_b ? g.N : g.K, g.ldb));
    // cuBLASLt's B is our A: column-major (K, M), or (M, K) when transposed.
    STRATA_LT_TRY(
        cublasLtMatrixLayoutCreate(&b, ab, g.trans_a ? g.M : g.K, g.trans_a ? g.K : g.M, g.lda));
    STRATA_LT_TRY(cublasLtMatrixLayoutCreate(&c, data_type(g.c_type), g.N, g.M, g.ldc));

    cublasLtMatmulPreference_t pref = nullptr;
    STRATA_LT_TRY(cublasLtMatmulPreferenceCreate(&pref));
    cublasStatus_t st = set_pref(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                 static_cast<uint64_t>(workspace_bytes));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment(g.B));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment(g.A));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment(c_in(g)));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment(g.C));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    if (st == CUBLAS_STATUS_SUCCESS) {
      // A combination cuBLASLt cannot do shows up here as an error status or as no result,
      // depending on the version: both mean "not supported".
      const cublasStatus_t h =
          cublasLtMatmulAlgoGetHeuristic(handle, desc, a, b, c, c, pref, 1, &result, &found);
      supported = h == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS;
      if (supported) algo = result.algo;
    }
    cublasLtMatmulPreferenceDestroy(pref);
    return st;
  }
};

GemmLt::GemmLt(void* workspace, size_t workspace_bytes)
    : workspace_(workspace), workspace_bytes_(workspace_bytes) {
  status_ = cublasLtCreate(&handle_);
}

GemmLt::~GemmLt() {
  for (auto& [key, plan] : plans_) delete plan;
  if (handle_) cublasLtDestroy(handle_);
}

GemmLt::Key GemmLt::key_of(const Gemm& g) {
  return {g.trans_a,
          g.trans_b,
          g.M,
          g.N,
          g.K,
          g.lda,
          g.ldb,
          g.ldc,
          static_cast<int64_t>(g.ab_type),
          static_cast<int64_t>(g.c_type),
          static_cast<int64_t>(g.epilogue),
          static_cast<int64_t>(g.bias_type),
          g.ld_aux,
          g.beta != 0.f,
          alignment(g.A),
          alignment(g.B),
          alignment(g.C),
          alignment(epilogue_vector(g)),
          alignment(g.aux),
          alignment(c_in(g))};
}

GemmLt::Plan* GemmLt::plan_for(const Gemm& g) {
  const Key key = key_of(g);
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;
  auto* plan = new Plan;
  if (plan->build(g, handle_, workspace_bytes_) != CUBLAS_STATUS_SUCCESS) plan->supported = false;
  plans_.emplace(key, plan);
  return plan;
}

cublasStatus_t GemmLt::run(const Gemm& g, cudaStream_t stream) {
  if (status_ != CUBLAS_STATUS_SUCCESS) return status_;
  if (const cublasStatus_t st = precheck(g); st != CUBLAS_STATUS_SUCCESS) return st;
  Plan* plan = plan_for(g);
  if (!plan->supported) return CUBLAS_STATUS_NOT_SUPPORTED;
  STRATA_LT_TRY(set_epilogue_pointers(plan->desc, g));
  // cuBLASLt's A is our B and vice versa; its C is what beta scales (ours, or C_in), D ours.
  const cublasStatus_t st =
      cublasLtMatmul(handle_, plan->desc, &g.alpha, g.B, plan->a, g.A, plan->b, &g.beta, c_in(g),
                     plan->c, g.C, plan->c, &plan->algo, workspace_, workspace_bytes_, stream);
  // Some epilogue/type combinations pass the heuristic and are refused only here (the header
  // documents INVALID_VALUE for an unsupported bias or aux type). The shape was checked above,
  // so such a refusal is the epilogue's: remember it, and let the caller apply it separately.
  if (g.epilogue != GemmEpilogue::kNone &&
      (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE)) {
    plan->supported = false;
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  return st;
}

#undef STRATA_LT_TRY

}  // namespace strata::kernels::cuda
