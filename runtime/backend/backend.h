// backend.h — the compute backend: memory and every op the models use, on one device.
//
// Models call these methods on Tensors and never know which device runs them; the backend is
// chosen once, in make_backend() (the one factory: no #ifdef in model or schedule code). Ops
// mirror the kernels of kernels/cpu (a header per op family): shapes are checked here, then the
// kernel runs on the raw buffers.
// Backward ops ACCUMULATE into parameter gradients (so micro-batch gradients sum) and into
// layernorm_backward's dinp (the residual stream's gradient, which sums over its branches).
// An input gradient with one producer — matmul's dinp, gelu_backward's, attention_backward's
// dqkv, ce_backward's dlogits — is ASSIGNED: its buffer needs no zero-fill and is never read,
// which on a GPU saves a memset and a read of every such activation-sized buffer.
//
// Types (train.precision): in fp32 every float tensor is f32. In bf16 (mixed precision) the
// activations, their gradients and the compute copy of the weights are bf16, while statistics
// (LayerNorm mean/rstd, cross-entropy row stats and losses, attention saved statistics) and
// parameter gradients (dw, dbias, LayerNorm dw/db, dwte, dwpe: the fp32 main gradients) stay
// f32. Every op accepts any mix of f32/bf16 float operands, computes in f32 (bf16 GEMM inputs
// with f32 accumulation) and rounds to nearest-even where it stores into a bf16 tensor; a
// backend may run a mix without a fast path by widening to f32 (MixedPrecisionScope below).
//
// Thread-safety: one backend per process, used from the training thread; ops are ordered as
// called (the CUDA backend issues them on one compute stream).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/memory/allocator.h"
#include "runtime/memory/tensor.h"

namespace strata {

class DeviceStaging;  // runtime/comm/comm.h

// Which GELU (gelu_forward and the ops that fuse it): kTanh, the tanh approximation GPT-2 uses
// ("gelu_new": 0.5x(1 + tanh(√(2/π)(x + 0.044715x³)))); kErf, the exact x·Φ(x) =
// 0.5x(1 + erf(x/√2)) BERT uses (Hugging Face's "gelu").
enum class GeluKind { kTanh, kErf };

// Which keys each query of an attention core sees. causal: query i sees keys j ≤ i (decoders);
// else every key (encoders). key_lengths, when given: (B) i32 on the backend's device, sequence
// b's keys [len_b, S) are padding and never attended (1 ≤ len_b ≤ S; padding at the end, as
// BERT's batches have it). Every query row is computed, padded ones included (over the keys it
// sees), as Hugging Face's attention_mask does.
struct AttentionMask {
  bool causal = true;
  const Tensor* key_lengths = nullptr;
};

class Backend {
 public:
  virtual ~Backend() = default;
  Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  virtual Device device() const = 0;
  virtual std::string name() const = 0;  // "cpu (OpenBLAS 0.3.21 SkylakeX, 2 threads)"
  virtual Allocator& allocator() = 0;
  // The device's dense peak FLOP/s in `precision` ("fp32", "bf16"), behind the metrics' MFU;
  // nullopt where it is not known (the CPU backend: MFU stays null).
  virtual std::optional<double> peak_flops(const std::string& precision) const {
    (void)precision;
    return std::nullopt;
  }

  Tensor empty(const Shape& s, MemCategory c, DType t = DType::kF32) {
    return Tensor::empty(s, t, c, allocator());
  }
  Tensor zeros(const Shape& s, MemCategory c, DType t = DType::kF32) {
    Tensor x = empty(s, c, t);
    zero(x);
    return x;
  }

  // ---- memory ----
  virtual void zero(Tensor& x) = 0;
  virtual void copy(Tensor& dst, const Tensor& src) = 0;  // same numel and dtype
  // dst = src converted (f32 <-> bf16, round to nearest even; same dtype: a copy); same numel.
  virtual void cast(Tensor& dst, const Tensor& src) = 0;
  // Host <-> this device (a host pointer of numel elements of the tensor's dtype).
  virtual void upload(Tensor& dst, const void* host) = 0;
  virtual void download(void* host, const Tensor& src) = 0;
  // Waits for all issued work (a no-op on the CPU).
  virtual void synchronize() = 0;

  // Bytes of this device's memory (the whole device, free or not); 0 where the backend shares
  // the host's memory (the CPU).
  virtual int64_t device_memory_bytes() const { return 0; }

  // ---- for the communicators ----
  // The stream every op runs on (a cudaStream_t), for device communicators to order their work
  // against (Communicator::set_compute_stream); nullptr on the CPU.
  virtual void* compute_stream() const { return nullptr; }
  // Copies between this device's memory and the host for a staged communicator (comm.h), which
  // carries device tensors over a host transport; nullptr where tensors already live on the host.
  virtual std::shared_ptr<DeviceStaging> comm_staging() { return nullptr; }

  // ---- dense layers ----
  // out (N, OC) = inp (N, C) · w (OC, C)^T + bias (OC); bias may be null.
  virtual void matmul_forward(Tensor& out, const Tensor& inp, const Tensor& w,
                              const Tensor* bias) = 0;
  // dinp (N, C) = dout · w; dw (OC, C) += dout^T · inp; dbias += Σ dout. dinp, dbias may be null.
  virtual void matmul_backward(Tensor* dinp, Tensor& dw, Tensor* dbias, const Tensor& dout,
                               const Tensor& inp, const Tensor& w) = 0;
  // The two halves of matmul_backward, for zero-bubble schedules that compute the input
  // gradient now and the weight gradient later: dinp (N, C) = dout · w; and
  // dw (OC, C) += dout^T · inp, dbias (OC) += Σ dout (dbias may be null).
  virtual void matmul_backward_input(Tensor& dinp, const Tensor& dout, const Tensor& w) = 0;
  virtual void matmul_backward_weight(Tensor& dw, Tensor* dbias, const Tensor& dout,
                                      const Tensor& inp) = 0;
  // out, inp (N, C); mean, rstd (N); eps added to the variance (GPT-2's 1e-5, BERT's 1e-12).
  // Backward: dinp (N, C) +=; dw, db (C) +=.
  virtual void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& inp,
                                 const Tensor& w, const Tensor& b, float eps = 1e-5f) = 0;
  virtual void layernorm_backward(Tensor& dinp, Tensor& dw, Tensor& db, const Tensor& dout,
                                  const Tensor& inp, const Tensor& w, const Tensor& mean,
                                  const Tensor& rstd) = 0;
  // out = gelu(inp) (GeluKind); backward: dinp = gelu'(inp) · dout.
  virtual void gelu_forward(Tensor& out, const Tensor& inp, GeluKind kind = GeluKind::kTanh) = 0;
  virtual void gelu_backward(Tensor& dinp, const Tensor& inp, const Tensor& dout,
                             GeluKind kind = GeluKind::kTanh) = 0;
  // out = tanh(inp) (BERT's pooler); backward: dinp = (1 − out²) · dout, from the output.
  virtual void tanh_forward(Tensor& out, const Tensor& inp) = 0;
  virtual void tanh_backward(Tensor& dinp, const Tensor& out, const Tensor& dout) = 0;

  // A linear layer whose output joins the residual stream (the attention and MLP projections):
  // out (N, OC) = inp (N, C) · w (OC, C)^T + bias (OC) + residual (N, OC); bias may be null.
  // out must not alias residual. This default runs matmul_forward then add_inplace; the CUDA
  // backend reads the residual in the GEMM (beta 1 with a separate C), so out is written once
  // and never read back.
  virtual void matmul_residual_forward(Tensor& out, const Tensor& inp, const Tensor& w,
                                       const Tensor* bias, const Tensor& residual);

  // A linear layer followed by GELU (the MLP's first half), in one op so a backend can fuse
  // them: pre (N, OC) = inp (N, C) · w (OC, C)^T + bias (OC), out = gelu(pre); pre is what
  // the backward needs. This default runs matmul_forward then gelu_forward; the CUDA backend
  // puts the GELU in the GEMM's epilogue where cuBLASLt has one (pre is written, not re-read).
  virtual void matmul_gelu_forward(Tensor& pre, Tensor& out, const Tensor& inp, const Tensor& w,
                                   const Tensor& bias, GeluKind kind = GeluKind::kTanh);
  // The input gradient of a linear layer whose input was gelu(pre), carried through the GELU:
  // dpre (N, C) = gelu'(pre) · (dout (N, OC) · w (OC, C)), assigned. This default runs
  // matmul_backward_input into a temporary, then gelu_backward; the CUDA backend does both in
  // one GEMM (cuBLASLt's DGELU epilogue: no temporary, nothing written twice).
  virtual void matmul_backward_input_gelu(Tensor& dpre, const Tensor& dout, const Tensor& w,
                                          const Tensor& pre, GeluKind kind = GeluKind::kTanh);

  // ---- attention core (causal, or bidirectional with padded keys: AttentionMask) ----
  // Grouped-query attention: qkv (B, S, NH + 2·KVH, HS) holds per token the NH query heads, then
  // the KVH key heads, then the KVH value heads (KVH = NH: multi-head attention, the (B, S, 3, NH,
  // HS) layout; KVH = 1: multi-query). Query head h attends with key/value head h / (NH / KVH),
  // Hugging Face's repeat_kv order; NH must be a multiple of KVH. out (B, S, NH, HS); `saved`
  // (f32, attention_saved_shape) keeps what the backward needs: the CPU backend the
  // (B, NH, S, S) probabilities, a fused (flash-style) backend the (B, NH, S) log-sum-exp of each
  // score row. Scores are scaled by 1/√HS.
  virtual Shape attention_saved_shape(int64_t B, int num_heads, int64_t S) const {
    return {B, num_heads, S, S};
  }
  virtual void attention_forward(Tensor& out, Tensor& saved, const Tensor& qkv, int num_heads,
                                 int num_kv_heads, const AttentionMask& mask = {}) = 0;
  // dqkv (the qkv layout) = the gradient, assigned; out is the forward's output. A key/value
  // head's gradient sums over the NH / KVH query heads that share it (padded keys get 0). mask:
  // the forward's.
  virtual void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                                  const Tensor& out, const Tensor& saved, int num_heads,
                                  int num_kv_heads, const AttentionMask& mask = {}) = 0;

  // ---- ring attention blocks (context parallelism: models/layers/ring_attention.h) ----
  // The attention core cut into blocks of query rows × key rows whose outputs merge by their
  // log-sum-exp (kernels/cpu/attention_block.h). qkv (B, S, (NH + 2·KVH)·HS) is the layer's
  // (the attention layout above): the queries are its first NH heads. kv holds the keys and
  // values: either that qkv (its last 2·KVH heads) or a (B, S_k, 2·KVH·HS) block received from
  // another rank (attention_kv_extract's layout). A block takes rows `q_rows` of the queries and
  // `k_rows` of the keys (of every sequence); its mask is BlockMask's, and with key_lengths
  // ((B) i32, the sequences' real keys) a key at block row j is padding when k_offset + j ≥ the
  // length (k_offset: the position of the block's first key in the sequence). Blocks read
  // and write only their rows:
  //   forward: out (B, S, NH·HS) and lse (B, NH, S) f32 assigned in q_rows;
  //   merge:   (out, lse) in q_rows += block (out_b, lse_b) laid out as they are;
  //   delta:   delta (B, NH, S) f32 = Σ over HS of dout ⊙ out (the merged out), every row;
  //   backward: dq (B, S, NH·HS) f32 += in q_rows, dkv (B, S_k, 2·KVH·HS) f32 += in k_rows,
  //             given the merged rows' lse and delta.
  // Default: the backend has no ring attention (an Error naming it).
  struct AttentionRows {
    int64_t begin = 0, count = 0;
  };
  struct AttentionBlock {
    int num_heads = 0, num_kv_heads = 0;
    AttentionRows q_rows, k_rows;
    bool causal = false;  // BlockMask::kCausal (q_rows.count == k_rows.count), else kFull
    const Tensor* key_lengths = nullptr;
    int64_t k_offset = 0;
  };
  virtual void attention_block_forward(Tensor& out, Tensor& lse, const Tensor& qkv,
                                       const Tensor& kv, const AttentionBlock& block);
  virtual void attention_block_merge(Tensor& out, Tensor& lse, const Tensor& out_b,
                                     const Tensor& lse_b, const AttentionBlock& block);
  virtual void attention_block_delta(Tensor& delta, const Tensor& dout, const Tensor& out,
                                     int num_heads);
  virtual void attention_block_backward(Tensor& dq, Tensor& dkv, const Tensor& dout,
                                        const Tensor& qkv, const Tensor& kv, const Tensor& lse,
                                        const Tensor& delta, const AttentionBlock& block);
  // kv (B, S, 2·KVH·HS) = the key and value heads of qkv (what a ring step sends); and back:
  // dqkv (qkv's layout, its dtype) = [dq | dkv] (f32 accumulators above), assigned.
  virtual void attention_kv_extract(Tensor& kv, const Tensor& qkv, int num_heads, int num_kv_heads);
  virtual void attention_qkv_assemble(Tensor& dqkv, const Tensor& dq, const Tensor& dkv,
                                      int num_heads, int num_kv_heads);

  // ---- Llama-family ops ----
  // RMSNorm over the last dimension: out (N, C) = x · rstd · w with rstd (N, f32) =
  // 1/√(mean(x²) + eps). Backward: dinp (N, C) += (the residual stream's gradient, as
  // layernorm_backward), dw (C) +=.
  virtual void rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& inp, const Tensor& w,
                               float eps) = 0;
  virtual void rmsnorm_backward(Tensor& dinp, Tensor& dw, const Tensor& dout, const Tensor& inp,
                                const Tensor& w, const Tensor& rstd) = 0;
  // Per-head RMSNorm of the query and key heads of a q/k/v tensor in the attention layout
  // (B, S, NH + 2·KVH, HS), in place (Qwen3's q_norm and k_norm): each query head's HS values
  // x ← x · rstd · q_weight, each key head's x ← x · rstd · k_weight, rstd = 1/√(mean(x²) + eps);
  // the value heads are left as they are. rstd (B·S·(NH + KVH), f32): per position its query heads
  // then its key heads. q_weight, k_weight (HS).
  virtual void qk_rmsnorm_forward(Tensor& qkv, Tensor& rstd, const Tensor& q_weight,
                                  const Tensor& k_weight, int num_heads, int num_kv_heads,
                                  float eps) = 0;
  // Backward, in place on dqkv (the gradient of the normalised q/k/v, same layout): its query and
  // key heads become the gradient of the pre-norm values (assigned); its value heads are left.
  // dq_weight, dk_weight (HS, f32) +=. x: the pre-norm q/k/v (its value heads are not read); rstd:
  // the forward's.
  virtual void qk_rmsnorm_backward(Tensor& dqkv, Tensor& dq_weight, Tensor& dk_weight,
                                   const Tensor& x, const Tensor& q_weight, const Tensor& k_weight,
                                   const Tensor& rstd, int num_heads, int num_kv_heads) = 0;
  // Rotary position embeddings, in place on the query and key heads of a qkv tensor in the
  // attention layout above (B, S, NH + 2·KVH, HS); the value heads are left as they are.
  // Position s of every sequence rotates each pair (x[i], x[i + HS/2]), i < HS/2 (Hugging Face's
  // rotate_half convention, not Meta's interleaved pairs) by the angle s·inv_freq[i]:
  //   x[i] ← x[i]·cos − x[i+HS/2]·sin,   x[i+HS/2] ← x[i+HS/2]·cos + x[i]·sin.
  // cos_sin (S_max ≥ S, HS) f32: row s is [cos(s·inv_freq[0..HS/2)) | sin(s·inv_freq[0..HS/2))]
  // (the model builds it once, rope_scaling included). rope_backward applies the inverse rotation
  // (the transpose) to the gradient dqkv, in place.
  virtual void rope_forward(Tensor& qkv, const Tensor& cos_sin, int num_heads,
                            int num_kv_heads) = 0;
  virtual void rope_backward(Tensor& dqkv, const Tensor& cos_sin, int num_heads,
                             int num_kv_heads) = 0;
  // SwiGLU: gate_up (N, 2F) holds per row [gate (F) | up (F)]; out (N, F) = silu(gate) · up,
  // silu(g) = g · sigmoid(g). Backward: dgate_up (N, 2F) assigned (one producer).
  virtual void swiglu_forward(Tensor& out, const Tensor& gate_up) = 0;
  virtual void swiglu_backward(Tensor& dgate_up, const Tensor& dout, const Tensor& gate_up) = 0;

  // ---- mixture of experts (Mixtral's and Qwen3-MoE's sparse block) ----
  // N tokens, E experts (≤ 1024), k experts per token (1 ≤ k ≤ E), C hidden; an assignment
  // (n, j) is token n's j-th choice. Routing weights and statistics (probs, topk_w, their
  // gradients, sums) are f32 in both precisions, token rows (x, y, out and their gradients) the
  // activations' type; index tensors i32. Every output is ASSIGNED. Results do not depend on the
  // thread count or the launch (no float atomics): a run repeats bit for bit.
  //
  // moe_route: probs (N, E) = softmax of each logits (N, E) row, in f32, max-subtracted;
  // topk_idx (N, k) the experts of the k largest probabilities in descending order, equal
  // probabilities by the LOWER expert index; topk_w (N, k) those probabilities, divided by their
  // sum when `renormalize` (Mixtral always, Qwen3-MoE with norm_topk_prob): Hugging Face's
  // MixtralSparseMoeBlock / Qwen3MoeSparseMoeBlock routing.
  virtual void moe_route(Tensor& probs, Tensor& topk_idx, Tensor& topk_w, const Tensor& logits,
                         int k, bool renormalize) = 0;
  // Its backward: dlogits (N, E) from dtopk_w (N, k) and dprobs_expert (E), a gradient on the
  // probabilities that is the same for every token (the load-balancing loss's), added to every
  // row; an undefined Tensor where there is none. Per row, with p its probabilities and S its
  // selected experts: dp_j = (dtopk_w_j − Σ_i dtopk_w_i·topk_w_i) / Σ_S p for j ∈ S when
  // renormalized, dtopk_w_j when not, 0 for the others; dp += dprobs_expert; dlogits =
  // p ⊙ (dp − Σ_e p_e·dp_e). probs and topk_idx: the forward's.
  virtual void moe_route_backward(Tensor& dlogits, const Tensor& dtopk_w,
                                  const Tensor& dprobs_expert, const Tensor& probs,
                                  const Tensor& topk_idx, bool renormalize) = 0;
  // The dispatch plan: which row of the expert-sorted layout each assignment takes. routed (E):
  // assignments per expert; counts (E): those kept (routed when dropless); dest_row (N, k): the
  // row of assignment (n, j), or −1 where it was dropped. The layout: experts in order, expert e's
  // rows [offset_e, offset_e + counts_e) with offset the exclusive prefix sum of counts, and within
  // an expert its kept assignments in (token n, then slot j) order; so R = Σ counts rows in all,
  // each the destination of exactly one assignment.
  // capacity < 0: dropless, nothing dropped. capacity ≥ 0 (Megatron-LM's "probs" drop policy):
  // an expert routed more than `capacity` assignments keeps the `capacity` of largest topk_w
  // (equal weights: the lower token index first) — still laid out in token order — and drops the
  // rest. topk_idx (N, k): moe_route's (every entry in [0, E): the CPU checks, the GPU trusts);
  // topk_w (N, k): the weights the drop ranks by.
  virtual void moe_dispatch_plan(Tensor& dest_row, Tensor& counts, Tensor& routed,
                                 const Tensor& topk_idx, const Tensor& topk_w, int num_experts,
                                 int64_t capacity) = 0;
  // Token rows into the expert-sorted layout: xp (R, C)[dest_row[n, j]] = x (N, C)[n] for every
  // dest_row ≥ 0 (R: xp's rows; dest_row as moe_dispatch_plan makes it, every row of xp named
  // once). Backward: dx (N, C) = Σ_j dxp[dest_row[n, j]] over j with dest_row ≥ 0, summed in f32
  // in j order (0 where every assignment of the token was dropped).
  virtual void moe_permute(Tensor& xp, const Tensor& x, const Tensor& dest_row) = 0;
  virtual void moe_permute_backward(Tensor& dx, const Tensor& dxp, const Tensor& dest_row) = 0;
  // The experts' rows back to the tokens, weighted: out (N, C) = Σ_j topk_w[n, j] ·
  // y (R, C)[dest_row[n, j]] over j with dest_row ≥ 0, summed in f32 in j order. Backward:
  // dy (R, C)[dest_row[n, j]] = topk_w[n, j] · dout[n] (every row of dy is some assignment's);
  // dtopk_w (N, k) = dout[n] · y[dest_row[n, j]] in f32 (0 for a dropped assignment).
  virtual void moe_unpermute(Tensor& out, const Tensor& y, const Tensor& dest_row,
                             const Tensor& topk_w) = 0;
  virtual void moe_unpermute_backward(Tensor& dy, Tensor& dtopk_w, const Tensor& dout,
                                      const Tensor& y, const Tensor& dest_row,
                                      const Tensor& topk_w) = 0;
  // sums (E) = Σ_n probs (N, E)[n, e]: the load-balancing loss's mean probability per expert
  // (times N). Summed in double on the CPU, in a fixed order on the GPU.
  virtual void moe_prob_sums(Tensor& sums, const Tensor& probs) = 0;

  // Grouped GEMM over experts: rows grouped by expert as moe_dispatch_plan lays them out.
  // rows (G): each group's row count, Σ rows = R; group g's rows [Σ_{h<g} rows_h, + rows_g) of
  // inp (R, I) are multiplied by w[g] of w (G, O, I) (contiguous): out (R, O) = inp_g · w[g]ᵀ.
  // Types as matmul_forward's (any f32/bf16 mix; in bf16 the weights' compute copy is bf16).
  // These defaults run matmul_forward / matmul_backward_input / matmul_backward_weight per group on
  // views, skipping groups of no rows; the CUDA backend runs one cuBLAS grouped GEMM where its
  // toolkit has one and the operands are of one type.
  virtual void grouped_matmul_forward(Tensor& out, const Tensor& inp, const Tensor& w,
                                      const std::vector<int64_t>& rows);
  // dinp (R, I) = dout_g (rows_g, O) · w[g], assigned (a group of no rows has no rows to write).
  virtual void grouped_matmul_backward_input(Tensor& dinp, const Tensor& dout, const Tensor& w,
                                             const std::vector<int64_t>& rows);
  // dw (G, O, I)[g] += dout_gᵀ · inp_g (accumulated, as matmul_backward_weight; f32 in bf16 runs,
  // the main gradient); a group of no rows adds nothing.
  virtual void grouped_matmul_backward_weight(Tensor& dw, const Tensor& dout, const Tensor& inp,
                                              const std::vector<int64_t>& rows);

  // ---- generation with a key/value cache ----
  // kv_cache_append: from qkv (B, T, NH + 2·KVH, HS) (the attention layout above) of the tokens
  // at positions pos0 … pos0 + T − 1, copies the queries to q (B, T, NH, HS) and the key and
  // value heads into k_cache, v_cache (B, S_max, KVH, HS) at those positions (pos0 + T ≤ S_max).
  virtual void kv_cache_append(Tensor& q, Tensor& k_cache, Tensor& v_cache, const Tensor& qkv,
                               int num_heads, int num_kv_heads, int64_t pos0) = 0;
  // attention_decode: out (B, T, NH, HS) = causal attention of those queries over the cache:
  // query t (position pos0 + t) attends to cached positions 0 … pos0 + t with query head h on
  // key/value head h / (NH/KVH), scores scaled by 1/√HS; the same arithmetic as
  // attention_forward's rows (the CPU reference: kernels/cpu/attention.h).
  virtual void attention_decode(Tensor& out, const Tensor& q, const Tensor& k_cache,
                                const Tensor& v_cache, int num_heads, int num_kv_heads,
                                int64_t pos0) = 0;

  // ---- embedding (vocab-parallel shard [vocab_start, vocab_start + wte rows)) ----
  // tokens (B, S) i32; out (B, S, C); wpe (S_max, C) may be null (only the first stage adds it).
  virtual void embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& wte,
                                 const Tensor* wpe, int vocab_start) = 0;
  virtual void embedding_backward(Tensor& dwte, Tensor* dwpe, const Tensor& dout,
                                  const Tensor& tokens, int vocab_start) = 0;

  // ---- vocab-parallel cross-entropy steps (see kernels/cpu/cross_entropy.h) ----
  // logits (N, ld) this shard's columns, `valid` of them real; row stats (N).
  // ce_row_stats: this shard's row max and Σ exp(logit − that max), from one read of the logits
  // on a GPU (an online max and sum). With t > 1 the model reduces the max over the group, then
  // ce_rescale_sumexp: row_sumexp *= exp(local_max − row_max), and sums row_sumexp.
  virtual void ce_row_stats(Tensor& row_max, Tensor& row_sumexp, const Tensor& logits,
                            int valid) = 0;
  virtual void ce_rescale_sumexp(Tensor& row_sumexp, const Tensor& local_max,
                                 const Tensor& row_max) = 0;
  virtual void ce_target_logit(Tensor& target_logit, const Tensor& logits, const Tensor& targets,
                               int vocab_start, int valid) = 0;
  // weights (N) f32, or nullptr (every row weighs 1): the loss mask. Row n's loss is
  // w_n · loss_n and its dlogits row w_n · scale · (softmax − onehot); where w_n == 0 both are
  // exactly 0, whatever the row's logits (NaN and inf included: an ignored position is ignored,
  // as PyTorch's ignore_index). With nullptr the arithmetic is the unweighted one, unchanged.
  virtual void ce_losses(Tensor& losses, const Tensor& row_max, const Tensor& row_sumexp,
                         const Tensor& target_logit, const Tensor* weights) = 0;
  virtual void ce_backward(Tensor& dlogits, const Tensor& logits, const Tensor& row_max,
                           const Tensor& row_sumexp, const Tensor& targets, float scale,
                           int vocab_start, int valid, const Tensor* weights) = 0;

  // ---- sequence-parallel layout changes ----
  // Sequence parallelism gathers (t, B, S/t, C) chunks (one per tensor rank, contiguous) into the
  // model's (B, S, C) layout, and splits it back before a reduce-scatter.
  // seq_interleave: out (B, S, C) ← chunks (t, B, S/t, C); seq_deinterleave: the inverse.
  virtual void seq_interleave(Tensor& out, const Tensor& chunks, int t) = 0;
  virtual void seq_deinterleave(Tensor& chunks, const Tensor& in, int t) = 0;

  // ---- elementwise and reductions ----
  virtual void add_inplace(Tensor& y, const Tensor& x) = 0;             // y += x
  virtual void add(Tensor& out, const Tensor& a, const Tensor& b) = 0;  // out = a + b
  virtual void scale_inplace(Tensor& y, float s) = 0;                   // y *= s
  virtual double sum(const Tensor& x) = 0;                              // Σ x, in double
  // Σ over every tensor of Σ x², in double: one reduction for the lot (on a GPU one launch per
  // few dozen tensors and one round trip to the host, not one per tensor).
  virtual double sum_squares_multi(const std::vector<Tensor>& xs) = 0;
  double sum_squares(const Tensor& x) { return sum_squares_multi({x}); }

  // ---- optimizer ----
  // One AdamW step on every range (runtime/engine/optimizer.h): param, grad, m, v f32 of equal
  // numel per range, weight decay applied where `decay`, each gradient multiplied by grad_scale as
  // it is read (the gradient norm's clipping coefficient: no separate pass over the gradients,
  // which are left as they are). One multi-tensor launch on a GPU instead of one per parameter.
  struct AdamWRange {
    Tensor param;
    Tensor grad;
    Tensor m, v;
    bool decay = true;
  };
  struct AdamWHyper {
    float lr = 0, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0;
    int step = 1;            // 1-based, for the bias corrections
    float grad_scale = 1.f;  // the clipping coefficient
  };
  virtual void adamw_update_multi(const std::vector<AdamWRange>& ranges, const AdamWHyper& h) = 0;
};

// Runs an op written for f32 on operands of any float type: in() gives an f32 view of an input
// (the tensor itself when already f32, else a widened temporary), out() of an output (a
// temporary holding the current values, so accumulating ops work), and the destructor rounds
// every temporary output back into its bf16 tensor. Integer and f32 tensors pass through.
class MixedPrecisionScope {
 public:
  explicit MixedPrecisionScope(Backend& be) : be_(be) {}
  ~MixedPrecisionScope();
  MixedPrecisionScope(const MixedPrecisionScope&) = delete;
  MixedPrecisionScope& operator=(const MixedPrecisionScope&) = delete;
  const Tensor& in(const Tensor& t);
  const Tensor* in(const Tensor* t) { return t ? &in(*t) : nullptr; }
  Tensor& out(Tensor& t);
  Tensor* out(Tensor* t) { return t ? &out(*t) : nullptr; }

 private:
  Backend& be_;
  std::vector<std::unique_ptr<Tensor>> temps_;
  std::vector<std::pair<Tensor*, Tensor*>> write_back_;  // (bf16 destination, f32 temporary)
};

// Which bf16 attention of the CUDA backend runs on cuDNN's fused flash attention
// (train.attention_backend): kNever "strata" (Strata's kernels), kAlways "cudnn" (a shape cuDNN
// refuses is an error), kWhereItRuns "auto" (cuDNN for the shapes it runs, measured 2.7x
// faster than Strata's kernels on an H100; Strata's kernels for the rest and for f32).
enum class CudnnAttentionUse { kNever, kAlways, kWhereItRuns };

// The one factory. device: "auto" (the GPU when one is visible, else the CPU), "cpu" or
// "cuda". threads: CPU worker threads (already resolved, ≥ 1). attention_backend
// (train.attention_backend): "strata", "cudnn" or "auto" (CudnnAttentionUse); the CPU runs
// Strata's kernels, and "cudnn" there is an error.
std::unique_ptr<Backend> make_backend(const std::string& device, int threads,
                                      const std::string& attention_backend = "auto");

// Where make_backend(device, ...) puts tensors: kCUDA for "cuda", kCPU for "cpu", and for
// "auto" whichever make_backend would choose (it asks the driver for the device count).
Device backend_device(const std::string& device);

// CPU threads per rank: train.threads if set, else OMP_NUM_THREADS, else the cores divided by
// the ranks on this node (at least 1), so several ranks on one machine never oversubscribe it.
int resolve_cpu_threads(const std::optional<int>& configured, int ranks_on_node);

// Compiled-in backends, for --version: "cpu, mpi" or "cpu, cuda, mpi, nccl".
std::string compiled_backends();

// The CPU backend's GEMM library, for --version: "OpenBLAS 0.3.21 SkylakeX kernels (chosen by the
// CPU's features; OPENBLAS_CORETYPE overrides), openmp threads,
// /usr/lib/…/libopenblasp-r0.3.21.so".
std::string cpu_kernels();

}  // namespace strata
