// backend_cuda.h — the CUDA backend's class, shared by the files that define its ops (internal
// to runtime/backend/cuda/; everything else reaches it through make_cuda_backend, backend.h):
//   backend_cuda.cu            the device, stream, caching allocator, memory ops, staging for the
//                              host transports, and the factory (with what runs where, and why)
//   backend_cuda_gemm.cu       the linear layers' GEMMs on cuBLASLt (bias, residual and GELU in
//                              the epilogues where cuBLASLt has them, else widened or unfused);
//                              the experts' grouped GEMMs on cuBLAS
//   backend_cuda_attention.cu  attention (Strata's flash kernels or cuDNN), RoPE, the decode
//                              attention and key/value cache
//   backend_cuda_ops.cu        norms, activations, embedding, cross-entropy, sequence-parallel
//                              layout changes, elementwise ops and reductions, AdamW
//   backend_cuda_moe.cu        mixture-of-experts routing, dispatch plan, permutations and
//                              probability sums
//
// Thread-safety: as Backend (one training thread); the allocator is mutex-guarded. Every op
// runs on the one compute stream (stream_), in the order called.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "kernels/cuda/cudnn_attention.h"
#include "kernels/cuda/elem_type.h"
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/gemm_grouped.h"
#include "kernels/cuda/gemm_lt.h"
#include "runtime/backend/backend.h"
#include "runtime/backend/backend_checks.h"
#include "runtime/base/check.h"
#include "runtime/comm/cuda/nccl_check.h"  // CUDA_CHECK

#define CUBLAS_CHECK(expr)                                                  \
  do {                                                                      \
    const cublasStatus_t strata_cublas_rc_ = (expr);                        \
    if (strata_cublas_rc_ != CUBLAS_STATUS_SUCCESS)                         \
      ::strata::fatal(std::string("cuBLAS call failed: " #expr ": ") +      \
                          cublasLtGetStatusName(strata_cublas_rc_) + ": " + \
                          cublasLtGetStatusString(strata_cublas_rc_),       \
                      __FILE__, __LINE__);                                  \
  } while (0)

#define CUDNN_CHECK(expr)                                                                        \
  do {                                                                                           \
    const cudnnStatus_t strata_cudnn_rc_ = (expr);                                               \
    if (strata_cudnn_rc_ != CUDNN_STATUS_SUCCESS)                                                \
      ::strata::fatal(                                                                           \
          std::string("cuDNN call failed: " #expr ": ") + cudnnGetErrorString(strata_cudnn_rc_), \
          __FILE__, __LINE__);                                                                   \
  } while (0)

namespace strata::cuda_backend {

namespace kc = kernels::cuda;
using namespace backend_checks;

// ---- allocator ----------------------------------------------------------------------------

class CudaAllocator final : public Allocator {
 public:
  ~CudaAllocator() override {
    for (auto& [size, list] : cache_)
      for (void* p : list) cudaFree(p);
  }
  Device device() const override { return Device::kCUDA; }

 protected:
  void* raw_allocate(size_t bytes) override {
    const size_t size = round(bytes);
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = cache_.find(size);
      if (it != cache_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        return p;
      }
    }
    void* p = nullptr;
    if (cudaMalloc(&p, size) != cudaSuccess) {
      release_cache();  // fragmentation: give cached blocks back and try once more
      if (cudaMalloc(&p, size) != cudaSuccess) return nullptr;
    }
    return p;
  }
  void raw_free(void* ptr, size_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    cache_[round(bytes)].push_back(ptr);
  }

 private:
  // 512-byte granularity below 1 MiB, 2 MiB above: same-shape temporaries reuse exactly.
  static size_t round(size_t b) {
    const size_t g = b < (1u << 20) ? 512 : (2u << 20);
    return (b + g - 1) / g * g;
  }
  void release_cache() {
    std::lock_guard<std::mutex> lock(mu_);
    CUDA_CHECK(cudaDeviceSynchronize());
    for (auto& [size, list] : cache_)
      for (void* p : list) CUDA_CHECK(cudaFree(p));
    cache_.clear();
  }
  std::mutex mu_;
  std::map<size_t, std::vector<void*>> cache_;
};

using namespace backend_checks;

// The kernels' tag for a float tensor.
inline kc::ElemType et(const Tensor& t) {
  STRATA_CHECK(t.dtype() != DType::kI32, "an i32 tensor where a float tensor is expected");
  return t.dtype() == DType::kBF16 ? kc::ElemType::kBF16 : kc::ElemType::kF32;
}
inline bool same_dtype(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype();
}
inline bool same_dtype(const Tensor& a, const Tensor* b) {
  return !b || a.dtype() == b->dtype();
}
template <typename... Ts>
bool all_same_dtype(const Tensor& a, const Ts&... ts) {
  return (same_dtype(a, ts) && ...);
}

// Whether cuBLASLt has kernels for A/B of these types into C: one type for A and B, and no
// f32 A/B into a bf16 C.
inline bool gemm_native(const Tensor& a, const Tensor& b, const Tensor& c) {
  return same_dtype(a, b) && !(is_f32(a) && !is_f32(c));
}

// Device <-> host copies for the host transports (backend_cuda.cu).
class StreamStaging;

// Every Backend op on one GPU (backend.h), in fp32 or bf16 mixed precision.
class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, CudnnAttentionUse cudnn_use);
  ~CudaBackend() override;

  Device device() const override { return Device::kCUDA; }
  std::string name() const override;
  Allocator& allocator() override { return alloc_; }
  std::optional<double> peak_flops(const std::string& precision) const override;

  // ---- memory (backend_cuda.cu) ----
  void zero(Tensor& x) override;
  void copy(Tensor& dst, const Tensor& src) override;
  void cast(Tensor& dst, const Tensor& src) override;
  void upload(Tensor& dst, const void* host) override;
  void download(void* host, const Tensor& src) override;
  void synchronize() override { CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  int64_t device_memory_bytes() const override;

  // ---- for the communicators (backend_cuda.cu) ----
  void* compute_stream() const override { return stream_; }
  std::shared_ptr<DeviceStaging> comm_staging() override;

  // ---- dense layers (backend_cuda_gemm.cu) ----
  void matmul_forward(Tensor& out, const Tensor& inp, const Tensor& w, const Tensor* bias) override;
  void matmul_residual_forward(Tensor& out, const Tensor& inp, const Tensor& w, const Tensor* bias,
                               const Tensor& residual) override;
  void matmul_backward(Tensor* dinp, Tensor& dw, Tensor* dbias, const Tensor& dout,
                       const Tensor& inp, const Tensor& w) override;
  void matmul_backward_input(Tensor& dinp, const Tensor& dout, const Tensor& w) override;
  void matmul_backward_weight(Tensor& dw, Tensor* dbias, const Tensor& dout,
                              const Tensor& inp) override;
  void matmul_gelu_forward(Tensor& pre, Tensor& out, const Tensor& inp, const Tensor& w,
                           const Tensor& bias, GeluKind kind) override;
  void matmul_backward_input_gelu(Tensor& dpre, const Tensor& dout, const Tensor& w,
                                  const Tensor& pre, GeluKind kind) override;
  void grouped_matmul_forward(Tensor& out, const Tensor& inp, const Tensor& w,
                              const std::vector<int64_t>& rows) override;
  void grouped_matmul_backward_input(Tensor& dinp, const Tensor& dout, const Tensor& w,
                                     const std::vector<int64_t>& rows) override;
  void grouped_matmul_backward_weight(Tensor& dw, const Tensor& dout, const Tensor& inp,
                                      const std::vector<int64_t>& rows) override;

  // ---- attention, RoPE, decoding (backend_cuda_attention.cu) ----
  Shape attention_saved_shape(int64_t B, int num_heads, int64_t S) const override;
  void attention_forward(Tensor& out, Tensor& saved, const Tensor& qkv, int NH, int KVH,
                         const AttentionMask& mask) override;
  void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                          const Tensor& saved, int NH, int KVH, const AttentionMask& mask) override;
  // Ring attention's blocks (backend.h; kernels/cuda/attention_block.h).
  void attention_block_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const Tensor& kv,
                               const AttentionBlock& block) override;
  void attention_block_merge(Tensor& out, Tensor& lse, const Tensor& out_b, const Tensor& lse_b,
                             const AttentionBlock& block) override;
  void attention_block_delta(Tensor& delta, const Tensor& dout, const Tensor& out,
                             int num_heads) override;
  void attention_block_backward(Tensor& dq, Tensor& dkv, const Tensor& dout, const Tensor& qkv,
                                const Tensor& kv, const Tensor& lse, const Tensor& delta,
                                const AttentionBlock& block) override;
  void attention_kv_extract(Tensor& kv, const Tensor& qkv, int num_heads,
                            int num_kv_heads) override;
  void attention_qkv_assemble(Tensor& dqkv, const Tensor& dq, const Tensor& dkv, int num_heads,
                              int num_kv_heads) override;
  void rope_forward(Tensor& qkv, const Tensor& cos_sin, int NH, int KVH) override;
  void rope_backward(Tensor& dqkv, const Tensor& cos_sin, int NH, int KVH) override;
  void kv_cache_append(Tensor& q, Tensor& k_cache, Tensor& v_cache, const Tensor& qkv, int NH,
                       int KVH, int64_t pos0) override;
  void attention_decode(Tensor& out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                        int NH, int KVH, int64_t pos0) override;

  // ---- the other ops (backend_cuda_ops.cu) ----
  void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& inp,
                         const Tensor& w, const Tensor& b, float eps) override;
  void layernorm_backward(Tensor& dinp, Tensor& dw, Tensor& db, const Tensor& dout,
                          const Tensor& inp, const Tensor& w, const Tensor& mean,
                          const Tensor& rstd) override;
  void rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& inp, const Tensor& w,
                       float eps) override;
  void rmsnorm_backward(Tensor& dinp, Tensor& dw, const Tensor& dout, const Tensor& inp,
                        const Tensor& w, const Tensor& rstd) override;
  void qk_rmsnorm_forward(Tensor& qkv, Tensor& rstd, const Tensor& q_weight, const Tensor& k_weight,
                          int NH, int KVH, float eps) override;
  void qk_rmsnorm_backward(Tensor& dqkv, Tensor& dq_weight, Tensor& dk_weight, const Tensor& x,
                           const Tensor& q_weight, const Tensor& k_weight, const Tensor& rstd,
                           int NH, int KVH) override;
  void gelu_forward(Tensor& out, const Tensor& inp, GeluKind kind) override;
  void gelu_backward(Tensor& dinp, const Tensor& inp, const Tensor& dout, GeluKind kind) override;
  void tanh_forward(Tensor& out, const Tensor& inp) override;
  void tanh_backward(Tensor& dinp, const Tensor& out, const Tensor& dout) override;
  void swiglu_forward(Tensor& out, const Tensor& gate_up) override;
  void swiglu_backward(Tensor& dgate_up, const Tensor& dout, const Tensor& gate_up) override;
  void embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor* wpe,
                         int vocab_start) override;
  void embedding_backward(Tensor& dwte, Tensor* dwpe, const Tensor& dout, const Tensor& tokens,
                          int vocab_start) override;
  void ce_row_stats(Tensor& row_max, Tensor& row_sumexp, const Tensor& logits, int valid) override;
  void ce_rescale_sumexp(Tensor& row_sumexp, const Tensor& local_max,
                         const Tensor& row_max) override;
  void ce_target_logit(Tensor& target_logit, const Tensor& logits, const Tensor& targets,
                       int vocab_start, int valid) override;
  void ce_losses(Tensor& losses, const Tensor& row_max, const Tensor& row_sumexp,
                 const Tensor& target_logit, const Tensor* weights) override;
  void ce_backward(Tensor& dlogits, const Tensor& logits, const Tensor& row_max,
                   const Tensor& row_sumexp, const Tensor& targets, float scale, int vocab_start,
                   int valid, const Tensor* weights) override;
  void seq_interleave(Tensor& out, const Tensor& chunks, int t) override;
  void seq_deinterleave(Tensor& chunks, const Tensor& in, int t) override;
  void add_inplace(Tensor& y, const Tensor& x) override;
  void add(Tensor& out, const Tensor& a, const Tensor& b) override;
  void scale_inplace(Tensor& y, float s) override;
  double sum_squares_multi(const std::vector<Tensor>& xs) override;
  double sum(const Tensor& x) override;
  void adamw_update_multi(const std::vector<AdamWRange>& ranges, const AdamWHyper& h) override;

  // ---- mixture of experts (backend_cuda_moe.cu) ----
  void moe_route(Tensor& probs, Tensor& topk_idx, Tensor& topk_w, const Tensor& logits, int k,
                 bool renormalize) override;
  void moe_route_backward(Tensor& dlogits, const Tensor& dtopk_w, const Tensor& dprobs_expert,
                          const Tensor& probs, const Tensor& topk_idx, bool renormalize) override;
  void moe_dispatch_plan(Tensor& dest_row, Tensor& counts, Tensor& routed, const Tensor& topk_idx,
                         const Tensor& topk_w, int num_experts, int64_t capacity) override;
  void moe_permute(Tensor& xp, const Tensor& x, const Tensor& dest_row) override;
  void moe_permute_backward(Tensor& dx, const Tensor& dxp, const Tensor& dest_row) override;
  void moe_unpermute(Tensor& out, const Tensor& y, const Tensor& dest_row,
                     const Tensor& topk_w) override;
  void moe_unpermute_backward(Tensor& dy, Tensor& dtopk_w, const Tensor& dout, const Tensor& y,
                              const Tensor& dest_row, const Tensor& topk_w) override;
  void moe_prob_sums(Tensor& sums, const Tensor& probs) override;

 private:
  // ---- GEMMs (backend_cuda_gemm.cu) ----
  enum class GemmRun { kDone, kWithoutEpilogue, kUnsupported };
  GemmRun run_gemm(kc::Gemm g);
  static kc::Gemm forward_gemm(const Tensor& out, const Tensor& inp, const Tensor& w);
  static kc::Gemm backward_input_gemm(const Tensor& dinp, const Tensor& dout, const Tensor& w);
  bool run_forward_gemm(kc::Gemm g, Tensor& out, const Tensor* bias);
  bool run_fused(const kc::Gemm& g);
  void matmul_forward_widened(Tensor& out, const Tensor& inp, const Tensor& w, const Tensor* bias);
  void matmul_backward_input_widened(Tensor& dinp, const Tensor& dout, const Tensor& w);
  void matmul_backward_weight_widened(Tensor& dw, Tensor* dbias, const Tensor& dout,
                                      const Tensor& inp);
  bool run_grouped(const kc::GroupedGemm& g);

  // ---- attention (backend_cuda_attention.cu) ----
  struct AttentionShape {
    int B, S, NH, KVH, HS;
  };
  bool use_cudnn(const Tensor& qkv, const AttentionShape& a, kc::FlashMask m);
  static kc::FlashMask flash_mask(const AttentionMask& mask, const AttentionShape& a);
  Tensor workspace(size_t bytes);
  static AttentionShape attention_shape(const Tensor& qkv, int NH, int KVH);
  // A ring block's rows for the flash kernels (operands checked by attention_block_dims).
  static kc::FlashRows block_rows(const AttentionBlockDims& d, const AttentionBlock& blk);
  void rope(Tensor& qkv, const Tensor& cos_sin, int NH, int KVH, bool backward);

  // ---- the other ops (backend_cuda_ops.cu) ----
  void seq_permute(const Tensor& bsc, const Tensor& chunks, int t, bool to_chunks);
  double read_dsum();

  int device_;
  CudaAllocator alloc_;
  std::shared_ptr<StreamStaging> staging_;
  cudaStream_t stream_ = nullptr;
  double* dsum_ = nullptr;                    // sum / sum_squares result
  Tensor workspace_;                          // cuBLASLt workspace (kBuffers)
  std::unique_ptr<kc::GemmLt> gemm_;          // uses workspace_ and stream_
  std::unique_ptr<kc::GemmGrouped> grouped_;  // the grouped GEMMs' cuBLAS handle, made on first use
  CudnnAttentionUse cudnn_use_;
  std::unique_ptr<kc::CudnnAttention> cudnn_;  // train.attention_backend "cudnn"/"auto", else null
};

}  // namespace strata::cuda_backend
