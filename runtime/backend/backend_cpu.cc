// The CPU backend: OpenBLAS GEMMs and OpenMP loops from kernels/cpu, on host memory.
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_block.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/gelu.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/moe.h"
#include "kernels/cpu/optim.h"
#include "kernels/cpu/precision.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/swiglu.h"
#include "kernels/cpu/threads.h"
#include "runtime/backend/backend.h"
#include "runtime/backend/backend_checks.h"
#include "runtime/base/check.h"
#include "runtime/base/error.h"

namespace strata {
namespace {

namespace k = kernels::cpu;

using namespace backend_checks;

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads) : threads_(threads) { k::set_num_threads(threads); }

  Device device() const override { return Device::kCPU; }
  std::string name() const override {
    return "cpu (" + k::blas_summary() + ", " + std::to_string(threads_) +
           (threads_ == 1 ? " thread)" : " threads)");
  }
  Allocator& allocator() override { return cpu_allocator(); }

  void zero(Tensor& x) override {
    if (x.bytes()) std::memset(x.data(), 0, x.bytes());
  }
  void copy(Tensor& dst, const Tensor& src) override {
    STRATA_CHECK(dst.numel() == src.numel() && dst.dtype() == src.dtype(),
                 "copy " << shape_string(src.shape()) << " into " << shape_string(dst.shape()));
    if (dst.bytes()) std::memcpy(dst.data(), src.data(), dst.bytes());
  }
  void cast(Tensor& dst, const Tensor& src) override {
    expect_numel(dst, src.numel(), "cast destination");
    const size_t n = static_cast<size_t>(src.numel());
    if (dst.dtype() == src.dtype()) {
      copy(dst, src);
    } else if (dst.dtype() == DType::kBF16 && src.dtype() == DType::kF32) {
      k::cast_f32_to_bf16(dst.bf16(), src.f32(), n);
    } else if (dst.dtype() == DType::kF32 && src.dtype() == DType::kBF16) {
      k::cast_bf16_to_f32(dst.f32(), src.bf16(), n);
    } else {
      STRATA_CHECK(false,
                   "cast from " << to_string(src.dtype()) << " to " << to_string(dst.dtype()));
    }
  }
  void upload(Tensor& dst, const void* host) override {
    if (dst.bytes()) std::memcpy(dst.data(), host, dst.bytes());
  }
  void download(void* host, const Tensor& src) override {
    if (src.bytes()) std::memcpy(host, src.data(), src.bytes());
  }
  void synchronize() override {}

  void matmul_forward(Tensor& out, const Tensor& inp, const Tensor& w,
                      const Tensor* bias) override {
    if (!all_f32(out, inp, w, bias)) {
      MixedPrecisionScope mp(*this);
      return matmul_forward(mp.out(out), mp.in(inp), mp.in(w), mp.in(bias));
    }
    const LinearDims d = linear_dims(out, inp, w, bias);
    k::matmul_forward(out.f32(), inp.f32(), w.f32(), bias ? bias->f32() : nullptr, as_int(d.N),
                      as_int(d.C), as_int(d.OC));
  }
  void matmul_backward(Tensor* dinp, Tensor& dw, Tensor* dbias, const Tensor& dout,
                       const Tensor& inp, const Tensor& w) override {
    if (!all_f32(dinp, dw, dbias, dout, inp, w)) {
      MixedPrecisionScope mp(*this);
      return matmul_backward(mp.out(dinp), mp.out(dw), mp.out(dbias), mp.in(dout), mp.in(inp),
                             mp.in(w));
    }
    const int64_t N = rows(inp), C = inp.size(-1), OC = w.size(0);
    expect_numel(dout, N * OC, "matmul dout");
    expect_shape(dw, w.shape(), "matmul dweight");
    if (dinp) expect_numel(*dinp, N * C, "matmul dinp");
    if (dbias) expect_numel(*dbias, OC, "matmul dbias");
    k::matmul_backward(dinp ? dinp->f32() : nullptr, dw.f32(), dbias ? dbias->f32() : nullptr,
                       dout.f32(), inp.f32(), w.f32(), as_int(N), as_int(C), as_int(OC));
  }
  void matmul_backward_input(Tensor& dinp, const Tensor& dout, const Tensor& w) override {
    if (!all_f32(dinp, dout, w)) {
      MixedPrecisionScope mp(*this);
      return matmul_backward_input(mp.out(dinp), mp.in(dout), mp.in(w));
    }
    const LinearDims d = linear_backward_input_dims(dinp, dout, w);
    k::gemm<float>(false, false, as_int(d.N), as_int(d.C), as_int(d.OC), 1.0f, dout.f32(),
                   as_int(d.OC), w.f32(), as_int(d.C), 0.0f, dinp.f32(), as_int(d.C));
  }
  void matmul_backward_weight(Tensor& dw, Tensor* dbias, const Tensor& dout,
                              const Tensor& inp) override {
    if (!all_f32(dw, dbias, dout, inp)) {
      MixedPrecisionScope mp(*this);
      return matmul_backward_weight(mp.out(dw), mp.out(dbias), mp.in(dout), mp.in(inp));
    }
    const LinearDims d = linear_backward_weight_dims(dw, dbias, dout, inp);
    k::matmul_backward_weight(dw.f32(), dbias ? dbias->f32() : nullptr, dout.f32(), inp.f32(),
                              as_int(d.N), as_int(d.C), as_int(d.OC));
  }
  void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& inp,
                         const Tensor& w, const Tensor& b, float eps) override {
    if (!all_f32(out, mean, rstd, inp, w, b)) {
      MixedPrecisionScope mp(*this);
      return layernorm_forward(mp.out(out), mp.out(mean), mp.out(rstd), mp.in(inp), mp.in(w),
                               mp.in(b), eps);
    }
    const NormDims d = layernorm_forward_dims(out, mean, rstd, inp, w, b);
    k::layernorm_forward(out.f32(), mean.f32(), rstd.f32(), inp.f32(), w.f32(), b.f32(),
                         as_int(d.N), as_int(d.C), eps);
  }
  void layernorm_backward(Tensor& dinp, Tensor& dw, Tensor& db, const Tensor& dout,
                          const Tensor& inp, const Tensor& w, const Tensor& mean,
                          const Tensor& rstd) override {
    if (!all_f32(dinp, dw, db, dout, inp, w, mean, rstd)) {
      MixedPrecisionScope mp(*this);
      return layernorm_backward(mp.out(dinp), mp.out(dw), mp.out(db), mp.in(dout), mp.in(inp),
                                mp.in(w), mp.in(mean), mp.in(rstd));
    }
    const NormDims d = layernorm_backward_dims(dinp, dw, db, dout, inp, w, mean, rstd);
    k::layernorm_backward(dinp.f32(), dw.f32(), db.f32(), dout.f32(), inp.f32(), w.f32(),
                          mean.f32(), rstd.f32(), as_int(d.N), as_int(d.C));
  }
  void gelu_forward(Tensor& out, const Tensor& inp, GeluKind kind) override {
    if (!all_f32(out, inp)) {
      MixedPrecisionScope mp(*this);
      return gelu_forward(mp.out(out), mp.in(inp), kind);
    }
    expect_numel(out, inp.numel(), "gelu out");
    const size_t n = static_cast<size_t>(inp.numel());
    if (kind == GeluKind::kErf)
      k::gelu_erf_forward(out.f32(), inp.f32(), n);
    else
      k::gelu_forward(out.f32(), inp.f32(), n);
  }
  void gelu_backward(Tensor& dinp, const Tensor& inp, const Tensor& dout, GeluKind kind) override {
    if (!all_f32(dinp, inp, dout)) {
      MixedPrecisionScope mp(*this);
      return gelu_backward(mp.out(dinp), mp.in(inp), mp.in(dout), kind);
    }
    expect_numel(dinp, inp.numel(), "gelu dinp");
    expect_numel(dout, inp.numel(), "gelu dout");
    const size_t n = static_cast<size_t>(inp.numel());
    if (kind == GeluKind::kErf)
      k::gelu_erf_backward(dinp.f32(), inp.f32(), dout.f32(), n);
    else
      k::gelu_backward(dinp.f32(), inp.f32(), dout.f32(), n);
  }
  void tanh_forward(Tensor& out, const Tensor& inp) override {
    if (!all_f32(out, inp)) {
      MixedPrecisionScope mp(*this);
      return tanh_forward(mp.out(out), mp.in(inp));
    }
    expect_numel(out, inp.numel(), "tanh out");
    k::tanh_forward(out.f32(), inp.f32(), static_cast<size_t>(inp.numel()));
  }
  void tanh_backward(Tensor& dinp, const Tensor& out, const Tensor& dout) override {
    if (!all_f32(dinp, out, dout)) {
      MixedPrecisionScope mp(*this);
      return tanh_backward(mp.out(dinp), mp.in(out), mp.in(dout));
    }
    expect_numel(dinp, out.numel(), "tanh dinp");
    expect_numel(dout, out.numel(), "tanh dout");
    k::tanh_backward(dinp.f32(), out.f32(), dout.f32(), static_cast<size_t>(out.numel()));
  }

  void attention_forward(Tensor& out, Tensor& att, const Tensor& qkv, int num_heads,
                         int num_kv_heads, const AttentionMask& mask) override {
    if (!all_f32(out, att, qkv)) {
      MixedPrecisionScope mp(*this);
      return attention_forward(mp.out(out), mp.out(att), mp.in(qkv), num_heads, num_kv_heads, mask);
    }
    const AttentionDims a = attention_dims(qkv, num_heads, num_kv_heads);
    expect_numel(out, a.B * a.S * num_heads * a.HS, "attention out");
    expect_numel(att, a.B * num_heads * a.S * a.S, "attention probabilities");
    k::attention_forward(out.f32(), att.f32(), qkv.f32(), as_int(a.B), as_int(a.S), num_heads,
                         num_kv_heads, as_int(a.HS), mask.causal, key_lengths(mask, a));
  }
  // The probabilities saved by the forward make `out` unnecessary here.
  void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                          const Tensor& att, int num_heads, int num_kv_heads,
                          const AttentionMask& mask) override {
    if (!all_f32(dqkv, dout, qkv, att)) {
      MixedPrecisionScope mp(*this);
      return attention_backward(mp.out(dqkv), mp.in(dout), mp.in(qkv), out, mp.in(att), num_heads,
                                num_kv_heads, mask);
    }
    const AttentionDims a = attention_dims(qkv, num_heads, num_kv_heads);
    expect_numel(dqkv, qkv.numel(), "attention dqkv");
    expect_numel(dout, a.B * a.S * num_heads * a.HS, "attention dout");
    expect_numel(att, a.B * num_heads * a.S * a.S, "attention probabilities");
    const int64_t need = static_cast<int64_t>(k::attention_scratch_elems(as_int(a.S)));
    if (scratch_.numel() < need) {
      scratch_ = Tensor();  // release before allocating the larger one
      scratch_ = empty({need}, MemCategory::kBuffers);
    }
    k::attention_backward(dqkv.f32(), dout.f32(), qkv.f32(), att.f32(), scratch_.f32(), as_int(a.B),
                          as_int(a.S), num_heads, num_kv_heads, as_int(a.HS), mask.causal,
                          key_lengths(mask, a));
  }

  // ---- ring attention blocks ----
  void attention_block_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const Tensor& kv,
                               const AttentionBlock& blk) override {
    if (!all_f32(out, qkv, kv)) {
      MixedPrecisionScope mp(*this);
      return attention_block_forward(mp.out(out), lse, mp.in(qkv), mp.in(kv), blk);
    }
    const BlockGeometry g = block_geometry(qkv, kv, blk);
    expect_numel(out, g.a.B * g.a.S * blk.num_heads * g.a.HS, "attention block out");
    expect_f32(lse, g.a.B * blk.num_heads * g.a.S, "attention block lse");
    const std::vector<int32_t> len = block_key_lengths(blk, g.a.B);
    k::BlockLayout at = g.at;
    at.key_len = len.empty() ? nullptr : len.data();
    k::attention_block_forward(
        out.f32() + blk.q_rows.begin * at.o_ld, lse.f32() + blk.q_rows.begin,
        qkv.f32() + blk.q_rows.begin * at.q_ld, g.kv + blk.k_rows.begin * at.kv_ld, as_int(g.a.B),
        as_int(blk.q_rows.count), as_int(blk.k_rows.count), blk.num_heads, blk.num_kv_heads,
        as_int(g.a.HS), blk.causal ? k::BlockMask::kCausal : k::BlockMask::kFull, at);
  }
  void attention_block_merge(Tensor& out, Tensor& lse, const Tensor& out_b, const Tensor& lse_b,
                             const AttentionBlock& blk) override {
    if (!all_f32(out, out_b)) {
      MixedPrecisionScope mp(*this);
      return attention_block_merge(mp.out(out), lse, mp.in(out_b), lse_b, blk);
    }
    const k::BlockLayout at = rows_layout(out, lse, blk.num_heads, "attention merge");
    expect_numel(out_b, out.numel(), "attention merge block out");
    expect_f32(lse_b, lse.numel(), "attention merge block lse");
    const int64_t B = out.size(0), S = out.size(1), r0 = blk.q_rows.begin;
    STRATA_CHECK(r0 >= 0 && r0 + blk.q_rows.count <= S, "attention merge rows outside " << S);
    k::attention_merge(out.f32() + r0 * at.o_ld, lse.f32() + r0, out_b.f32() + r0 * at.o_ld,
                       lse_b.f32() + r0, as_int(B), as_int(blk.q_rows.count), blk.num_heads,
                       as_int(at.o_ld / blk.num_heads), at);
  }
  void attention_block_delta(Tensor& delta, const Tensor& dout, const Tensor& out,
                             int num_heads) override {
    if (!all_f32(dout, out)) {
      MixedPrecisionScope mp(*this);
      return attention_block_delta(delta, mp.in(dout), mp.in(out), num_heads);
    }
    const k::BlockLayout at = rows_layout(out, delta, num_heads, "attention delta");
    expect_numel(dout, out.numel(), "attention delta dout");
    k::attention_block_delta(delta.f32(), dout.f32(), out.f32(), as_int(out.size(0)),
                             as_int(out.size(1)), num_heads, as_int(at.o_ld / num_heads), at);
  }
  void attention_block_backward(Tensor& dq, Tensor& dkv, const Tensor& dout, const Tensor& qkv,
                                const Tensor& kv, const Tensor& lse, const Tensor& delta,
                                const AttentionBlock& blk) override {
    if (!all_f32(dout, qkv, kv)) {
      MixedPrecisionScope mp(*this);
      return attention_block_backward(dq, dkv, mp.in(dout), mp.in(qkv), mp.in(kv), lse, delta, blk);
    }
    const BlockGeometry g = block_geometry(qkv, kv, blk);
    const int64_t rows = g.a.B * blk.num_heads * g.a.S;
    expect_f32(dq, g.a.B * g.a.S * blk.num_heads * g.a.HS, "attention block dq");
    expect_f32(dkv, g.a.B * g.S_k * 2 * blk.num_kv_heads * g.a.HS, "attention block dkv");
    STRATA_CHECK(kv.size(2) != qkv.size(2), "attention block dkv of keys inside q/k/v");
    expect_numel(dout, dq.numel(), "attention block dout");
    expect_f32(lse, rows, "attention block lse");
    expect_f32(delta, rows, "attention block delta");
    const std::vector<int32_t> len = block_key_lengths(blk, g.a.B);
    k::BlockLayout at = g.at;
    at.key_len = len.empty() ? nullptr : len.data();
    const int64_t q0 = blk.q_rows.begin, k0 = blk.k_rows.begin;
    k::attention_block_backward(dq.f32() + q0 * at.o_ld, dkv.f32() + k0 * at.kv_ld,
                                dout.f32() + q0 * at.o_ld, qkv.f32() + q0 * at.q_ld,
                                g.kv + k0 * at.kv_ld, lse.f32() + q0, delta.f32() + q0,
                                as_int(g.a.B), as_int(blk.q_rows.count), as_int(blk.k_rows.count),
                                blk.num_heads, blk.num_kv_heads, as_int(g.a.HS),
                                blk.causal ? k::BlockMask::kCausal : k::BlockMask::kFull, at);
  }
  void attention_kv_extract(Tensor& kv, const Tensor& qkv, int num_heads,
                            int num_kv_heads) override {
    const AttentionDims a = attention_dims(qkv, num_heads, num_kv_heads);
    const int64_t W = qkv.size(2), q = num_heads * a.HS, n = W - q;
    expect_numel(kv, a.B * a.S * n, "attention kv");
    STRATA_CHECK(kv.dtype() == qkv.dtype(), "attention kv is " << to_string(kv.dtype())
                                                               << ", q/k/v "
                                                               << to_string(qkv.dtype()));
    const size_t es = dtype_size(qkv.dtype());
    const char* src = static_cast<const char*>(qkv.data());
    char* dst = static_cast<char*>(kv.data());
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < a.B * a.S; ++r)
      std::memcpy(dst + static_cast<size_t>(r * n) * es, src + static_cast<size_t>(r * W + q) * es,
                  static_cast<size_t>(n) * es);
  }
  void attention_qkv_assemble(Tensor& dqkv, const Tensor& dq, const Tensor& dkv, int num_heads,
                              int num_kv_heads) override {
    if (!all_f32(dqkv)) {
      MixedPrecisionScope mp(*this);
      return attention_qkv_assemble(mp.out(dqkv), dq, dkv, num_heads, num_kv_heads);
    }
    const AttentionDims a = attention_dims(dqkv, num_heads, num_kv_heads);
    const int64_t W = dqkv.size(2), q = num_heads * a.HS, n = W - q;
    expect_f32(dq, a.B * a.S * q, "attention dq");
    expect_f32(dkv, a.B * a.S * n, "attention dkv");
    float* out = dqkv.f32();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < a.B * a.S; ++r) {
      std::memcpy(out + r * W, dq.f32() + r * q, static_cast<size_t>(q) * sizeof(float));
      std::memcpy(out + r * W + q, dkv.f32() + r * n, static_cast<size_t>(n) * sizeof(float));
    }
  }

  void rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& inp, const Tensor& w,
                       float eps) override {
    if (!all_f32(out, rstd, inp, w)) {
      MixedPrecisionScope mp(*this);
      return rmsnorm_forward(mp.out(out), mp.out(rstd), mp.in(inp), mp.in(w), eps);
    }
    const NormDims d = rmsnorm_forward_dims(out, rstd, inp, w);
    k::rmsnorm_forward(out.f32(), rstd.f32(), inp.f32(), w.f32(), as_int(d.N), as_int(d.C), eps);
  }
  void rmsnorm_backward(Tensor& dinp, Tensor& dw, const Tensor& dout, const Tensor& inp,
                        const Tensor& w, const Tensor& rstd) override {
    if (!all_f32(dinp, dw, dout, inp, w, rstd)) {
      MixedPrecisionScope mp(*this);
      return rmsnorm_backward(mp.out(dinp), mp.out(dw), mp.in(dout), mp.in(inp), mp.in(w),
                              mp.in(rstd));
    }
    const NormDims d = rmsnorm_backward_dims(dinp, dw, dout, inp, w, rstd);
    k::rmsnorm_backward(dinp.f32(), dw.f32(), dout.f32(), inp.f32(), w.f32(), rstd.f32(),
                        as_int(d.N), as_int(d.C));
  }
  void qk_rmsnorm_forward(Tensor& qkv, Tensor& rstd, const Tensor& q_weight, const Tensor& k_weight,
                          int num_heads, int num_kv_heads, float eps) override {
    const AttentionDims a =
        qk_rmsnorm_dims(qkv, rstd, q_weight, k_weight, num_heads, num_kv_heads, "qk_rmsnorm qkv");
    if (!all_f32(qkv, rstd, q_weight, k_weight)) {
      MixedPrecisionScope mp(*this);
      return qk_rmsnorm_forward(mp.out(qkv), mp.out(rstd), mp.in(q_weight), mp.in(k_weight),
                                num_heads, num_kv_heads, eps);
    }
    k::qk_rmsnorm_forward(qkv.f32(), rstd.f32(), q_weight.f32(), k_weight.f32(), as_int(a.B * a.S),
                          num_heads, num_kv_heads, as_int(a.HS), eps);
  }
  void qk_rmsnorm_backward(Tensor& dqkv, Tensor& dq_weight, Tensor& dk_weight, const Tensor& x,
                           const Tensor& q_weight, const Tensor& k_weight, const Tensor& rstd,
                           int num_heads, int num_kv_heads) override {
    const AttentionDims a = qk_rmsnorm_backward_dims(dqkv, dq_weight, dk_weight, x, q_weight,
                                                     k_weight, rstd, num_heads, num_kv_heads);
    if (!all_f32(dqkv, dq_weight, dk_weight, x, q_weight, k_weight, rstd)) {
      MixedPrecisionScope mp(*this);
      return qk_rmsnorm_backward(mp.out(dqkv), mp.out(dq_weight), mp.out(dk_weight), mp.in(x),
                                 mp.in(q_weight), mp.in(k_weight), mp.in(rstd), num_heads,
                                 num_kv_heads);
    }
    k::qk_rmsnorm_backward(dqkv.f32(), dq_weight.f32(), dk_weight.f32(), x.f32(), q_weight.f32(),
                           k_weight.f32(), rstd.f32(), as_int(a.B * a.S), num_heads, num_kv_heads,
                           as_int(a.HS));
  }
  void rope_forward(Tensor& qkv, const Tensor& cos_sin, int num_heads, int num_kv_heads) override {
    if (!all_f32(qkv)) {
      MixedPrecisionScope mp(*this);
      return rope_forward(mp.out(qkv), cos_sin, num_heads, num_kv_heads);
    }
    const AttentionDims a = rope_dims(qkv, cos_sin, num_heads, num_kv_heads, "rope qkv");
    k::rope_forward(qkv.f32(), cos_sin.f32(), as_int(a.B), as_int(a.S), num_heads, num_kv_heads,
                    as_int(a.HS));
  }
  void rope_backward(Tensor& dqkv, const Tensor& cos_sin, int num_heads,
                     int num_kv_heads) override {
    if (!all_f32(dqkv)) {
      MixedPrecisionScope mp(*this);
      return rope_backward(mp.out(dqkv), cos_sin, num_heads, num_kv_heads);
    }
    const AttentionDims a = rope_dims(dqkv, cos_sin, num_heads, num_kv_heads, "rope dqkv");
    k::rope_backward(dqkv.f32(), cos_sin.f32(), as_int(a.B), as_int(a.S), num_heads, num_kv_heads,
                     as_int(a.HS));
  }
  void swiglu_forward(Tensor& out, const Tensor& gate_up) override {
    if (!all_f32(out, gate_up)) {
      MixedPrecisionScope mp(*this);
      return swiglu_forward(mp.out(out), mp.in(gate_up));
    }
    const SwigluDims d = swiglu_dims(out, gate_up, "swiglu out");
    k::swiglu_forward(out.f32(), gate_up.f32(), as_int(d.N), as_int(d.F));
  }
  void swiglu_backward(Tensor& dgate_up, const Tensor& dout, const Tensor& gate_up) override {
    if (!all_f32(dgate_up, dout, gate_up)) {
      MixedPrecisionScope mp(*this);
      return swiglu_backward(mp.out(dgate_up), mp.in(dout), mp.in(gate_up));
    }
    const SwigluDims d = swiglu_backward_dims(dgate_up, dout, gate_up);
    k::swiglu_backward(dgate_up.f32(), dout.f32(), gate_up.f32(), as_int(d.N), as_int(d.F));
  }

  // ---- mixture of experts ----
  // (top_k: `k` names the kernels here.)
  void moe_route(Tensor& probs, Tensor& topk_idx, Tensor& topk_w, const Tensor& logits, int top_k,
                 bool renormalize) override {
    const MoeDims d = moe_route_dims(probs, topk_idx, topk_w, logits, top_k);
    if (!all_f32(probs, topk_w, logits)) {
      MixedPrecisionScope mp(*this);
      return moe_route(mp.out(probs), topk_idx, mp.out(topk_w), mp.in(logits), top_k, renormalize);
    }
    k::moe_route(probs.f32(), topk_idx.i32(), topk_w.f32(), logits.f32(), d.N, d.E, d.k,
                 renormalize);
  }
  void moe_route_backward(Tensor& dlogits, const Tensor& dtopk_w, const Tensor& dprobs_expert,
                          const Tensor& probs, const Tensor& topk_idx, bool renormalize) override {
    const MoeDims d = moe_route_backward_dims(dlogits, dtopk_w, dprobs_expert, probs, topk_idx);
    const bool expert_f32 = !dprobs_expert.defined() || is_f32(dprobs_expert);
    if (!all_f32(dlogits, dtopk_w, probs) || !expert_f32) {
      MixedPrecisionScope mp(*this);
      return moe_route_backward(mp.out(dlogits), mp.in(dtopk_w),
                                dprobs_expert.defined() ? mp.in(dprobs_expert) : dprobs_expert,
                                mp.in(probs), topk_idx, renormalize);
    }
    expect_expert_indices(topk_idx, d.E, "moe_route topk_idx");
    k::moe_route_backward(dlogits.f32(), dtopk_w.f32(),
                          dprobs_expert.defined() ? dprobs_expert.f32() : nullptr, probs.f32(),
                          topk_idx.i32(), d.N, d.E, d.k, renormalize);
  }
  void moe_dispatch_plan(Tensor& dest_row, Tensor& counts, Tensor& routed, const Tensor& topk_idx,
                         const Tensor& topk_w, int num_experts, int64_t capacity) override {
    const MoeDims d = moe_dispatch_dims(dest_row, counts, routed, topk_idx, topk_w, num_experts);
    if (!all_f32(topk_w)) {
      MixedPrecisionScope mp(*this);
      return moe_dispatch_plan(dest_row, counts, routed, topk_idx, mp.in(topk_w), num_experts,
                               capacity);
    }
    expect_expert_indices(topk_idx, d.E, "moe_dispatch_plan topk_idx");
    k::moe_dispatch_plan(dest_row.i32(), counts.i32(), routed.i32(), topk_idx.i32(), topk_w.f32(),
                         d.N, d.k, d.E, capacity);
  }
  void moe_permute(Tensor& xp, const Tensor& x, const Tensor& dest_row) override {
    const MoeRowDims d = moe_row_dims(x, xp, dest_row, "moe_permute x", "moe_permute xp");
    if (xp.dtype() != x.dtype()) {  // a copy within one type moves bits; a mix is widened
      MixedPrecisionScope mp(*this);
      return moe_permute(mp.out(xp), mp.in(x), dest_row);
    }
    expect_dest_rows(dest_row, d.R);
    k::moe_permute(xp.data(), x.data(), dtype_size(x.dtype()), dest_row.i32(), d.N, d.k, d.C);
  }
  void moe_permute_backward(Tensor& dx, const Tensor& dxp, const Tensor& dest_row) override {
    const MoeRowDims d = moe_row_dims(dx, dxp, dest_row, "moe_permute dx", "moe_permute dxp");
    if (!all_f32(dx, dxp)) {
      MixedPrecisionScope mp(*this);
      return moe_permute_backward(mp.out(dx), mp.in(dxp), dest_row);
    }
    expect_dest_rows(dest_row, d.R);
    k::moe_permute_backward(dx.f32(), dxp.f32(), dest_row.i32(), d.N, d.k, d.C);
  }
  void moe_unpermute(Tensor& out, const Tensor& y, const Tensor& dest_row,
                     const Tensor& topk_w) override {
    const MoeRowDims d = moe_row_dims(out, y, dest_row, "moe_unpermute out", "moe_unpermute y");
    expect_moe_weights(topk_w, d, "moe_unpermute topk_w");
    if (!all_f32(out, y, topk_w)) {
      MixedPrecisionScope mp(*this);
      return moe_unpermute(mp.out(out), mp.in(y), dest_row, mp.in(topk_w));
    }
    expect_dest_rows(dest_row, d.R);
    k::moe_unpermute(out.f32(), y.f32(), dest_row.i32(), topk_w.f32(), d.N, d.k, d.C);
  }
  void moe_unpermute_backward(Tensor& dy, Tensor& dtopk_w, const Tensor& dout, const Tensor& y,
                              const Tensor& dest_row, const Tensor& topk_w) override {
    const MoeRowDims d = moe_row_dims(dout, y, dest_row, "moe_unpermute dout", "moe_unpermute y");
    expect_moe_weights(topk_w, d, "moe_unpermute topk_w");
    expect_moe_weights(dtopk_w, d, "moe_unpermute dtopk_w");
    expect_float(dy, "moe_unpermute dy");
    expect_numel(dy, y.numel(), "moe_unpermute dy");
    if (!all_f32(dy, dtopk_w, dout, y, topk_w)) {
      MixedPrecisionScope mp(*this);
      return moe_unpermute_backward(mp.out(dy), mp.out(dtopk_w), mp.in(dout), mp.in(y), dest_row,
                                    mp.in(topk_w));
    }
    expect_dest_rows(dest_row, d.R);
    k::moe_unpermute_backward(dy.f32(), dtopk_w.f32(), dout.f32(), y.f32(), dest_row.i32(),
                              topk_w.f32(), d.N, d.k, d.C);
  }
  void moe_prob_sums(Tensor& sums, const Tensor& probs) override {
    const MoeDims d = moe_prob_sums_dims(sums, probs);
    if (!all_f32(sums, probs)) {
      MixedPrecisionScope mp(*this);
      return moe_prob_sums(mp.out(sums), mp.in(probs));
    }
    k::moe_prob_sums(sums.f32(), probs.f32(), d.N, d.E);
  }

  void kv_cache_append(Tensor& q, Tensor& k_cache, Tensor& v_cache, const Tensor& qkv, int NH,
                       int KVH, int64_t pos0) override {
    if (!all_f32(q, k_cache, v_cache, qkv)) {
      MixedPrecisionScope mp(*this);
      return kv_cache_append(mp.out(q), mp.out(k_cache), mp.out(v_cache), mp.in(qkv), NH, KVH,
                             pos0);
    }
    const KvCacheDims a = kv_cache_append_dims(q, k_cache, v_cache, qkv, NH, KVH, pos0);
    const int64_t S_max = a.S_max;
    const int64_t W = (NH + 2 * int64_t{KVH}) * a.HS, kv = int64_t{KVH} * a.HS,
                  qw = int64_t{NH} * a.HS;
    for (int64_t b = 0; b < a.B; ++b)
      for (int64_t t = 0; t < a.T; ++t) {
        const float* row = qkv.f32() + (b * a.T + t) * W;
        std::copy(row, row + qw, q.f32() + (b * a.T + t) * qw);
        const int64_t at = (b * S_max + pos0 + t) * kv;
        std::copy(row + qw, row + qw + kv, k_cache.f32() + at);
        std::copy(row + qw + kv, row + W, v_cache.f32() + at);
      }
  }
  void attention_decode(Tensor& out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                        int NH, int KVH, int64_t pos0) override {
    if (!all_f32(out, q, k_cache, v_cache)) {
      MixedPrecisionScope mp(*this);
      return attention_decode(mp.out(out), mp.in(q), mp.in(k_cache), mp.in(v_cache), NH, KVH, pos0);
    }
    const KvCacheDims d = attention_decode_dims(out, q, k_cache, v_cache, NH, KVH, pos0);
    k::attention_decode(out.f32(), q.f32(), k_cache.f32(), v_cache.f32(), as_int(d.B), as_int(d.T),
                        as_int(d.S_max), NH, KVH, as_int(d.HS), as_int(pos0));
  }

  void embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor* wpe,
                         int vocab_start) override {
    if (!all_f32(out, wte, wpe)) {
      MixedPrecisionScope mp(*this);
      return embedding_forward(mp.out(out), tokens, mp.in(wte), mp.in(wpe), vocab_start);
    }
    const EmbeddingDims d = embedding_dims(out, tokens, wte, wpe, "embedding out");
    k::embedding_forward(out.f32(), tokens.i32(), wte.f32(), wpe ? wpe->f32() : nullptr,
                         as_int(d.B), as_int(d.S), as_int(d.C), vocab_start, as_int(wte.size(0)));
  }
  void embedding_backward(Tensor& dwte, Tensor* dwpe, const Tensor& dout, const Tensor& tokens,
                          int vocab_start) override {
    if (!all_f32(dwte, dwpe, dout)) {
      MixedPrecisionScope mp(*this);
      return embedding_backward(mp.out(dwte), mp.out(dwpe), mp.in(dout), tokens, vocab_start);
    }
    const EmbeddingDims d = embedding_dims(dout, tokens, dwte, dwpe, "embedding dout");
    k::embedding_backward(dwte.f32(), dwpe ? dwpe->f32() : nullptr, dout.f32(), tokens.i32(),
                          as_int(d.B), as_int(d.S), as_int(d.C), vocab_start, as_int(dwte.size(0)));
  }

  // Two passes over each row (max, then Σexp): the reference the GPU's online pass is held to.
  void ce_row_stats(Tensor& row_max, Tensor& row_sumexp, const Tensor& logits, int valid) override {
    if (!all_f32(row_max, row_sumexp, logits)) {
      MixedPrecisionScope mp(*this);
      return ce_row_stats(mp.out(row_max), mp.out(row_sumexp), mp.in(logits), valid);
    }
    const int N = as_int(ce_row_stats_rows(row_max, row_sumexp, logits)), ld = ce_ld(logits, valid);
    k::ce_row_max(row_max.f32(), logits.f32(), N, ld, valid);
    k::ce_row_sumexp(row_sumexp.f32(), logits.f32(), row_max.f32(), N, ld, valid);
  }
  void ce_rescale_sumexp(Tensor& row_sumexp, const Tensor& local_max,
                         const Tensor& row_max) override {
    if (!all_f32(row_sumexp, local_max, row_max)) {
      MixedPrecisionScope mp(*this);
      return ce_rescale_sumexp(mp.out(row_sumexp), mp.in(local_max), mp.in(row_max));
    }
    const int64_t N = ce_rescale_rows(row_sumexp, local_max, row_max);
    k::ce_rescale_sumexp(row_sumexp.f32(), local_max.f32(), row_max.f32(), as_int(N));
  }
  void ce_target_logit(Tensor& target_logit, const Tensor& logits, const Tensor& targets,
                       int vocab_start, int valid) override {
    if (!all_f32(target_logit, logits)) {
      MixedPrecisionScope mp(*this);
      return ce_target_logit(mp.out(target_logit), mp.in(logits), targets, vocab_start, valid);
    }
    const int64_t N = ce_target_rows(target_logit, logits, targets);
    k::ce_target_logit(target_logit.f32(), logits.f32(), targets.i32(), as_int(N),
                       ce_ld(logits, valid), vocab_start, valid);
  }
  void ce_losses(Tensor& losses, const Tensor& row_max, const Tensor& row_sumexp,
                 const Tensor& target_logit, const Tensor* weights) override {
    expect_row_weights(weights, losses.numel(), "ce weights");
    if (!all_f32(losses, row_max, row_sumexp, target_logit)) {
      MixedPrecisionScope mp(*this);
      return ce_losses(mp.out(losses), mp.in(row_max), mp.in(row_sumexp), mp.in(target_logit),
                       weights);
    }
    const int64_t N = ce_losses_rows(losses, row_max, row_sumexp, target_logit);
    k::ce_losses(losses.f32(), row_max.f32(), row_sumexp.f32(), target_logit.f32(),
                 weights ? weights->f32() : nullptr, as_int(N));
  }
  void ce_backward(Tensor& dlogits, const Tensor& logits, const Tensor& row_max,
                   const Tensor& row_sumexp, const Tensor& targets, float scale, int vocab_start,
                   int valid, const Tensor* weights) override {
    expect_row_weights(weights, rows(logits), "ce weights");
    if (!all_f32(dlogits, logits, row_max, row_sumexp)) {
      MixedPrecisionScope mp(*this);
      return ce_backward(mp.out(dlogits), mp.in(logits), mp.in(row_max), mp.in(row_sumexp), targets,
                         scale, vocab_start, valid, weights);
    }
    const int64_t N = ce_backward_rows(dlogits, logits, row_max, row_sumexp, targets);
    k::ce_backward(dlogits.f32(), logits.f32(), row_max.f32(), row_sumexp.f32(), targets.i32(),
                   weights ? weights->f32() : nullptr, scale, as_int(N), ce_ld(logits, valid),
                   vocab_start, valid);
  }

  void seq_interleave(Tensor& out, const Tensor& chunks, int t) override {
    seq_permute(out, chunks, t, /*to_chunks=*/false);
  }
  void seq_deinterleave(Tensor& chunks, const Tensor& in, int t) override {
    seq_permute(in, chunks, t, /*to_chunks=*/true);
  }

  void add_inplace(Tensor& y, const Tensor& x) override {
    if (!all_f32(y, x)) {
      MixedPrecisionScope mp(*this);
      return add_inplace(mp.out(y), mp.in(x));
    }
    expect_numel(x, y.numel(), "add_inplace operand");
    k::add_inplace(y.f32(), x.f32(), static_cast<size_t>(y.numel()));
  }
  void add(Tensor& out, const Tensor& a, const Tensor& b) override {
    if (!all_f32(out, a, b)) {
      MixedPrecisionScope mp(*this);
      return add(mp.out(out), mp.in(a), mp.in(b));
    }
    expect_numel(a, out.numel(), "add operand a");
    expect_numel(b, out.numel(), "add operand b");
    k::add(out.f32(), a.f32(), b.f32(), static_cast<size_t>(out.numel()));
  }
  void scale_inplace(Tensor& y, float s) override {
    if (!all_f32(y)) {
      MixedPrecisionScope mp(*this);
      return scale_inplace(mp.out(y), s);
    }
    k::scale_inplace(y.f32(), s, static_cast<size_t>(y.numel()));
  }
  double sum_squares_multi(const std::vector<Tensor>& xs) override {
    double s = 0;
    for (const Tensor& x : xs) {
      MixedPrecisionScope mp(*this);  // f32 passes through; bf16 is widened
      s += k::sum_squares(mp.in(x).f32(), static_cast<size_t>(x.numel()));
    }
    return s;
  }
  double sum(const Tensor& x) override {
    if (!all_f32(x)) {
      MixedPrecisionScope mp(*this);
      return sum(mp.in(x));
    }
    const float* p = x.f32();
    double s = 0;
    for (int64_t i = 0; i < x.numel(); ++i) s += p[i];
    return s;
  }

  void adamw_update_multi(const std::vector<AdamWRange>& ranges, const AdamWHyper& h) override {
    for (const AdamWRange& r : ranges) {
      expect_adamw_range(r);
      k::adamw_update(r.param.f32(), r.grad.f32(), r.m.f32(), r.v.f32(),
                      static_cast<size_t>(r.param.numel()), h.lr, h.beta1, h.beta2, h.eps,
                      r.decay ? h.weight_decay : 0.f, h.step, h.grad_scale);
    }
  }

 private:
  // bsc (B, S, C) <-> chunks (t, B, S/t, C); copies rows of C floats.
  static void seq_permute(const Tensor& bsc, const Tensor& chunks, int t, bool to_chunks) {
    const SeqChunkDims d = seq_chunk_dims(bsc, chunks, t);
    const int64_t B = d.B, S = d.S, C = d.C, Sl = S / t;
    const size_t es = dtype_size(bsc.dtype());
    char* a = static_cast<char*>(bsc.data());
    char* c = static_cast<char*>(chunks.data());
    const size_t row = static_cast<size_t>(C) * es;
#pragma omp parallel for collapse(2)
    for (int64_t r = 0; r < t; ++r)
      for (int64_t b = 0; b < B; ++b)
        for (int64_t s = 0; s < Sl; ++s) {
          char* x = a + static_cast<size_t>((b * S) + r * Sl + s) * row;
          char* y = c + static_cast<size_t>((r * B + b) * Sl + s) * row;
          if (to_chunks)
            std::memcpy(y, x, row);
          else
            std::memcpy(x, y, row);
        }
  }

  int threads_;
  // The mask's key lengths (B) on the host, checked to lie in [1, S]; null when every key counts.
  // A ring attention block's operands: qkv's sizes, where the keys and values lie (inside qkv,
  // or a (B, S_k, 2·KVH·HS) block) and the kernels' layout of the buffers (whole rows; the
  // callers offset the pointers to the block's first rows).
  // A block's operands (backend_checks.h) as the CPU kernels' layout: its keys and values at
  // kv (inside the q/k/v, NH·HS in, or a received block).
  struct BlockGeometry {
    AttentionDims a;
    int64_t S_k = 0;
    const float* kv = nullptr;
    k::BlockLayout at;
  };
  static BlockGeometry block_geometry(const Tensor& qkv, const Tensor& kv,
                                      const AttentionBlock& blk) {
    const AttentionBlockDims d = attention_block_dims(qkv, kv, blk);
    BlockGeometry g;
    g.a = d.a;
    g.S_k = d.S_k;
    g.kv = kv.f32() + (d.inside ? d.q : 0);
    g.at.q_ld = d.W;
    g.at.q_batch = d.W * g.a.S;
    g.at.o_ld = d.q;
    g.at.o_batch = d.q * g.a.S;
    g.at.kv_ld = d.kv_ld;
    g.at.kv_batch = d.kv_ld * g.S_k;
    g.at.lse_ld = g.a.S;
    return g;
  }
  // The block's key lengths (keys of sequence b at block rows ≥ len[b] − k_offset are padding),
  // empty without a padding mask.
  static std::vector<int32_t> block_key_lengths(const AttentionBlock& blk, int64_t B) {
    std::vector<int32_t> len;
    if (!blk.key_lengths) return len;
    len.resize(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b)
      len[static_cast<size_t>(b)] = static_cast<int32_t>(blk.key_lengths->i32()[b] - blk.k_offset);
    return len;
  }
  // The layout of (B, S, NH·HS) rows and their (B, NH, S) f32 statistics.
  static k::BlockLayout rows_layout(const Tensor& out, const Tensor& stat, int num_heads,
                                    const char* what) {
    attention_rows_dims(out, stat, num_heads, what);
    k::BlockLayout at;
    at.o_ld = out.size(2);
    at.o_batch = out.size(2) * out.size(1);
    at.lse_ld = out.size(1);
    return at;
  }
  static const int32_t* key_lengths(const AttentionMask& mask, const AttentionDims& a) {
    if (!mask.key_lengths) return nullptr;
    const Tensor& len = *mask.key_lengths;
    expect_key_lengths(len, a.B);
    for (int64_t b = 0; b < a.B; ++b)
      STRATA_CHECK(len.i32()[b] >= 1 && len.i32()[b] <= a.S,
                   "attention key length " << len.i32()[b] << " of sequence " << b
                                           << " outside [1, " << a.S << "]");
    return len.i32();
  }

  // Every expert index in [0, E): the kernels index by them (the GPU trusts them instead of
  // reading them back).
  static void expect_expert_indices(const Tensor& idx, int E, const char* what) {
    const int32_t* p = idx.i32();
    for (int64_t i = 0; i < idx.numel(); ++i)
      STRATA_CHECK(p[i] >= 0 && p[i] < E,
                   what << " [" << i << "] = " << p[i] << " outside [0, " << E << ")");
  }
  // Every destination row −1 (dropped) or in [0, R).
  static void expect_dest_rows(const Tensor& dest_row, int64_t R) {
    const int32_t* p = dest_row.i32();
    for (int64_t i = 0; i < dest_row.numel(); ++i)
      STRATA_CHECK(p[i] >= -1 && p[i] < R,
                   "moe dest_row [" << i << "] = " << p[i] << " outside [-1, " << R << ")");
  }

  Tensor scratch_;  // attention backward scratch, (threads, S, S)
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int threads) {
  return std::make_unique<CpuBackend>(threads);
}

int resolve_cpu_threads(const std::optional<int>& configured, int ranks_on_node) {
  if (configured) return *configured;
  if (const char* env = std::getenv("OMP_NUM_THREADS")) {
    const int n = std::atoi(env);
    if (n >= 1) return n;
  }
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  const int per_rank = static_cast<int>(cores / std::max(1, ranks_on_node));
  return std::max(1, per_rank);
}

}  // namespace strata
