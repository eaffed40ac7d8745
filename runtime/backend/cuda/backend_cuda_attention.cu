// backend_cuda_attention.cu — the CUDA backend's attention (backend_cuda.h): the fused
// flash-style kernels of kernels/cuda/flash_attention.h, or cuDNN's fused flash attention in bf16
// when train.attention_backend asks for it (the same layouts and log-sum-exp `saved`, so a
// forward on one and a backward on the other agree); RoPE; the key/value cache and the decode
// attention of generation.
#include <stdexcept>
#include <string>

#include "kernels/cuda/attention_block.h"
#include "kernels/cuda/attention_decode.h"
#include "kernels/cuda/rope.h"
#include "runtime/backend/cuda/backend_cuda.h"

namespace strata::cuda_backend {

// ---- attention core (fused; causal, or bidirectional over padded keys) ----

Shape CudaBackend::attention_saved_shape(int64_t B, int num_heads, int64_t S) const {
  return {B, num_heads, S};
}

void CudaBackend::attention_forward(Tensor& out, Tensor& saved, const Tensor& qkv, int NH, int KVH,
                                    const AttentionMask& mask) {
  if (!same_dtype(out, qkv) || !is_f32(saved)) {
    MixedPrecisionScope mp(*this);
    return attention_forward(mp.out(out), mp.out(saved), mp.in(qkv), NH, KVH, mask);
  }
  const AttentionShape a = attention_shape(qkv, NH, KVH);
  expect_numel(out, a.B * a.S * a.NH * a.HS, "attention out");
  expect_shape(saved, attention_saved_shape(a.B, a.NH, a.S), "attention saved log-sum-exp");
  const kc::FlashMask m = flash_mask(mask, a);
  if (use_cudnn(qkv, a, m)) {
    Tensor ws = workspace(cudnn_->forward_workspace_bytes(et(qkv), a.B, a.S, a.NH, a.KVH, a.HS, m));
    CUDNN_CHECK(cudnn_->forward(out.data(), saved.f32(), qkv.data(), et(qkv), a.B, a.S, a.NH, a.KVH,
                                a.HS, ws.data(), stream_, m));
    return;
  }
  CUDA_CHECK(kc::flash_attention_forward(out.data(), saved.f32(), qkv.data(), et(qkv), a.B, a.S,
                                         a.NH, a.KVH, a.HS, stream_, m));
}

void CudaBackend::attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                                     const Tensor& out, const Tensor& saved, int NH, int KVH,
                                     const AttentionMask& mask) {
  if (!all_same_dtype(dqkv, dout, qkv, out) || !is_f32(saved)) {
    MixedPrecisionScope mp(*this);
    return attention_backward(mp.out(dqkv), mp.in(dout), mp.in(qkv), mp.in(out), mp.in(saved), NH,
                              KVH, mask);
  }
  const AttentionShape a = attention_shape(qkv, NH, KVH);
  expect_numel(dqkv, qkv.numel(), "attention dqkv");
  expect_numel(dout, a.B * a.S * a.NH * a.HS, "attention dout");
  expect_numel(out, a.B * a.S * a.NH * a.HS, "attention out");
  expect_shape(saved, attention_saved_shape(a.B, a.NH, a.S), "attention saved log-sum-exp");
  const kc::FlashMask m = flash_mask(mask, a);
  if (use_cudnn(qkv, a, m)) {
    Tensor ws =
        workspace(cudnn_->backward_workspace_bytes(et(qkv), a.B, a.S, a.NH, a.KVH, a.HS, m));
    CUDNN_CHECK(cudnn_->backward(dqkv.data(), dout.data(), qkv.data(), out.data(), saved.f32(),
                                 et(qkv), a.B, a.S, a.NH, a.KVH, a.HS, ws.data(), stream_, m));
    return;
  }
  const size_t bytes = kc::flash_attention_backward_scratch_bytes(a.B, a.S, a.NH, a.KVH, a.HS);
  Tensor scratch = empty({static_cast<int64_t>(bytes / sizeof(float))}, MemCategory::kBuffers);
  CUDA_CHECK(kc::flash_attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(),
                                          saved.f32(), et(qkv), a.B, a.S, a.NH, a.KVH, a.HS,
                                          scratch.data(), stream_, m));
}

// ---- ring attention blocks (context parallelism) ----

void CudaBackend::attention_block_forward(Tensor& out, Tensor& lse, const Tensor& qkv,
                                          const Tensor& kv, const AttentionBlock& blk) {
  if (!all_same_dtype(out, qkv, kv)) {
    MixedPrecisionScope mp(*this);
    return attention_block_forward(mp.out(out), lse, mp.in(qkv), mp.in(kv), blk);
  }
  const AttentionBlockDims d = attention_block_dims(qkv, kv, blk);
  expect_numel(out, d.a.B * d.a.S * d.q, "attention block out");
  expect_f32(lse, d.a.B * blk.num_heads * d.a.S, "attention block lse");
  const kc::FlashRows r = block_rows(d, blk);
  const size_t es = dtype_size(qkv.dtype());
  const char* q = static_cast<const char*>(qkv.data()) + blk.q_rows.begin * d.W * es;
  const char* k = static_cast<const char*>(kv.data()) +
                  (blk.k_rows.begin * d.kv_ld + (d.inside ? d.q : 0)) * es;
  char* o = static_cast<char*>(out.data()) + blk.q_rows.begin * d.q * es;
  CUDA_CHECK(
      kc::attention_block_forward(o, lse.f32() + blk.q_rows.begin, q, k, et(qkv), r, stream_));
}

void CudaBackend::attention_block_merge(Tensor& out, Tensor& lse, const Tensor& out_b,
                                        const Tensor& lse_b, const AttentionBlock& blk) {
  if (!same_dtype(out, out_b)) {
    MixedPrecisionScope mp(*this);
    return attention_block_merge(mp.out(out), lse, mp.in(out_b), lse_b, blk);
  }
  const int64_t HS = attention_rows_dims(out, lse, blk.num_heads, "attention merge");
  expect_numel(out_b, out.numel(), "attention merge block out");
  expect_f32(lse_b, lse.numel(), "attention merge block lse");
  const int64_t S = out.size(1);
  STRATA_CHECK(blk.q_rows.begin >= 0 && blk.q_rows.begin + blk.q_rows.count <= S,
               "attention merge rows outside " << S);
  CUDA_CHECK(kc::attention_block_merge(
      out.data(), lse.f32(), out_b.data(), lse_b.f32(), et(out), as_int(out.size(0)), as_int(S),
      blk.num_heads, as_int(HS), as_int(blk.q_rows.begin), as_int(blk.q_rows.count), stream_));
}

void CudaBackend::attention_block_delta(Tensor& delta, const Tensor& dout, const Tensor& out,
                                        int num_heads) {
  if (!same_dtype(dout, out)) {
    MixedPrecisionScope mp(*this);
    return attention_block_delta(delta, mp.in(dout), mp.in(out), num_heads);
  }
  const int64_t HS = attention_rows_dims(out, delta, num_heads, "attention delta");
  expect_numel(dout, out.numel(), "attention delta dout");
  CUDA_CHECK(kc::attention_block_delta(delta.f32(), dout.data(), out.data(), et(out),
                                       as_int(out.size(0)), as_int(out.size(1)), num_heads,
                                       as_int(HS), stream_));
}

void CudaBackend::attention_block_backward(Tensor& dq, Tensor& dkv, const Tensor& dout,
                                           const Tensor& qkv, const Tensor& kv, const Tensor& lse,
                                           const Tensor& delta, const AttentionBlock& blk) {
  if (!all_same_dtype(dout, qkv, kv)) {
    MixedPrecisionScope mp(*this);
    return attention_block_backward(dq, dkv, mp.in(dout), mp.in(qkv), mp.in(kv), lse, delta, blk);
  }
  const AttentionBlockDims d = attention_block_dims(qkv, kv, blk);
  const int64_t rows = d.a.B * blk.num_heads * d.a.S;
  expect_f32(dq, d.a.B * d.a.S * d.q, "attention block dq");
  expect_f32(dkv, d.a.B * d.S_k * d.kv_ld, "attention block dkv");
  STRATA_CHECK(!d.inside, "attention block dkv of keys inside q/k/v");
  expect_numel(dout, dq.numel(), "attention block dout");
  expect_f32(lse, rows, "attention block lse");
  expect_f32(delta, rows, "attention block delta");
  const kc::FlashRows r = block_rows(d, blk);
  const size_t es = dtype_size(qkv.dtype());
  const int64_t q0 = blk.q_rows.begin, k0 = blk.k_rows.begin;
  CUDA_CHECK(kc::attention_block_backward(dq.f32() + q0 * d.q, dkv.f32() + k0 * d.kv_ld,
                                          static_cast<const char*>(dout.data()) + q0 * d.q * es,
                                          static_cast<const char*>(qkv.data()) + q0 * d.W * es,
                                          static_cast<const char*>(kv.data()) + k0 * d.kv_ld * es,
                                          lse.f32() + q0, delta.f32() + q0, et(qkv), r, stream_));
}

void CudaBackend::attention_kv_extract(Tensor& kv, const Tensor& qkv, int num_heads,
                                       int num_kv_heads) {
  const AttentionDims a = attention_dims(qkv, num_heads, num_kv_heads);
  const int64_t W = qkv.size(2), q = num_heads * a.HS;
  expect_numel(kv, a.B * a.S * (W - q), "attention kv");
  STRATA_CHECK(kv.dtype() == qkv.dtype(),
               "attention kv is " << to_string(kv.dtype()) << ", q/k/v " << to_string(qkv.dtype()));
  CUDA_CHECK(kc::attention_kv_extract(kv.data(), qkv.data(), et(qkv), a.B * a.S, W, q, stream_));
}

void CudaBackend::attention_qkv_assemble(Tensor& dqkv, const Tensor& dq, const Tensor& dkv,
                                         int num_heads, int num_kv_heads) {
  const AttentionDims a = attention_dims(dqkv, num_heads, num_kv_heads);
  const int64_t W = dqkv.size(2), q = num_heads * a.HS, n = W - q;
  expect_f32(dq, a.B * a.S * q, "attention dq");
  expect_f32(dkv, a.B * a.S * n, "attention dkv");
  CUDA_CHECK(kc::attention_qkv_assemble(dqkv.data(), dq.f32(), dkv.f32(), et(dqkv), a.B * a.S, q, n,
                                        stream_));
}

// ---- rotary embeddings ----

void CudaBackend::rope_forward(Tensor& qkv, const Tensor& cos_sin, int NH, int KVH) {
  rope(qkv, cos_sin, NH, KVH, false);
}

void CudaBackend::rope_backward(Tensor& dqkv, const Tensor& cos_sin, int NH, int KVH) {
  rope(dqkv, cos_sin, NH, KVH, true);
}

// ---- generation with a key/value cache ----

void CudaBackend::kv_cache_append(Tensor& q, Tensor& k_cache, Tensor& v_cache, const Tensor& qkv,
                                  int NH, int KVH, int64_t pos0) {
  if (!all_same_dtype(qkv, q, k_cache, v_cache)) {
    MixedPrecisionScope mp(*this);
    return kv_cache_append(mp.out(q), mp.out(k_cache), mp.out(v_cache), mp.in(qkv), NH, KVH, pos0);
  }
  const KvCacheDims a = kv_cache_append_dims(q, k_cache, v_cache, qkv, NH, KVH, pos0);
  CUDA_CHECK(kc::kv_cache_append(q.data(), k_cache.data(), v_cache.data(), qkv.data(), et(qkv),
                                 as_int(a.B), as_int(a.T), as_int(a.S_max), NH, KVH, as_int(a.HS),
                                 as_int(pos0), stream_));
}

void CudaBackend::attention_decode(Tensor& out, const Tensor& q, const Tensor& k_cache,
                                   const Tensor& v_cache, int NH, int KVH, int64_t pos0) {
  if (!all_same_dtype(q, out, k_cache, v_cache)) {
    MixedPrecisionScope mp(*this);
    return attention_decode(mp.out(out), mp.in(q), mp.in(k_cache), mp.in(v_cache), NH, KVH, pos0);
  }
  const KvCacheDims d = attention_decode_dims(out, q, k_cache, v_cache, NH, KVH, pos0);
  const int64_t B = d.B, T = d.T, HS = d.HS, S_max = d.S_max;
  STRATA_CHECK(HS <= kc::kDecodeMaxHeadSize, "head size " << HS << " exceeds the decode "
                                                          << "attention's maximum "
                                                          << kc::kDecodeMaxHeadSize);
  CUDA_CHECK(kc::attention_decode(out.data(), q.data(), k_cache.data(), v_cache.data(), et(q),
                                  as_int(B), as_int(T), as_int(S_max), NH, KVH, as_int(HS),
                                  as_int(pos0), stream_));
}

// ---- helpers ----

// Whether this attention runs on cuDNN: asked for (train.attention_backend "cudnn" or "auto")
// and bf16. With "cudnn", a bf16 shape cuDNN refuses is an error: the config check ruled out
// what Strata knows cuDNN cannot run, so what is left (an old cuDNN, an old GPU, no engine)
// must be seen, not hidden. With "auto" it runs on Strata's kernels (the same saved
// log-sum-exp, so a forward on one and a backward on the other agree).
bool CudaBackend::use_cudnn(const Tensor& qkv, const AttentionShape& a, kc::FlashMask m) {
  if (!cudnn_ || qkv.dtype() != DType::kBF16) return false;
  std::string why;
  if (cudnn_->supports(et(qkv), a.B, a.S, a.NH, a.KVH, a.HS, &why, m) != CUDNN_STATUS_SUCCESS) {
    if (cudnn_use_ == CudnnAttentionUse::kWhereItRuns) return false;
    throw std::runtime_error(
        "train.attention_backend \"cudnn\": cuDNN " + std::to_string(cudnnGetVersion()) +
        " cannot run " + (m.causal ? "causal" : "bidirectional") + (m.key_len ? " padded" : "") +
        " attention " + "B=" + std::to_string(a.B) + " S=" + std::to_string(a.S) +
        " heads=" + std::to_string(a.NH) + " kv heads=" + std::to_string(a.KVH) +
        " head size=" + std::to_string(a.HS) + " in bf16 (" + why + "); use \"strata\"");
  }
  return true;
}

// The kernels' mask of an AttentionMask: key lengths (B) i32 on this device.
kc::FlashMask CudaBackend::flash_mask(const AttentionMask& mask, const AttentionShape& a) {
  kc::FlashMask m;
  m.causal = mask.causal;
  if (mask.key_lengths) {
    expect_key_lengths(*mask.key_lengths, a.B);
    m.key_len = mask.key_lengths->i32();
  }
  return m;
}

// A device workspace of `bytes` (at least one element, so data() is never null).
Tensor CudaBackend::workspace(size_t bytes) {
  return empty({std::max<int64_t>(1, static_cast<int64_t>((bytes + 3) / 4))},
               MemCategory::kBuffers);
}

// qkv (B, S, (NH + 2·KVH)·HS) with a head size the fused kernels handle.
CudaBackend::AttentionShape CudaBackend::attention_shape(const Tensor& qkv, int NH, int KVH) {
  const AttentionDims d = attention_dims(qkv, NH, KVH);
  const AttentionShape a{as_int(d.B), as_int(d.S), NH, KVH, as_int(d.HS)};
  STRATA_CHECK(
      a.HS <= kc::kFlashMaxHeadSize,
      "head size " << a.HS << " exceeds the fused attention's maximum " << kc::kFlashMaxHeadSize);
  return a;
}

kc::FlashRows CudaBackend::block_rows(const AttentionBlockDims& d, const AttentionBlock& blk) {
  STRATA_CHECK(d.a.HS <= kc::kFlashMaxHeadSize, "head size " << d.a.HS
                                                             << " exceeds the fused attention's "
                                                                "maximum "
                                                             << kc::kFlashMaxHeadSize);
  kc::FlashRows r;
  r.B = as_int(d.a.B);
  r.Sq = as_int(blk.q_rows.count);
  r.Sk = as_int(blk.k_rows.count);
  r.NH = blk.num_heads;
  r.KVH = blk.num_kv_heads;
  r.HS = as_int(d.a.HS);
  r.q_ld = d.W;
  r.q_batch = d.W * d.a.S;
  r.k_ld = d.kv_ld;
  r.k_batch = d.kv_ld * d.S_k;
  r.o_ld = d.q;
  r.o_batch = d.q * d.a.S;
  r.lse_ld = d.a.S;
  r.causal = blk.causal;
  r.key_len = blk.key_lengths ? blk.key_lengths->i32() : nullptr;
  r.k_offset = as_int(blk.k_offset);
  return r;
}

// RoPE in place on qkv (B, S, (NH + 2·KVH)·HS), or its inverse on the gradient; the table is
// f32 (a bf16 one is widened for the call).
void CudaBackend::rope(Tensor& qkv, const Tensor& cos_sin, int NH, int KVH, bool backward) {
  if (!is_f32(cos_sin)) {
    MixedPrecisionScope mp(*this);
    return rope(qkv, mp.in(cos_sin), NH, KVH, backward);
  }
  const AttentionDims d = rope_dims(qkv, cos_sin, NH, KVH, backward ? "rope dqkv" : "rope qkv");
  const auto run = backward ? kc::rope_backward : kc::rope_forward;
  CUDA_CHECK(run(qkv.data(), et(qkv), cos_sin.f32(), as_int(d.B), as_int(d.S), NH, KVH,
                 as_int(d.HS), stream_));
}

}  // namespace strata::cuda_backend
