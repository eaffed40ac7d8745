// cudnn_attention.cc — CudnnAttention (cudnn_attention.h): the operation graphs of flash
// attention (causal, or bidirectional with a key padding mask) written with the cuDNN backend API
// (cudnn_graph.h), the choice of their engine, and their execution.
//
// The graphs are the decomposition that cuDNN's fused flash-attention engines recognise — the
// one the cuDNN frontend's composite SDPA nodes expand into (learned from NVIDIA/cudnn-frontend,
// include/cudnn_frontend/node/scaled_dot_product_flash_attention.h, softmax.h and
// sdpa_support_surface.h). Shapes: b = B, h = NH, hk = KVH, s = S, d = HS; a score matrix is
// (b, h, s, s) and a row statistic (b, h, s, 1). K and V are (b, hk, s, d): the matmuls
// broadcast each key/value head over its h / hk query heads (grouped-query attention). Tensors
// marked virtual are never stored; they are f32 unless a bf16 type is named.
//
// Forward:
//   S0  = matmul(Q, Kᵀ)                 Q (b,h,s,d) and Kᵀ (b,h,d,s): strided views of qkv
//   S1  = S0 · scale                     scale = 1/√d, a by-value scalar
//   S2  = mask(S1)                       padded: keep[i][j] = row i < seq_q[b] and
//                                        col j < seq_kv[b] (gen_index on axes 2 and 3, cmp_lt
//                                        against (b,1,1,1) int32 tensors, logical_and),
//                                        binary_select(S1, mask value, keep), as the frontend's
//                                        padding mask; then causal: keep[i][j] = row i ≥ col j
//                                        (cmp_ge), the same select; neither for a bidirectional
//                                        unpadded graph
//   M   = max_j S2                       reduction
//   E   = exp(S2 − M);  Z = Σ_j E        pointwise sub + exp, reduction add
//   lse = M + log Z                      cuDNN's "stats" output, (b,h,s,1) f32 = our lse
//   P   = E / Z                          bf16: the second matmul takes it in the i/o type
//   O   = matmul(P, V)                   O (b,h,s,d) in the (B, S, NH, HS) layout
// Backward (P is recomputed from lse, never stored):
//   Dsum = (Σ_d dO ∘ O) · 1              the row sums dO·O (pointwise mul, reduction add)
//   P    = exp(mask(S0 · scale) − lse)   the mask before or after the subtraction (Style)
//   dV   = matmul(Pᵀ, dO)                Pᵀ: a reshape of P into a bf16 transposed view
//   dP   = matmul(dO, Vᵀ)
//   dS   = (dP − Dsum) ∘ P · scale
//   dK   = matmul(dSᵀ, Q)                dSᵀ: a bf16 transposed view, as Pᵀ
//   dQa  = matmul(dS, K)                 K: a reshape of Kᵀ; dQa is an f32 accumulator in the
//                                        workspace, zeroed before every run
//   dQ   = identity(dQa)                 the bf16 store
// With hk < h (grouped-query attention) dV and dK are first formed per query head, as virtual
// bf16 (b, h, s, d) tensors, and summed over each group by a reduction into the (b, hk, s, d)
// outputs, as the frontend's SDPA backward does (its dV_fullhead / dK_fullhead).
// dQ, dK and dV are written through the strides of the (B, S, NH + 2·KVH, HS) dqkv buffer.
//
// Style: the frontend has spelled these graphs two ways over cuDNN 9's life, and an engine is
// only found for a spelling cuDNN's pattern matcher knows, so both are tried, in this order:
//   kCurrent  mask indices generated in f32; backward: Dsum a workspace tensor, the causal mask
//             applied after subtracting lse, a plain f32 dQ accumulator (today's frontend, for
//             cuDNN up to 9.20).
//   kCudnn90  mask indices generated in int32; backward: Dsum virtual, the mask applied before
//             the subtraction, dP multiplied by a unit dropout scale, the dQ accumulator
//             F16x16-reordered (the frontend of the cuDNN 9.0-9.2 days).
// The mask value is the lowest float before cuDNN 9.10 and −inf from 9.10 on, as the frontend
// picks it.
//
// Every descriptor a plan uses (tensors, operations, the graph, the heuristics' engine
// configurations, the execution plan) is owned by the plan and destroyed in reverse order of
// creation; a variant pack lives for one call.
#include "kernels/cuda/cudnn_attention.h"

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

namespace strata::kernels::cuda {

namespace {

// Tensor uids: the stored and by-value tensors; virtual ones count up from kFirstVirtual.
namespace uid {
constexpr int64_t kQ = 1, kK = 2, kV = 3, kO = 4, kStats = 5, kDO = 6, kDQ = 7, kDK = 8, kDV = 9;
constexpr int64_t kScale = 10, kMaskValue = 11, kOne = 12, kDsum = 13, kDqAccum = 14;
constexpr int64_t kSeqQ = 15, kSeqKv = 16;
constexpr int64_t kFirstVirtual = 100;
}  // namespace uid

enum class Style { kCurrent, kCudnn90 };
const char* to_string(Style s) {
  return s == Style::kCurrent ? "current" : "cuDNN 9.0-era";
}

constexpr int64_t kTensorAlignment = 16;  // bytes, promised for every stored tensor
constexpr size_t kWorkspaceAlignment = 256;

size_t align_up(size_t n, size_t a) {
  return (n + a - 1) / a * a;
}

bool aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % kTensorAlignment == 0;
}

// "9.19.0" from cudnnGetVersion()'s 91900 (cuDNN 8 encoded 8.9.7 as 8907).
std::string version_text(size_t v) {
  const size_t major = v >= 10000 ? v / 10000 : v / 1000;
  const size_t minor = v >= 10000 ? v % 10000 / 100 : v % 1000 / 100;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(v % 100);
}

// The status's name and cuDNN's last error message for this thread, on one line.
std::string status_text(cudnnStatus_t st) {
  std::string text = cudnnGetErrorString(st);
  char last[512] = {};
  cudnnGetLastErrorString(last, sizeof last);
  std::string detail(last);
  for (char& c : detail)
    if (c == '\n' || c == '\r') c = ' ';
  if (detail.size() > 300) detail = detail.substr(0, 300) + "...";
  if (!detail.empty()) text += " (" + detail + ")";
  return text;
}

// One backend descriptor, destroyed with its owner.
class Desc {
 public:
  Desc() = default;
  explicit Desc(cudnnBackendDescriptorType_t type) {
    status_ = cudnnBackendCreateDescriptor(type, &d_);
    if (status_ != CUDNN_STATUS_SUCCESS) d_ = nullptr;
  }
  ~Desc() {
    if (d_) cudnnBackendDestroyDescriptor(d_);
  }
  Desc(Desc&& o) noexcept : d_(std::exchange(o.d_, nullptr)), status_(o.status_) {}
  Desc& operator=(Desc&& o) noexcept {
    if (this != &o) {
      if (d_) cudnnBackendDestroyDescriptor(d_);
      d_ = std::exchange(o.d_, nullptr);
      status_ = o.status_;
    }
    return *this;
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;

  cudnnBackendDescriptor_t get() const { return d_; }
  cudnnStatus_t status() const { return status_; }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
  cudnnStatus_t status_ = CUDNN_STATUS_NOT_INITIALIZED;
};

// Descriptors that refer to one another (an operation to its tensors, a plan to its engine
// configuration), destroyed in reverse order of creation.
class DescList {
 public:
  DescList() = default;
  ~DescList() {
    while (!list_.empty()) list_.pop_back();
  }
  DescList(const DescList&) = delete;
  DescList& operator=(const DescList&) = delete;

  cudnnBackendDescriptor_t add(Desc d) {
    list_.push_back(std::move(d));
    return list_.back().get();
  }

 private:
  std::vector<Desc> list_;
};

using Dims = std::array<int64_t, 4>;

// Builds an operation graph step by step. The first failing call is remembered (its status and
// what it was doing) and every later call does nothing, so a graph reads as a list of
// operations and is checked once, at the end.
class GraphBuilder {
 public:
  explicit GraphBuilder(DescList& owned) : owned_(owned) {}

  bool ok() const { return status_ == CUDNN_STATUS_SUCCESS; }
  cudnnStatus_t status() const { return status_; }
  const std::string& failure() const { return failure_; }

  // A stored tensor with uid `uid` (or, with by_value, a host scalar passed at execution).
  cudnnBackendDescriptor_t tensor(
      int64_t uid, cudnnDataType_t type, const Dims& dims, const Dims& strides,
      bool by_value = false,
      cudnnBackendTensorReordering_t reorder = CUDNN_TENSOR_REORDERING_NONE) {
    return make_tensor(uid, type, dims, strides, false, by_value, reorder);
  }
  cudnnBackendDescriptor_t virt(cudnnDataType_t type, const Dims& dims, const Dims& strides) {
    return make_tensor(next_virtual_++, type, dims, strides, true, false,
                       CUDNN_TENSOR_REORDERING_NONE);
  }
  // A by-value f32 scalar, broadcast over every operand it meets.
  cudnnBackendDescriptor_t scalar(int64_t uid) {
    return tensor(uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, true);
  }

  // y = mode(x[, b[, t]]) computed in `prec`; axis is gen_index's.
  void pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t prec, cudnnBackendDescriptor_t x,
                 cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y,
                 int64_t axis = -1) {
    cudnnBackendDescriptor_t pw = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise descriptor");
    set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode");
    set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, "pointwise precision");
    if (axis >= 0) set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "pointwise axis");
    finalize(pw, "pointwise descriptor");
    cudnnBackendDescriptor_t op =
        make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "pointwise operation");
    set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw, "pointwise operation");
    set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x, "pointwise x");
    if (b) set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b, "pointwise b");
    if (t) set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t, "pointwise t");
    set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y, "pointwise y");
    add_op(op, "pointwise operation");
  }

  // y = reduce_op of x, in f32, over what y's dims leave out: the last axis for a row statistic
  // (…, 1), the groups of query heads for a grouped-query dK or dV ((b, h, s, d) -> (b, hk, s, d)).
  void reduction(cudnnReduceTensorOp_t reduce_op, cudnnBackendDescriptor_t x,
                 cudnnBackendDescriptor_t y) {
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t r = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "reduction descriptor");
    set(r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &reduce_op,
        "reduction operator");
    set(r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32, "reduction precision");
    finalize(r, "reduction descriptor");
    cudnnBackendDescriptor_t op =
        make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "reduction operation");
    set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, r, "reduction operation");
    set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x, "reduction x");
    set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y, "reduction y");
    add_op(op, "reduction operation");
  }

  // c = a · b over the last two axes (batched over the first two), accumulated in f32.
  void matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t m = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR, "matmul descriptor");
    set(m, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32, "matmul precision");
    finalize(m, "matmul descriptor");
    cudnnBackendDescriptor_t op =
        make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "matmul operation");
    set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, m, "matmul operation");
    set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a, "matmul a");
    set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b, "matmul b");
    set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c, "matmul c");
    add_op(op, "matmul operation");
  }

  // y = x seen through y's dimensions and strides (a transposed view).
  void reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t op =
        make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "reshape operation");
    set_desc(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x, "reshape x");
    set_desc(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y, "reshape y");
    add_op(op, "reshape operation");
  }

  // The finalized operation graph of every operation added, or null (see status()).
  cudnnBackendDescriptor_t graph(cudnnHandle_t handle) {
    cudnnBackendDescriptor_t g = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
    set(g, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
        static_cast<int64_t>(ops_.size()), ops_.data(), "operation graph operations");
    set(g, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle,
        "operation graph handle");
    finalize(g, "operation graph");
    return ok() ? g : nullptr;
  }

 private:
  cudnnBackendDescriptor_t make_tensor(int64_t uid, cudnnDataType_t type, const Dims& dims,
                                       const Dims& strides, bool is_virtual, bool by_value,
                                       cudnnBackendTensorReordering_t reorder) {
    cudnnBackendDescriptor_t t = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor");
    set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, "tensor type");
    set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data(), "tensor dimensions");
    set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data(), "tensor strides");
    set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor uid");
    set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &kTensorAlignment,
        "tensor alignment");
    set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual, "tensor virtual");
    if (by_value)
      set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value, "tensor by value");
    if (reorder != CUDNN_TENSOR_REORDERING_NONE)
      set(t, CUDNN_ATTR_TENSOR_REORDERING_MODE, CUDNN_TYPE_TENSOR_REORDERING_MODE, 1, &reorder,
          "tensor reordering");
    finalize(t, "tensor");
    return ok() ? t : nullptr;
  }

  cudnnBackendDescriptor_t make(cudnnBackendDescriptorType_t type, const char* what) {
    if (!ok()) return nullptr;
    Desc d(type);
    if (d.status() != CUDNN_STATUS_SUCCESS) {
      fail(d.status(), what, "create");
      return nullptr;
    }
    return owned_.add(std::move(d));
  }
  void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
           cudnnBackendAttributeType_t type, int64_t n, const void* values, const char* what) {
    if (ok()) fail(cudnnBackendSetAttribute(d, name, type, n, values), what, "set");
  }
  void set_desc(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                cudnnBackendDescriptor_t value, const char* what) {
    set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value, what);
  }
  void finalize(cudnnBackendDescriptor_t d, const char* what) {
    if (ok()) fail(cudnnBackendFinalize(d), what, "finalize");
  }
  void add_op(cudnnBackendDescriptor_t op, const char* what) {
    finalize(op, what);
    if (ok()) ops_.push_back(op);
  }
  void fail(cudnnStatus_t st, const char* what, const char* verb) {
    if (st == CUDNN_STATUS_SUCCESS || !ok()) return;
    status_ = st;
    failure_ = std::string(verb) + " " + what + " (op " + std::to_string(ops_.size() + 1) +
               "): " + status_text(st);
  }

  DescList& owned_;
  std::vector<cudnnBackendDescriptor_t> ops_;
  int64_t next_virtual_ = uid::kFirstVirtual;
  cudnnStatus_t status_ = CUDNN_STATUS_SUCCESS;
  std::string failure_;
};

// Dimensions and strides (elements) of the graph's tensors for one shape, and its mask.
struct Layout {
  int64_t B, S, NH, KVH, HS;
  bool causal = true;
  bool padded = false;  // a key padding mask (seq_len_q, seq_len_kv)

  int64_t token() const { return (NH + 2 * KVH) * HS; }  // token stride in qkv and dqkv
  // (b, h, s, d) views of Q (and dQ) inside qkv (B, S, NH + 2·KVH, HS).
  Dims qkv_dims() const { return {B, NH, S, HS}; }
  Dims qkv_strides() const { return {S * token(), HS, token(), 1}; }
  // (b, hk, s, d) views of K or V (and dK, dV).
  Dims kv_dims() const { return {B, KVH, S, HS}; }
  // (b, hk, d, s): Kᵀ or Vᵀ, the same memory with the last two axes swapped.
  Dims kv_t_dims() const { return {B, KVH, HS, S}; }
  Dims kv_t_strides() const { return {S * token(), HS, 1, token()}; }
  // O and dO (B, S, NH, HS) seen as (b, h, s, d).
  Dims out_strides() const { return {S * NH * HS, HS, NH * HS, 1}; }
  // The dQ accumulator, packed (b, h, s, d); also dK, dV per query head.
  Dims packed_strides() const { return {NH * S * HS, S * HS, HS, 1}; }
  // lse and the other row statistics, packed (b, h, s, 1) — lse (B, NH, S) exactly.
  Dims row_dims() const { return {B, NH, S, 1}; }
  Dims row_strides() const { return {NH * S, S, 1, 1}; }
  // Scores (b, h, s_q, s_kv) and their transposed view (b, h, s_kv, s_q).
  Dims score_dims() const { return {B, NH, S, S}; }
  Dims score_strides() const { return {NH * S * S, S * S, S, 1}; }
  Dims score_t_strides() const { return {NH * S * S, S * S, 1, S}; }
  // The per-sequence lengths of the padding mask, (b, 1, 1, 1).
  Dims seq_dims() const { return {B, 1, 1, 1}; }
  Dims seq_strides() const { return {1, 1, 1, 1}; }
};

// y = x where row ≥ col, else the mask value. The indices are int32, generated in f32
// (kCurrent) or int32 (kCudnn90), as each frontend did.
cudnnBackendDescriptor_t causal(GraphBuilder& g, const Layout& l, Style style,
                                cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t mask_value) {
  const Dims d = l.score_dims(), st = l.score_strides();
  const cudnnDataType_t index_prec = style == Style::kCurrent ? CUDNN_DATA_FLOAT : CUDNN_DATA_INT32;
  cudnnBackendDescriptor_t row = g.virt(CUDNN_DATA_INT32, d, st);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, index_prec, x, nullptr, nullptr, row, 2);
  cudnnBackendDescriptor_t col = g.virt(CUDNN_DATA_INT32, d, st);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, index_prec, x, nullptr, nullptr, col, 3);
  cudnnBackendDescriptor_t keep = g.virt(CUDNN_DATA_BOOLEAN, d, st);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, nullptr, keep);
  cudnnBackendDescriptor_t y = g.virt(CUDNN_DATA_FLOAT, d, st);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, x, mask_value, keep, y);
  return y;
}

// y = x where row < seq_q[b] and col < seq_kv[b], else the mask value: the frontend's padding
// mask (indices generated and compared in int32, the two comparisons joined by logical_and).
cudnnBackendDescriptor_t padding(GraphBuilder& g, const Layout& l, cudnnBackendDescriptor_t x,
                                 cudnnBackendDescriptor_t mask_value) {
  const Dims d = l.score_dims(), st = l.score_strides();
  const cudnnDataType_t i32 = CUDNN_DATA_INT32;
  cudnnBackendDescriptor_t seq_q = g.tensor(uid::kSeqQ, i32, l.seq_dims(), l.seq_strides());
  cudnnBackendDescriptor_t seq_kv = g.tensor(uid::kSeqKv, i32, l.seq_dims(), l.seq_strides());
  cudnnBackendDescriptor_t row = g.virt(i32, d, st);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, i32, x, nullptr, nullptr, row, 2);
  cudnnBackendDescriptor_t col = g.virt(i32, d, st);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, i32, x, nullptr, nullptr, col, 3);
  cudnnBackendDescriptor_t row_in = g.virt(i32, d, st);
  g.pointwise(CUDNN_POINTWISE_CMP_LT, i32, row, seq_q, nullptr, row_in);
  cudnnBackendDescriptor_t col_in = g.virt(i32, d, st);
  g.pointwise(CUDNN_POINTWISE_CMP_LT, i32, col, seq_kv, nullptr, col_in);
  cudnnBackendDescriptor_t keep = g.virt(CUDNN_DATA_BOOLEAN, d, st);
  g.pointwise(CUDNN_POINTWISE_LOGICAL_AND, CUDNN_DATA_BOOLEAN, row_in, col_in, nullptr, keep);
  cudnnBackendDescriptor_t y = g.virt(CUDNN_DATA_FLOAT, d, st);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, x, mask_value, keep, y);
  return y;
}

// The layout's mask on scores x: the padding mask, then the causal one, each where it applies.
cudnnBackendDescriptor_t apply_mask(GraphBuilder& g, const Layout& l, Style style,
                                    cudnnBackendDescriptor_t x,
                                    cudnnBackendDescriptor_t mask_value) {
  if (l.padded) x = padding(g, l, x, mask_value);
  return l.causal ? causal(g, l, style, x, mask_value) : x;
}

// A fresh f32 virtual tensor of the scores' shape = mode(a) or mode(a, b), b broadcast.
cudnnBackendDescriptor_t score_op(GraphBuilder& g, const Layout& l, cudnnPointwiseMode_t mode,
                                  cudnnBackendDescriptor_t a,
                                  cudnnBackendDescriptor_t b = nullptr) {
  cudnnBackendDescriptor_t y = g.virt(CUDNN_DATA_FLOAT, l.score_dims(), l.score_strides());
  g.pointwise(mode, CUDNN_DATA_FLOAT, a, b, nullptr, y);
  return y;
}

// S1 = (Q·Kᵀ) · scale, the scaled scores both directions start from.
cudnnBackendDescriptor_t scaled_scores(GraphBuilder& g, const Layout& l, cudnnBackendDescriptor_t q,
                                       cudnnBackendDescriptor_t kt,
                                       cudnnBackendDescriptor_t scale) {
  cudnnBackendDescriptor_t s0 = g.virt(CUDNN_DATA_FLOAT, l.score_dims(), l.score_strides());
  g.matmul(q, kt, s0);
  return score_op(g, l, CUDNN_POINTWISE_MUL, s0, scale);
}

void build_forward(GraphBuilder& g, const Layout& l, Style style) {
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT, bf16 = CUDNN_DATA_BFLOAT16;
  const Dims sd = l.score_dims(), ss = l.score_strides();
  const Dims rd = l.row_dims(), rs = l.row_strides();
  cudnnBackendDescriptor_t q = g.tensor(uid::kQ, bf16, l.qkv_dims(), l.qkv_strides());
  cudnnBackendDescriptor_t kt = g.tensor(uid::kK, bf16, l.kv_t_dims(), l.kv_t_strides());
  cudnnBackendDescriptor_t v = g.tensor(uid::kV, bf16, l.kv_dims(), l.qkv_strides());
  cudnnBackendDescriptor_t o = g.tensor(uid::kO, bf16, l.qkv_dims(), l.out_strides());
  cudnnBackendDescriptor_t stats = g.tensor(uid::kStats, f32, rd, rs);
  cudnnBackendDescriptor_t scale = g.scalar(uid::kScale);
  cudnnBackendDescriptor_t mask_value = g.scalar(uid::kMaskValue);

  cudnnBackendDescriptor_t s2 =
      apply_mask(g, l, style, scaled_scores(g, l, q, kt, scale), mask_value);
  cudnnBackendDescriptor_t m = g.virt(f32, rd, rs);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, s2, m);
  cudnnBackendDescriptor_t centered = score_op(g, l, CUDNN_POINTWISE_SUB, s2, m);
  cudnnBackendDescriptor_t e = score_op(g, l, CUDNN_POINTWISE_EXP, centered);
  cudnnBackendDescriptor_t z = g.virt(f32, rd, rs);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, z);
  cudnnBackendDescriptor_t log_z = g.virt(f32, rd, rs);
  g.pointwise(CUDNN_POINTWISE_LOG, f32, z, nullptr, nullptr, log_z);
  g.pointwise(CUDNN_POINTWISE_ADD, f32, m, log_z, nullptr, stats);
  cudnnBackendDescriptor_t p = g.virt(bf16, sd, ss);
  g.pointwise(CUDNN_POINTWISE_DIV, f32, e, z, nullptr, p);
  g.matmul(p, v, o);
}

void build_backward(GraphBuilder& g, const Layout& l, Style style) {
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT, bf16 = CUDNN_DATA_BFLOAT16;
  const bool current = style == Style::kCurrent;
  const Dims sd = l.score_dims(), ss = l.score_strides(), sts = l.score_t_strides();
  const Dims rd = l.row_dims(), rs = l.row_strides();
  cudnnBackendDescriptor_t q = g.tensor(uid::kQ, bf16, l.qkv_dims(), l.qkv_strides());
  cudnnBackendDescriptor_t kt = g.tensor(uid::kK, bf16, l.kv_t_dims(), l.kv_t_strides());
  cudnnBackendDescriptor_t vt = g.tensor(uid::kV, bf16, l.kv_t_dims(), l.kv_t_strides());
  cudnnBackendDescriptor_t o = g.tensor(uid::kO, bf16, l.qkv_dims(), l.out_strides());
  cudnnBackendDescriptor_t d_o = g.tensor(uid::kDO, bf16, l.qkv_dims(), l.out_strides());
  cudnnBackendDescriptor_t stats = g.tensor(uid::kStats, f32, rd, rs);
  cudnnBackendDescriptor_t dq = g.tensor(uid::kDQ, bf16, l.qkv_dims(), l.qkv_strides());
  cudnnBackendDescriptor_t dk = g.tensor(uid::kDK, bf16, l.kv_dims(), l.qkv_strides());
  cudnnBackendDescriptor_t dv = g.tensor(uid::kDV, bf16, l.kv_dims(), l.qkv_strides());
  // With grouped-query attention, dK and dV per query head, summed over each group into dk, dv.
  const bool grouped = l.KVH != l.NH;
  auto per_query_head = [&](cudnnBackendDescriptor_t out) {
    return grouped ? g.virt(bf16, l.qkv_dims(), l.packed_strides()) : out;
  };
  auto group_sum = [&](cudnnBackendDescriptor_t full, cudnnBackendDescriptor_t out) {
    if (grouped) g.reduction(CUDNN_REDUCE_TENSOR_ADD, full, out);
  };
  cudnnBackendDescriptor_t scale = g.scalar(uid::kScale);
  cudnnBackendDescriptor_t mask_value = g.scalar(uid::kMaskValue);
  cudnnBackendDescriptor_t one = g.scalar(uid::kOne);
  // A non-virtual f32 dQ accumulator is how the graph asks for the engine that accumulates dQ
  // across key blocks (instead of keeping dP in a workspace).
  cudnnBackendDescriptor_t dq_accum =
      g.tensor(uid::kDqAccum, f32, l.qkv_dims(), l.packed_strides(), false,
               current ? CUDNN_TENSOR_REORDERING_NONE : CUDNN_TENSOR_REORDERING_F16x16);

  // Dsum = Σ_d dO ∘ O (times the unit inverse dropout scale).
  cudnnBackendDescriptor_t prod = g.virt(f32, l.qkv_dims(), l.out_strides());
  g.pointwise(CUDNN_POINTWISE_MUL, f32, d_o, o, nullptr, prod);
  cudnnBackendDescriptor_t sums = g.virt(f32, rd, rs);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, prod, sums);
  cudnnBackendDescriptor_t dsum = current ? g.tensor(uid::kDsum, f32, rd, rs) : g.virt(f32, rd, rs);
  g.pointwise(CUDNN_POINTWISE_MUL, f32, sums, one, nullptr, dsum);

  // P = exp(mask(Q·Kᵀ · scale) − lse).
  cudnnBackendDescriptor_t s1 = scaled_scores(g, l, q, kt, scale);
  cudnnBackendDescriptor_t logits =
      current ? apply_mask(g, l, style, score_op(g, l, CUDNN_POINTWISE_SUB, s1, stats), mask_value)
              : score_op(g, l, CUDNN_POINTWISE_SUB, apply_mask(g, l, style, s1, mask_value), stats);
  cudnnBackendDescriptor_t p = score_op(g, l, CUDNN_POINTWISE_EXP, logits);

  // dV = Pᵀ · dO.
  cudnnBackendDescriptor_t pt = g.virt(bf16, sd, sts);
  g.reshape(p, pt);
  cudnnBackendDescriptor_t dv_full = per_query_head(dv);
  g.matmul(pt, d_o, dv_full);
  group_sum(dv_full, dv);

  // dS = (dO · Vᵀ − Dsum) ∘ P · scale.
  cudnnBackendDescriptor_t dp = g.virt(f32, sd, ss);
  g.matmul(d_o, vt, dp);
  if (!current) dp = score_op(g, l, CUDNN_POINTWISE_MUL, dp, one);
  cudnnBackendDescriptor_t diff = score_op(g, l, CUDNN_POINTWISE_SUB, dp, dsum);
  cudnnBackendDescriptor_t ds_unscaled = score_op(g, l, CUDNN_POINTWISE_MUL, diff, p);
  cudnnBackendDescriptor_t ds = score_op(g, l, CUDNN_POINTWISE_MUL, ds_unscaled, scale);

  // dK = dSᵀ · Q.
  cudnnBackendDescriptor_t dst = g.virt(bf16, sd, sts);
  g.reshape(ds, dst);
  cudnnBackendDescriptor_t dk_full = per_query_head(dk);
  g.matmul(dst, q, dk_full);
  group_sum(dk_full, dk);

  // dQ = dS · K, accumulated in f32, then stored as bf16.
  cudnnBackendDescriptor_t k = g.virt(f32, l.kv_dims(), l.qkv_strides());
  g.reshape(kt, k);
  g.matmul(ds, k, dq_accum);
  g.pointwise(CUDNN_POINTWISE_IDENTITY, f32, dq_accum, nullptr, nullptr, dq);
}

}  // namespace

struct CudnnAttention::Plan {
  Plan() = default;
  ~Plan() {
    if (seq_q) cudaFree(seq_q);
  }
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;

  DescList owned;            // every descriptor below, and those they refer to
  int32_t* seq_q = nullptr;  // padded graphs: (B) copies of S on the device, seq_len_q
  cudnnBackendDescriptor_t exec = nullptr;
  size_t cudnn_bytes = 0;  // the execution plan's own workspace, at offset 0
  size_t dq_accum_offset = 0, dq_accum_bytes = 0;  // backward: the f32 dQ accumulator
  size_t dsum_offset = 0, dsum_bytes = 0;          // backward, kCurrent: the row sums Dsum
  size_t workspace_bytes = 0;                      // all of it: what the caller provides
  // By-value scalars: the variant pack points at these.
  float scale = 1.f, mask_value = 0.f, one = 1.f;

  // The graph of one direction (and, backward, one style) for l, its first engine
  // configuration that finalizes, and the workspace layout; null with *why when none does.
  static std::unique_ptr<Plan> build(bool backward, Style style, cudnnHandle_t handle,
                                     size_t version, const Layout& l, std::string* why) {
    auto built = std::make_unique<Plan>();
    built->scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(l.HS)));
    built->mask_value = version < 91000 ? std::numeric_limits<float>::lowest()
                                        : -std::numeric_limits<float>::infinity();
    const std::string graph_name =
        std::string(backward ? "the backward graph (" : "the forward graph (") + to_string(style) +
        " style)";
    GraphBuilder g(built->owned);
    if (backward)
      build_backward(g, l, style);
    else
      build_forward(g, l, style);
    cudnnBackendDescriptor_t graph = g.graph(handle);
    if (!graph) {
      *why = graph_name + ": " + g.failure();
      return nullptr;
    }
    int64_t cudnn_bytes = 0;
    if (!built->choose_engine(handle, graph, &cudnn_bytes, why)) {
      *why = "no engine for " + graph_name + ": " + *why;
      return nullptr;
    }
    built->cudnn_bytes = static_cast<size_t>(cudnn_bytes);
    size_t end = built->cudnn_bytes;
    if (backward) {
      const size_t rows = static_cast<size_t>(l.B * l.NH * l.S);
      built->dq_accum_offset = align_up(end, kWorkspaceAlignment);
      built->dq_accum_bytes = rows * static_cast<size_t>(l.HS) * sizeof(float);
      end = built->dq_accum_offset + built->dq_accum_bytes;
      if (style == Style::kCurrent) {
        built->dsum_offset = align_up(end, kWorkspaceAlignment);
        built->dsum_bytes = rows * sizeof(float);
        end = built->dsum_offset + built->dsum_bytes;
      }
    }
    built->workspace_bytes = end;
    if (l.padded) {
      // Every query row is computed: seq_len_q is S for every sequence.
      const std::vector<int32_t> all(static_cast<size_t>(l.B), static_cast<int32_t>(l.S));
      cudaError_t e = cudaMalloc(reinterpret_cast<void**>(&built->seq_q), all.size() * 4);
      if (e == cudaSuccess)
        e = cudaMemcpy(built->seq_q, all.data(), all.size() * 4, cudaMemcpyHostToDevice);
      if (e != cudaSuccess) {
        *why = std::string("seq_len_q on the device: ") + cudaGetErrorString(e);
        cudaGetLastError();
        return nullptr;
      }
    }
    return built;
  }

 private:
  // Asks cuDNN's heuristics (mode A) for engine configurations of `graph` and keeps the first
  // that finalizes as an execution plan; false with the last failure in *why when none does.
  bool choose_engine(cudnnHandle_t handle, cudnnBackendDescriptor_t graph, int64_t* bytes,
                     std::string* why) {
    Desc heur_desc(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    if (heur_desc.status() != CUDNN_STATUS_SUCCESS) {
      *why = "create engine heuristics: " + status_text(heur_desc.status());
      return false;
    }
    cudnnBackendDescriptor_t heur = owned.add(std::move(heur_desc));
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    cudnnStatus_t st = cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
                                                CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph);
    if (st == CUDNN_STATUS_SUCCESS)
      st = cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1,
                                    &mode);
    if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(heur);
    int64_t count = 0;
    if (st == CUDNN_STATUS_SUCCESS)
      st = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                    CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr);
    if (st != CUDNN_STATUS_SUCCESS) {
      *why = "engine heuristics: " + status_text(st);
      return false;
    }
    if (count <= 0) {
      *why = "the heuristics offer no engine configuration";
      return false;
    }
    std::vector<cudnnBackendDescriptor_t> configs;
    for (int64_t i = 0; i < count; ++i) {
      Desc c(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
      if (c.status() != CUDNN_STATUS_SUCCESS) {
        *why = "create engine configuration: " + status_text(c.status());
        return false;
      }
      configs.push_back(owned.add(std::move(c)));
    }
    int64_t returned = 0;
    st = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &returned, configs.data());
    if (st != CUDNN_STATUS_SUCCESS) {
      *why = "engine heuristics results: " + status_text(st);
      return false;
    }
    std::string last = "the heuristics returned no engine configuration";
    for (int64_t i = 0; i < returned && i < count; ++i) {
      Desc p(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      st = p.status();
      if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendSetAttribute(p.get(), CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE,
                                      1, &handle);
      if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendSetAttribute(p.get(), CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                      CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &configs[i]);
      if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(p.get());
      int64_t ws = 0, n = 0;
      if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendGetAttribute(p.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                      CUDNN_TYPE_INT64, 1, &n, &ws);
      if (st == CUDNN_STATUS_SUCCESS) {
        exec = owned.add(std::move(p));
        *bytes = ws;
        return true;
      }
      last = "engine configuration " + std::to_string(i + 1) + " of " + std::to_string(returned) +
             ": " + status_text(st);
    }
    *why = last;
    return false;
  }
};

CudnnAttention::CudnnAttention() {
  version_ = cudnnGetVersion();
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess)
    e = cudaDeviceGetAttribute(&cc_major_, cudaDevAttrComputeCapabilityMajor, device);
  if (e == cudaSuccess)
    e = cudaDeviceGetAttribute(&cc_minor_, cudaDevAttrComputeCapabilityMinor, device);
  if (e != cudaSuccess) {
    cc_error_ = std::string("compute capability unknown: ") + cudaGetErrorName(e) + ": " +
                cudaGetErrorString(e);
    cudaGetLastError();  // not sticky: leave no error behind for the caller's next check
  }
  status_ = cudnnCreate(&handle_);
  if (status_ != CUDNN_STATUS_SUCCESS) handle_ = nullptr;
}

CudnnAttention::~CudnnAttention() {
  plans_.clear();  // the plans refer to the handle
  if (handle_) cudnnDestroy(handle_);
}

std::string CudnnAttention::precheck(bool backward, ElemType type, int S, int HS) const {
  if (type != ElemType::kBF16)
    return std::string(to_string(type)) + " operands: cuDNN's flash attention takes fp16/bf16 only";
  if (HS % 8 != 0) return "head size " + std::to_string(HS) + " is not a multiple of 8";
  if (HS > 128) return "head size " + std::to_string(HS) + " is above 128";
  if (version_ < 90000) return "cuDNN " + version_text(version_) + " is older than 9.0";
  if (version_ == 91000 || version_ == 91001)
    return "cuDNN " + version_text(version_) + " has known flash attention bugs (fixed in 9.10.2)";
  if (!cc_error_.empty()) return cc_error_;
  if (cc_major_ < 8)
    return "compute capability " + std::to_string(cc_major_) + "." + std::to_string(cc_minor_) +
           " is below 8.0";
  // The frontend masks the padding of the last key block explicitly on these versions.
  if (backward && version_ <= 91500 && S % 128 != 0)
    return "cuDNN " + version_text(version_) +
           "'s backward needs S a multiple of 128 (S = " + std::to_string(S) +
           ") unless a padding-mask workaround is built; fixed after 9.15.0";
  return "";
}

CudnnAttention::Key CudnnAttention::key(bool backward, ElemType type, int B, int S, int NH, int KVH,
                                        int HS, FlashMask mask) {
  return Key{backward ? 1 : 0,
             static_cast<int>(type),
             mask.causal ? 1 : 0,
             mask.key_len ? 1 : 0,
             B,
             S,
             NH,
             KVH,
             HS};
}

CudnnAttention::Plan* CudnnAttention::plan(bool backward, ElemType type, int B, int S, int NH,
                                           int KVH, int HS, FlashMask mask) {
  const Key key = CudnnAttention::key(backward, type, B, S, NH, KVH, HS, mask);
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second.get();
  std::string why = precheck(backward, type, S, HS);
  std::unique_ptr<Plan> p;
  if (why.empty() && status_ != CUDNN_STATUS_SUCCESS)
    why = "cudnnCreate failed: " + std::string(cudnnGetErrorString(status_));
  if (why.empty()) {
    const Layout l{B, S, NH, KVH, HS, mask.causal, mask.key_len != nullptr};
    std::string first_try, second_try;
    p = Plan::build(backward, Style::kCurrent, handle_, version_, l, &first_try);
    if (!p) p = Plan::build(backward, Style::kCudnn90, handle_, version_, l, &second_try);
    if (!p) why = "cuDNN " + version_text(version_) + ": " + first_try + "; " + second_try;
  }
  if (!p) refusals_[key] = why;
  return (plans_[key] = std::move(p)).get();
}

namespace {

bool valid_shape(int B, int S, int NH, int KVH, int HS) {
  return B > 0 && S > 0 && NH > 0 && KVH > 0 && NH % KVH == 0 && HS > 0;
}

// Binds `uids` to `pointers` and the workspace, and runs `plan` on the handle's stream.
cudnnStatus_t execute(cudnnHandle_t handle, cudnnBackendDescriptor_t plan,
                      const std::vector<int64_t>& uids, const std::vector<void*>& pointers,
                      void* workspace) {
  Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  cudnnStatus_t st = pack.status();
  const auto n = static_cast<int64_t>(uids.size());
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnBackendSetAttribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
                                  n, uids.data());
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnBackendSetAttribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                  CUDNN_TYPE_VOID_PTR, n, pointers.data());
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnBackendSetAttribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
                                  CUDNN_TYPE_VOID_PTR, 1, &workspace);
  if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(pack.get());
  if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendExecute(handle, plan, pack.get());
  return st;
}

}  // namespace

// A padded graph's seq_len_q (the plan's S values) and seq_len_kv (the mask's key lengths).
void CudnnAttention::bind_padding(const Plan& p, FlashMask mask, std::vector<int64_t>* uids,
                                  std::vector<void*>* pointers) {
  if (!mask.key_len) return;
  uids->push_back(uid::kSeqQ);
  pointers->push_back(p.seq_q);
  uids->push_back(uid::kSeqKv);
  pointers->push_back(const_cast<int32_t*>(mask.key_len));
}

cudnnStatus_t CudnnAttention::supports(ElemType type, int B, int S, int NH, int KVH, int HS,
                                       std::string* why, FlashMask mask) {
  std::string reason;
  cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
  if (!valid_shape(B, S, NH, KVH, HS)) {
    st = CUDNN_STATUS_BAD_PARAM;
    reason = "B, S, NH, KVH and HS must be positive and KVH must divide NH (B " +
             std::to_string(B) + ", S " + std::to_string(S) + ", NH " + std::to_string(NH) +
             ", KVH " + std::to_string(KVH) + ", HS " + std::to_string(HS) + ")";
  }
  // plan() refuses by argument (precheck) before it needs the handle or a device.
  for (bool backward : {false, true}) {
    if (st != CUDNN_STATUS_SUCCESS) break;
    if (!plan(backward, type, B, S, NH, KVH, HS, mask)) {
      st = refused(backward, type, S, HS);
      reason = refusals_[key(backward, type, B, S, NH, KVH, HS, mask)];
    }
  }
  if (why) *why = reason;
  return st;
}

cudnnStatus_t CudnnAttention::refused(bool backward, ElemType type, int S, int HS) const {
  const bool handle_failed =
      status_ != CUDNN_STATUS_SUCCESS && precheck(backward, type, S, HS).empty();
  return handle_failed ? status_ : CUDNN_STATUS_NOT_SUPPORTED;
}

size_t CudnnAttention::forward_workspace_bytes(ElemType type, int B, int S, int NH, int KVH, int HS,
                                               FlashMask mask) {
  if (!valid_shape(B, S, NH, KVH, HS)) return 0;
  const Plan* p = plan(false, type, B, S, NH, KVH, HS, mask);
  return p ? p->workspace_bytes : 0;
}

size_t CudnnAttention::backward_workspace_bytes(ElemType type, int B, int S, int NH, int KVH,
                                                int HS, FlashMask mask) {
  if (!valid_shape(B, S, NH, KVH, HS)) return 0;
  const Plan* p = plan(true, type, B, S, NH, KVH, HS, mask);
  return p ? p->workspace_bytes : 0;
}

cudnnStatus_t CudnnAttention::forward(void* out, float* lse, const void* qkv, ElemType type, int B,
                                      int S, int NH, int KVH, int HS, void* workspace,
                                      cudaStream_t stream, FlashMask mask) {
  if (!valid_shape(B, S, NH, KVH, HS)) return CUDNN_STATUS_BAD_PARAM;
  Plan* p = plan(false, type, B, S, NH, KVH, HS, mask);
  if (!p) return refused(false, type, S, HS);
  if (!out || !lse || !qkv || (p->workspace_bytes > 0 && !workspace))
    return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
  if (!aligned(out) || !aligned(lse) || !aligned(qkv) || !aligned(workspace))
    return CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER;
  const cudnnStatus_t st = cudnnSetStream(handle_, stream);
  if (st != CUDNN_STATUS_SUCCESS) return st;
  // K starts NH·HS elements into each token's row of qkv, V (NH + KVH)·HS.
  const size_t k_at = static_cast<size_t>(NH) * HS * elem_size(type);
  const size_t v_at = static_cast<size_t>(NH + KVH) * HS * elem_size(type);
  char* base = static_cast<char*>(const_cast<void*>(qkv));
  std::vector<int64_t> uids = {uid::kQ,     uid::kK,     uid::kV,        uid::kO,
                               uid::kStats, uid::kScale, uid::kMaskValue};
  std::vector<void*> pointers = {base, base + k_at, base + v_at,   out,
                                 lse,  &p->scale,   &p->mask_value};
  bind_padding(*p, mask, &uids, &pointers);
  return execute(handle_, p->exec, uids, pointers, workspace);
}

cudnnStatus_t CudnnAttention::backward(void* dqkv, const void* dout, const void* qkv,
                                       const void* out, const float* lse, ElemType type, int B,
                                       int S, int NH, int KVH, int HS, void* workspace,
                                       cudaStream_t stream, FlashMask mask) {
  if (!valid_shape(B, S, NH, KVH, HS)) return CUDNN_STATUS_BAD_PARAM;
  Plan* p = plan(true, type, B, S, NH, KVH, HS, mask);
  if (!p) return refused(true, type, S, HS);
  if (!dqkv || !dout || !qkv || !out || !lse || !workspace)
    return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
  if (!aligned(dqkv) || !aligned(dout) || !aligned(qkv) || !aligned(out) || !aligned(lse) ||
      !aligned(workspace))
    return CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER;
  const cudnnStatus_t st = cudnnSetStream(handle_, stream);
  if (st != CUDNN_STATUS_SUCCESS) return st;
  char* ws = static_cast<char*>(workspace);
  // The engine adds dQ contributions of every key block into the accumulator.
  if (cudaMemsetAsync(ws + p->dq_accum_offset, 0, p->dq_accum_bytes, stream) != cudaSuccess)
    return CUDNN_STATUS_EXECUTION_FAILED_CUDART;
  const size_t k_at = static_cast<size_t>(NH) * HS * elem_size(type);
  const size_t v_at = static_cast<size_t>(NH + KVH) * HS * elem_size(type);
  char* in = static_cast<char*>(const_cast<void*>(qkv));
  char* grad = static_cast<char*>(dqkv);
  std::vector<int64_t> uids = {uid::kQ,         uid::kK,   uid::kV,      uid::kO,  uid::kDO,
                               uid::kStats,     uid::kDQ,  uid::kDK,     uid::kDV, uid::kScale,
                               uid::kMaskValue, uid::kOne, uid::kDqAccum};
  std::vector<void*> pointers = {in,
                                 in + k_at,
                                 in + v_at,
                                 const_cast<void*>(out),
                                 const_cast<void*>(dout),
                                 const_cast<float*>(lse),
                                 grad,
                                 grad + k_at,
                                 grad + v_at,
                                 &p->scale,
                                 &p->mask_value,
                                 &p->one,
                                 ws + p->dq_accum_offset};
  if (p->dsum_bytes > 0) {
    uids.push_back(uid::kDsum);
    pointers.push_back(ws + p->dsum_offset);
  }
  bind_padding(*p, mask, &uids, &pointers);
  return execute(handle_, p->exec, uids, pointers, workspace);
}

}  // namespace strata::kernels::cuda
