// backend_cuda_moe.cu — the CUDA backend's mixture-of-experts ops (backend_cuda.h): routing, the
// dispatch plan, the permutations and the probability sums on the kernels of kernels/cuda/moe.h,
// the grouped GEMM as the Backend default (a cuBLASLt GEMM per group). The kernels read the
// token rows (and the logits) in one type and the routing weights, probabilities and their
// gradients in f32; any other mix is widened (MixedPrecisionScope). No op waits for the device.
#include "kernels/cuda/moe.h"
#include "runtime/backend/cuda/backend_cuda.h"

namespace strata::cuda_backend {

namespace {
bool f32_or_undefined(const Tensor& t) {
  return !t.defined() || is_f32(t);
}
}  // namespace

void CudaBackend::moe_route(Tensor& probs, Tensor& topk_idx, Tensor& topk_w, const Tensor& logits,
                            int k, bool renormalize) {
  const MoeDims d = moe_route_dims(probs, topk_idx, topk_w, logits, k);
  if (!all_f32(probs, topk_w)) {
    MixedPrecisionScope mp(*this);
    return moe_route(mp.out(probs), topk_idx, mp.out(topk_w), logits, k, renormalize);
  }
  CUDA_CHECK(kc::moe_route(probs.f32(), topk_idx.i32(), topk_w.f32(), logits.data(), et(logits),
                           d.N, d.E, d.k, renormalize, stream_));
}

void CudaBackend::moe_route_backward(Tensor& dlogits, const Tensor& dtopk_w,
                                     const Tensor& dprobs_expert, const Tensor& probs,
                                     const Tensor& topk_idx, bool renormalize) {
  const MoeDims d = moe_route_backward_dims(dlogits, dtopk_w, dprobs_expert, probs, topk_idx);
  if (!all_f32(dtopk_w, probs) || !f32_or_undefined(dprobs_expert)) {
    MixedPrecisionScope mp(*this);
    return moe_route_backward(dlogits, mp.in(dtopk_w),
                              dprobs_expert.defined() ? mp.in(dprobs_expert) : dprobs_expert,
                              mp.in(probs), topk_idx, renormalize);
  }
  CUDA_CHECK(kc::moe_route_backward(dlogits.data(), et(dlogits), dtopk_w.f32(),
                                    dprobs_expert.defined() ? dprobs_expert.f32() : nullptr,
                                    probs.f32(), topk_idx.i32(), d.N, d.E, d.k, renormalize,
                                    stream_));
}

void CudaBackend::moe_dispatch_plan(Tensor& dest_row, Tensor& counts, Tensor& routed,
                                    const Tensor& topk_idx, const Tensor& topk_w, int num_experts,
                                    int64_t capacity) {
  const MoeDims d = moe_dispatch_dims(dest_row, counts, routed, topk_idx, topk_w, num_experts);
  if (!is_f32(topk_w)) {
    MixedPrecisionScope mp(*this);
    return moe_dispatch_plan(dest_row, counts, routed, topk_idx, mp.in(topk_w), num_experts,
                             capacity);
  }
  const size_t bytes = kc::moe_dispatch_plan_workspace_bytes(d.N, d.k, d.E);
  Tensor ws = empty({static_cast<int64_t>((bytes + 3) / 4)}, MemCategory::kBuffers, DType::kI32);
  CUDA_CHECK(kc::moe_dispatch_plan(dest_row.i32(), counts.i32(), routed.i32(), topk_idx.i32(),
                                   topk_w.f32(), d.N, d.k, d.E, capacity, ws.data(), stream_));
}

void CudaBackend::moe_permute(Tensor& xp, const Tensor& x, const Tensor& dest_row) {
  const MoeRowDims d = moe_row_dims(x, xp, dest_row, "moe_permute x", "moe_permute xp");
  if (!same_dtype(xp, x)) {
    MixedPrecisionScope mp(*this);
    return moe_permute(mp.out(xp), mp.in(x), dest_row);
  }
  CUDA_CHECK(kc::moe_permute(xp.data(), x.data(), dtype_size(x.dtype()), dest_row.i32(), d.N, d.k,
                             d.C, stream_));
}

void CudaBackend::moe_permute_backward(Tensor& dx, const Tensor& dxp, const Tensor& dest_row) {
  const MoeRowDims d = moe_row_dims(dx, dxp, dest_row, "moe_permute dx", "moe_permute dxp");
  if (!same_dtype(dx, dxp)) {
    MixedPrecisionScope mp(*this);
    return moe_permute_backward(mp.out(dx), mp.in(dxp), dest_row);
  }
  CUDA_CHECK(kc::moe_permute_backward(dx.data(), dxp.data(), et(dx), dest_row.i32(), d.N, d.k, d.C,
                                      stream_));
}

void CudaBackend::moe_unpermute(Tensor& out, const Tensor& y, const Tensor& dest_row,
                                const Tensor& topk_w) {
  const MoeRowDims d = moe_row_dims(out, y, dest_row, "moe_unpermute out", "moe_unpermute y");
  expect_moe_weights(topk_w, d, "moe_unpermute topk_w");
  if (!same_dtype(out, y) || !is_f32(topk_w)) {
    MixedPrecisionScope mp(*this);
    return moe_unpermute(mp.out(out), mp.in(y), dest_row, mp.in(topk_w));
  }
  CUDA_CHECK(kc::moe_unpermute(out.data(), y.data(), et(y), dest_row.i32(), topk_w.f32(), d.N, d.k,
                               d.C, stream_));
}

void CudaBackend::moe_unpermute_backward(Tensor& dy, Tensor& dtopk_w, const Tensor& dout,
                                         const Tensor& y, const Tensor& dest_row,
                                         const Tensor& topk_w) {
  const MoeRowDims d = moe_row_dims(dout, y, dest_row, "moe_unpermute dout", "moe_unpermute y");
  expect_moe_weights(topk_w, d, "moe_unpermute topk_w");
  expect_moe_weights(dtopk_w, d, "moe_unpermute dtopk_w");
  expect_float(dy, "moe_unpermute dy");
  expect_numel(dy, y.numel(), "moe_unpermute dy");
  if (!all_same_dtype(dy, dout, y) || !all_f32(dtopk_w, topk_w)) {
    MixedPrecisionScope mp(*this);
    return moe_unpermute_backward(mp.out(dy), mp.out(dtopk_w), mp.in(dout), mp.in(y), dest_row,
                                  mp.in(topk_w));
  }
  CUDA_CHECK(kc::moe_unpermute_backward(dy.data(), dtopk_w.f32(), dout.data(), y.data(), et(y),
                                        dest_row.i32(), topk_w.f32(), d.N, d.k, d.C, stream_));
}

void CudaBackend::moe_prob_sums(Tensor& sums, const Tensor& probs) {
  const MoeDims d = moe_prob_sums_dims(sums, probs);
  if (!all_f32(sums, probs)) {
    MixedPrecisionScope mp(*this);
    return moe_prob_sums(mp.out(sums), mp.in(probs));
  }
  const size_t bytes = kc::moe_prob_sums_workspace_bytes(d.E);
  Tensor ws = empty({static_cast<int64_t>((bytes + 3) / 4)}, MemCategory::kBuffers, DType::kI32);
  CUDA_CHECK(kc::moe_prob_sums(sums.f32(), probs.f32(), d.N, d.E, ws.data(), stream_));
}

}  // namespace strata::cuda_backend
