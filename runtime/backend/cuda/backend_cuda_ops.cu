// backend_cuda_ops.cu — the CUDA backend's other ops (backend_cuda.h), each a kernel of
// kernels/cuda (one header per op family): LayerNorm and RMSNorm (over rows, and over the query
// and key heads of a q/k/v), GELU, tanh and SwiGLU, the embedding, the vocab-parallel
// cross-entropy steps, the sequence-parallel layout changes, elementwise ops and reductions, and
// the multi-tensor AdamW. An op whose operands are not the types its kernel reads and writes goes
// through MixedPrecisionScope (widened to f32).
#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/gelu.h"
#include "kernels/cuda/layernorm.h"
#include "kernels/cuda/optim.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/seq_permute.h"
#include "kernels/cuda/swiglu.h"
#include "runtime/backend/cuda/backend_cuda.h"

namespace strata::cuda_backend {

// ---- norms ----

void CudaBackend::layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& inp,
                                    const Tensor& w, const Tensor& b, float eps) {
  if (!same_dtype(out, inp) || !same_dtype(w, b) || !all_f32(mean, rstd)) {
    MixedPrecisionScope mp(*this);
    return layernorm_forward(mp.out(out), mp.out(mean), mp.out(rstd), mp.in(inp), mp.in(w),
                             mp.in(b), eps);
  }
  const auto [N, C] = layernorm_forward_dims(out, mean, rstd, inp, w, b);
  CUDA_CHECK(kc::layernorm_forward(out.data(), mean.f32(), rstd.f32(), inp.data(), et(inp),
                                   w.data(), b.data(), et(w), N, as_int(C), eps, stream_));
}

void CudaBackend::layernorm_backward(Tensor& dinp, Tensor& dw, Tensor& db, const Tensor& dout,
                                     const Tensor& inp, const Tensor& w, const Tensor& mean,
                                     const Tensor& rstd) {
  if (!all_same_dtype(dinp, dout, inp) || !all_f32(dw, db, mean, rstd)) {
    MixedPrecisionScope mp(*this);
    return layernorm_backward(mp.out(dinp), mp.out(dw), mp.out(db), mp.in(dout), mp.in(inp),
                              mp.in(w), mp.in(mean), mp.in(rstd));
  }
  const auto [N, C] = layernorm_backward_dims(dinp, dw, db, dout, inp, w, mean, rstd);
  CUDA_CHECK(kc::layernorm_backward(dinp.data(), dw.f32(), db.f32(), dout.data(), inp.data(),
                                    et(inp), w.data(), et(w), mean.f32(), rstd.f32(), N, as_int(C),
                                    stream_));
}

void CudaBackend::rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& inp, const Tensor& w,
                                  float eps) {
  if (!same_dtype(out, inp) || !is_f32(rstd)) {
    MixedPrecisionScope mp(*this);
    return rmsnorm_forward(mp.out(out), mp.out(rstd), mp.in(inp), mp.in(w), eps);
  }
  const auto [N, C] = rmsnorm_forward_dims(out, rstd, inp, w);
  CUDA_CHECK(kc::rmsnorm_forward(out.data(), rstd.f32(), inp.data(), et(inp), w.data(), et(w), eps,
                                 N, as_int(C), stream_));
}

void CudaBackend::rmsnorm_backward(Tensor& dinp, Tensor& dw, const Tensor& dout, const Tensor& inp,
                                   const Tensor& w, const Tensor& rstd) {
  if (!all_same_dtype(dinp, dout, inp) || !all_f32(dw, rstd)) {
    MixedPrecisionScope mp(*this);
    return rmsnorm_backward(mp.out(dinp), mp.out(dw), mp.in(dout), mp.in(inp), mp.in(w),
                            mp.in(rstd));
  }
  const auto [N, C] = rmsnorm_backward_dims(dinp, dw, dout, inp, w, rstd);
  CUDA_CHECK(kc::rmsnorm_backward(dinp.data(), dw.f32(), dout.data(), inp.data(), et(inp), w.data(),
                                  et(w), rstd.f32(), N, as_int(C), stream_));
}

// The query and key heads of qkv (B, S, NH + 2·KVH, HS), in place. The kernels read the
// activations in one type and both weights in one type, rstd and the weight gradients in f32; any
// other mix is widened.
void CudaBackend::qk_rmsnorm_forward(Tensor& qkv, Tensor& rstd, const Tensor& q_weight,
                                     const Tensor& k_weight, int NH, int KVH, float eps) {
  const AttentionDims d = qk_rmsnorm_dims(qkv, rstd, q_weight, k_weight, NH, KVH, "qk_rmsnorm qkv");
  if (!same_dtype(q_weight, k_weight) || !is_f32(rstd)) {
    MixedPrecisionScope mp(*this);
    return qk_rmsnorm_forward(mp.out(qkv), mp.out(rstd), mp.in(q_weight), mp.in(k_weight), NH, KVH,
                              eps);
  }
  CUDA_CHECK(kc::qk_rmsnorm_forward(qkv.data(), et(qkv), rstd.f32(), q_weight.data(),
                                    k_weight.data(), et(q_weight), eps, d.B * d.S, NH, KVH,
                                    as_int(d.HS), stream_));
}

void CudaBackend::qk_rmsnorm_backward(Tensor& dqkv, Tensor& dq_weight, Tensor& dk_weight,
                                      const Tensor& x, const Tensor& q_weight,
                                      const Tensor& k_weight, const Tensor& rstd, int NH, int KVH) {
  const AttentionDims d =
      qk_rmsnorm_backward_dims(dqkv, dq_weight, dk_weight, x, q_weight, k_weight, rstd, NH, KVH);
  if (!same_dtype(dqkv, x) || !same_dtype(q_weight, k_weight) ||
      !all_f32(dq_weight, dk_weight, rstd)) {
    MixedPrecisionScope mp(*this);
    return qk_rmsnorm_backward(mp.out(dqkv), mp.out(dq_weight), mp.out(dk_weight), mp.in(x),
                               mp.in(q_weight), mp.in(k_weight), mp.in(rstd), NH, KVH);
  }
  CUDA_CHECK(kc::qk_rmsnorm_backward(dqkv.data(), dq_weight.f32(), dk_weight.f32(), x.data(), et(x),
                                     q_weight.data(), k_weight.data(), et(q_weight), rstd.f32(),
                                     d.B * d.S, NH, KVH, as_int(d.HS), stream_));
}

// ---- activations ----

void CudaBackend::gelu_forward(Tensor& out, const Tensor& inp, GeluKind kind) {
  if (!same_dtype(out, inp)) {
    MixedPrecisionScope mp(*this);
    return gelu_forward(mp.out(out), mp.in(inp), kind);
  }
  expect_numel(out, inp.numel(), "gelu out");
  CUDA_CHECK((kind == GeluKind::kErf ? kc::gelu_erf_forward : kc::gelu_forward)(
      out.data(), inp.data(), et(inp), inp.numel(), stream_));
}

void CudaBackend::gelu_backward(Tensor& dinp, const Tensor& inp, const Tensor& dout,
                                GeluKind kind) {
  if (!all_same_dtype(dinp, inp, dout)) {
    MixedPrecisionScope mp(*this);
    return gelu_backward(mp.out(dinp), mp.in(inp), mp.in(dout), kind);
  }
  expect_numel(dinp, inp.numel(), "gelu dinp");
  expect_numel(dout, inp.numel(), "gelu dout");
  CUDA_CHECK((kind == GeluKind::kErf ? kc::gelu_erf_backward : kc::gelu_backward)(
      dinp.data(), inp.data(), dout.data(), et(inp), inp.numel(), stream_));
}

void CudaBackend::tanh_forward(Tensor& out, const Tensor& inp) {
  if (!same_dtype(out, inp)) {
    MixedPrecisionScope mp(*this);
    return tanh_forward(mp.out(out), mp.in(inp));
  }
  expect_numel(out, inp.numel(), "tanh out");
  CUDA_CHECK(kc::tanh_forward(out.data(), inp.data(), et(inp), inp.numel(), stream_));
}

void CudaBackend::tanh_backward(Tensor& dinp, const Tensor& out, const Tensor& dout) {
  if (!all_same_dtype(dinp, out, dout)) {
    MixedPrecisionScope mp(*this);
    return tanh_backward(mp.out(dinp), mp.in(out), mp.in(dout));
  }
  expect_numel(dinp, out.numel(), "tanh dinp");
  expect_numel(dout, out.numel(), "tanh dout");
  CUDA_CHECK(
      kc::tanh_backward(dinp.data(), out.data(), dout.data(), et(out), out.numel(), stream_));
}

void CudaBackend::swiglu_forward(Tensor& out, const Tensor& gate_up) {
  if (!same_dtype(out, gate_up)) {
    MixedPrecisionScope mp(*this);
    return swiglu_forward(mp.out(out), mp.in(gate_up));
  }
  const auto [N, F] = swiglu_dims(out, gate_up, "swiglu out");
  CUDA_CHECK(kc::swiglu_forward(out.data(), gate_up.data(), et(gate_up), N, as_int(F), stream_));
}

void CudaBackend::swiglu_backward(Tensor& dgate_up, const Tensor& dout, const Tensor& gate_up) {
  if (!all_same_dtype(dgate_up, dout, gate_up)) {
    MixedPrecisionScope mp(*this);
    return swiglu_backward(mp.out(dgate_up), mp.in(dout), mp.in(gate_up));
  }
  const auto [N, F] = swiglu_backward_dims(dgate_up, dout, gate_up);
  CUDA_CHECK(kc::swiglu_backward(dgate_up.data(), dout.data(), gate_up.data(), et(gate_up), N,
                                 as_int(F), stream_));
}

// ---- embedding ----

void CudaBackend::embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& wte,
                                    const Tensor* wpe, int vocab_start) {
  if (!same_dtype(wte, wpe)) {
    MixedPrecisionScope mp(*this);
    return embedding_forward(mp.out(out), tokens, mp.in(wte), mp.in(wpe), vocab_start);
  }
  const auto [B, S, C] = embedding_dims(out, tokens, wte, wpe, "embedding out");
  CUDA_CHECK(kc::embedding_forward(out.data(), et(out), tokens.i32(), wte.data(),
                                   wpe ? wpe->data() : nullptr, et(wte), as_int(B), as_int(S),
                                   as_int(C), vocab_start, as_int(wte.size(0)), stream_));
}

void CudaBackend::embedding_backward(Tensor& dwte, Tensor* dwpe, const Tensor& dout,
                                     const Tensor& tokens, int vocab_start) {
  if (!all_f32(dwte, dwpe)) {
    MixedPrecisionScope mp(*this);
    return embedding_backward(mp.out(dwte), mp.out(dwpe), mp.in(dout), tokens, vocab_start);
  }
  const auto [B, S, C] = embedding_dims(dout, tokens, dwte, dwpe, "embedding dout");
  CUDA_CHECK(kc::embedding_backward(dwte.f32(), dwpe ? dwpe->f32() : nullptr, dout.data(), et(dout),
                                    tokens.i32(), as_int(B), as_int(S), as_int(C), vocab_start,
                                    as_int(dwte.size(0)), stream_));
}

// ---- vocab-parallel cross-entropy steps ----
// Logits may be f32 or bf16; row statistics are f32 (anything else is widened).

void CudaBackend::ce_row_stats(Tensor& row_max, Tensor& row_sumexp, const Tensor& logits,
                               int valid) {
  if (!all_f32(row_max, row_sumexp)) {
    MixedPrecisionScope mp(*this);
    return ce_row_stats(mp.out(row_max), mp.out(row_sumexp), logits, valid);
  }
  const int64_t N = ce_row_stats_rows(row_max, row_sumexp, logits);
  CUDA_CHECK(kc::ce_row_stats(row_max.f32(), row_sumexp.f32(), logits.data(), et(logits), N,
                              ce_ld(logits, valid), valid, stream_));
}

void CudaBackend::ce_rescale_sumexp(Tensor& row_sumexp, const Tensor& local_max,
                                    const Tensor& row_max) {
  if (!all_f32(row_sumexp, local_max, row_max)) {
    MixedPrecisionScope mp(*this);
    return ce_rescale_sumexp(mp.out(row_sumexp), mp.in(local_max), mp.in(row_max));
  }
  const int64_t N = ce_rescale_rows(row_sumexp, local_max, row_max);
  CUDA_CHECK(kc::ce_rescale_sumexp(row_sumexp.f32(), local_max.f32(), row_max.f32(), N, stream_));
}

void CudaBackend::ce_target_logit(Tensor& target_logit, const Tensor& logits, const Tensor& targets,
                                  int vocab_start, int valid) {
  if (!is_f32(target_logit)) {
    MixedPrecisionScope mp(*this);
    return ce_target_logit(mp.out(target_logit), logits, targets, vocab_start, valid);
  }
  const int64_t N = ce_target_rows(target_logit, logits, targets);
  CUDA_CHECK(kc::ce_target_logit(target_logit.f32(), logits.data(), et(logits), targets.i32(), N,
                                 ce_ld(logits, valid), vocab_start, valid, stream_));
}

void CudaBackend::ce_losses(Tensor& losses, const Tensor& row_max, const Tensor& row_sumexp,
                            const Tensor& target_logit, const Tensor* weights) {
  expect_row_weights(weights, losses.numel(), "ce weights");
  if (!all_f32(losses, row_max, row_sumexp, target_logit)) {
    MixedPrecisionScope mp(*this);
    return ce_losses(mp.out(losses), mp.in(row_max), mp.in(row_sumexp), mp.in(target_logit),
                     weights);
  }
  const int64_t N = ce_losses_rows(losses, row_max, row_sumexp, target_logit);
  CUDA_CHECK(kc::ce_losses(losses.f32(), row_max.f32(), row_sumexp.f32(), target_logit.f32(),
                           weights ? weights->f32() : nullptr, N, stream_));
}

// dlogits may be the logits tensor itself (the kernel reads each element before writing it).
void CudaBackend::ce_backward(Tensor& dlogits, const Tensor& logits, const Tensor& row_max,
                              const Tensor& row_sumexp, const Tensor& targets, float scale,
                              int vocab_start, int valid, const Tensor* weights) {
  const int64_t N = rows(logits);
  expect_row_weights(weights, N, "ce weights");
  if (!all_f32(row_max, row_sumexp)) {
    MixedPrecisionScope mp(*this);
    return ce_backward(dlogits, logits, mp.in(row_max), mp.in(row_sumexp), targets, scale,
                       vocab_start, valid, weights);
  }
  ce_backward_rows(dlogits, logits, row_max, row_sumexp, targets);
  CUDA_CHECK(kc::ce_backward(dlogits.data(), et(dlogits), logits.data(), et(logits), row_max.f32(),
                             row_sumexp.f32(), targets.i32(), weights ? weights->f32() : nullptr,
                             scale, N, ce_ld(logits, valid), vocab_start, valid, stream_));
}

// ---- sequence-parallel layout changes ----

void CudaBackend::seq_interleave(Tensor& out, const Tensor& chunks, int t) {
  if (!same_dtype(out, chunks)) {
    MixedPrecisionScope mp(*this);
    return seq_interleave(mp.out(out), mp.in(chunks), t);
  }
  seq_permute(out, chunks, t, /*to_chunks=*/false);
}

void CudaBackend::seq_deinterleave(Tensor& chunks, const Tensor& in, int t) {
  if (!same_dtype(chunks, in)) {
    MixedPrecisionScope mp(*this);
    return seq_deinterleave(mp.out(chunks), mp.in(in), t);
  }
  seq_permute(in, chunks, t, /*to_chunks=*/true);
}

// ---- elementwise and reductions (any mix of f32 / bf16) ----

void CudaBackend::add_inplace(Tensor& y, const Tensor& x) {
  expect_numel(x, y.numel(), "add_inplace operand");
  CUDA_CHECK(kc::add_inplace(y.data(), et(y), x.data(), et(x), y.numel(), stream_));
}

void CudaBackend::add(Tensor& out, const Tensor& a, const Tensor& b) {
  expect_numel(a, out.numel(), "add operand");
  expect_numel(b, out.numel(), "add operand");
  CUDA_CHECK(kc::add(out.data(), et(out), a.data(), et(a), b.data(), et(b), out.numel(), stream_));
}

void CudaBackend::scale_inplace(Tensor& y, float s) {
  CUDA_CHECK(kc::scale_inplace(y.data(), et(y), s, y.numel(), stream_));
}

double CudaBackend::sum_squares_multi(const std::vector<Tensor>& xs) {
  std::vector<kc::SumSquaresSegment> segs;
  segs.reserve(xs.size());
  for (const Tensor& x : xs) segs.push_back({x.data(), et(x), x.numel()});
  CUDA_CHECK(cudaMemsetAsync(dsum_, 0, sizeof(double), stream_));
  CUDA_CHECK(
      kc::sum_squares_multi_tensor(dsum_, segs.data(), static_cast<int>(segs.size()), stream_));
  return read_dsum();
}

double CudaBackend::sum(const Tensor& x) {
  CUDA_CHECK(cudaMemsetAsync(dsum_, 0, sizeof(double), stream_));
  CUDA_CHECK(kc::sum(dsum_, x.data(), et(x), x.numel(), /*square=*/false, stream_));
  return read_dsum();
}

// ---- optimizer ----
// The f32 master parameters, gradients and moments: every range in one multi-tensor kernel
// call (kernels/cuda/optim.h), which launches once per few dozen ranges.
void CudaBackend::adamw_update_multi(const std::vector<AdamWRange>& ranges, const AdamWHyper& h) {
  std::vector<kc::AdamWSegment> segs;
  segs.reserve(ranges.size());
  for (const AdamWRange& r : ranges) {
    STRATA_CHECK(all_f32(r.param, r.grad, r.m, r.v),
                 "adamw: parameters, gradients and moments are f32 (fp32 master weights)");
    expect_adamw_range(r);
    kc::AdamWSegment seg;
    seg.param = r.param.f32(), seg.grad = r.grad.f32(), seg.m = r.m.f32(), seg.v = r.v.f32();
    seg.n = r.param.numel();
    seg.decay = r.decay;
    segs.push_back(seg);
  }
  kc::AdamWHyper k;
  k.lr = h.lr, k.beta1 = h.beta1, k.beta2 = h.beta2, k.eps = h.eps;
  k.weight_decay = h.weight_decay, k.step = h.step, k.grad_scale = h.grad_scale;
  CUDA_CHECK(kc::adamw_multi_tensor(segs.data(), static_cast<int>(segs.size()), k, stream_));
}

// ---- helpers ----

void CudaBackend::seq_permute(const Tensor& bsc, const Tensor& chunks, int t, bool to_chunks) {
  const auto [B, S, C] = seq_chunk_dims(bsc, chunks, t);
  CUDA_CHECK(kc::seq_permute(bsc.data(), chunks.data(), dtype_size(bsc.dtype()), B, S, C, t,
                             to_chunks, stream_));
}

double CudaBackend::read_dsum() {
  double h = 0;
  CUDA_CHECK(cudaMemcpyAsync(&h, dsum_, sizeof(double), cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  return h;
}

}  // namespace strata::cuda_backend
