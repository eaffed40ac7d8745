// cudnn_attention.h — multi-head attention on cuDNN's fused flash attention (the graph API's
// flash fprop / bprop patterns), causal or bidirectional with a key padding mask (FlashMask), the
// alternative to kernels/cuda/flash_attention.h where cuDNN serves: bf16 operands, head size a
// multiple of 8 up to 128, sm_80 or newer, cuDNN 9.
//
// Layouts are those of flash_attention.h, so the two are interchangeable op by op (a forward of
// one and a backward of the other give the same gradient):
//   qkv  (B, S, NH + 2·KVH, HS)  per token: the NH query heads, then the KVH key heads, then the
//                                KVH value heads (grouped-query attention; KVH = NH multi-head)
//   out  (B, S, NH, HS)
//   lse  (B, NH, S) f32     log Σ_j exp(scale · q_i·k_j) over the keys j query i sees (causal:
//                           j ≤ i; padded: j < key_len[b]), scale = 1/√HS (cuDNN's "stats")
// The key padding mask is the cuDNN frontend's padding mask (seq_len_q, seq_len_kv (B, 1, 1, 1)
// int32 tensors) with seq_len_q = S for every sequence (every query row computed, as Hugging
// Face's attention_mask does) and seq_len_kv = key_len; CudnnAttention keeps the (B) S values
// on the device itself.
// cuDNN reads Q, K and V in place through strides (no repacking) and writes dq, dk and dv into
// a (B, S, NH + 2·KVH, HS) buffer the same way; K and V (and dK, dV) have KVH heads, which
// cuDNN's SDPA broadcasts over the groups of NH / KVH query heads (dK and dV are the group sums).
//
// CudnnAttention builds one operation graph per (direction, mask, B, S, NH, KVH, HS) with the cuDNN
// backend API (cudnn_attention.cc lists its operations), asks cuDNN's heuristics (mode A) for
// engine configurations, finalizes the first one that cuDNN accepts as an execution plan, and
// caches it; later calls only bind pointers and execute. A shape cuDNN has no engine for
// returns CUDNN_STATUS_NOT_SUPPORTED without running anything (cached too, so a rejected shape
// costs one query): the caller then uses the own flash kernels. Refused before any graph is
// built, each with a one-line reason: f32 operands, a head size not a multiple of 8 or above
// 128, a GPU below compute capability 8.0, cuDNN older than 9.0 or 9.10.0/9.10.1 (known
// attention bugs), and a backward with S not a multiple of 128 on cuDNN ≤ 9.15.0 (its engines
// need a padding-mask workaround there that this graph does not build). The first query of a
// shape compiles cuDNN's kernel at run time (NVRTC), which can take a second or more.
//
// Differences from flash_attention.h: f32 operands are not supported (cuDNN's flash attention
// is fp16/bf16 only); each call needs a device workspace of the size the *_workspace_bytes
// query returns for that shape (possibly 0 for the forward; the backward's also holds cuDNN's f32
// dq accumulator and the dout·out row sums, about 4·B·S·NH·(HS+1) bytes). Every pointer must be
// 16-byte aligned (cudaMalloc's are), as must the workspace; a misaligned one returns
// CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER.
//
// Thread-safety: one CudnnAttention per thread (the plan cache is not locked), used on the
// device that was current when it was constructed. Copy is deleted (it owns the cuDNN handle
// and the cached descriptors).
#pragma once

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cuda/elem_type.h"
#include "kernels/cuda/flash_attention.h"

namespace strata::kernels::cuda {

class CudnnAttention {
 public:
  // Creates the cuDNN handle; check status() before the first call.
  CudnnAttention();
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  cudnnStatus_t status() const { return status_; }

  // Whether cuDNN runs this shape (building and caching both plans on the first query):
  // CUDNN_STATUS_SUCCESS, or why not, with a one-line reason in *why when why is not null
  // (say "cuDNN 8.9.7 is older than 9.0", "head size 36 is not a multiple of 8", "no engine
  // for the backward graph ...").
  // A mask's kind (causal or not, padded or not: key_len given) selects the graph; its key_len
  // pointer is bound at execution.
  cudnnStatus_t supports(ElemType type, int B, int S, int NH, int KVH, int HS,
                         std::string* why = nullptr, FlashMask mask = {});

  // Device workspace bytes each direction needs for this shape (0 when unsupported).
  size_t forward_workspace_bytes(ElemType type, int B, int S, int NH, int KVH, int HS,
                                 FlashMask mask = {});
  size_t backward_workspace_bytes(ElemType type, int B, int S, int NH, int KVH, int HS,
                                  FlashMask mask = {});

  // out = softmax(scale · q·kᵀ, mask) · v, and lse, on `stream`.
  cudnnStatus_t forward(void* out, float* lse, const void* qkv, ElemType type, int B, int S, int NH,
                        int KVH, int HS, void* workspace, cudaStream_t stream, FlashMask mask = {});

  // dqkv = the gradient of the forward (overwritten), given its inputs, output and lse.
  cudnnStatus_t backward(void* dqkv, const void* dout, const void* qkv, const void* out,
                         const float* lse, ElemType type, int B, int S, int NH, int KVH, int HS,
                         void* workspace, cudaStream_t stream, FlashMask mask = {});

 private:
  struct Plan;  // a finalized execution plan and its tensor uids (cudnn_attention.cc)
  // direction, type, causal, padded, B, S, NH, KVH, HS
  using Key = std::tuple<int, int, int, int, int, int, int, int, int>;
  Plan* plan(bool backward, ElemType type, int B, int S, int NH, int KVH, int HS, FlashMask mask);
  static Key key(bool backward, ElemType type, int B, int S, int NH, int KVH, int HS,
                 FlashMask mask);
  // Appends a padded graph's sequence-length tensors to an execution's uids and pointers.
  static void bind_padding(const Plan& p, FlashMask mask, std::vector<int64_t>* uids,
                           std::vector<void*>* pointers);
  // Why this shape cannot run before any graph is built ("" when it may).
  std::string precheck(bool backward, ElemType type, int S, int HS) const;
  // The status of a call whose plan is null: the handle's failure, or NOT_SUPPORTED.
  cudnnStatus_t refused(bool backward, ElemType type, int S, int HS) const;

  cudnnHandle_t handle_ = nullptr;
  cudnnStatus_t status_ = CUDNN_STATUS_NOT_INITIALIZED;
  size_t version_ = 0;  // cudnnGetVersion() of the loaded library, e.g. 91900 for 9.19.0
  int cc_major_ = 0, cc_minor_ = 0;  // compute capability of the construction-time device
  std::string cc_error_;             // why the compute capability is unknown ("" when known)
  std::map<Key, std::unique_ptr<Plan>> plans_;  // null entry: cuDNN refused this shape
  std::map<Key, std::string> refusals_;         // why, for supports()
};

}  // namespace strata::kernels::cuda
