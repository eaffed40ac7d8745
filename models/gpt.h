// gpt.h — the GPT decoder (GPT-2 architecture) with hand-written forward and backward.
//
// Pre-LayerNorm decoder: token + learned position embeddings; L blocks of
//   a = x + c_proj(attention(c_attn(ln_1(x))))      causal multi-head self-attention
//   y = a + mlp.c_proj(gelu(mlp.c_fc(ln_2(a))))     GELU MLP
// then ln_f and the LM head (tied to wte unless model.tie_embeddings is false), and the mean
// cross-entropy over all tokens. No autograd: each layer's forward saves what its backward needs
// (shapes documented on BlockActs), and backward accumulates parameter gradients.
//
// Parameters live in one flat buffer (and gradients in another of the same layout), in the
// order wte, wpe, h.0.* … h.{L-1}.*, ln_f.*, [lm_head]: one buffer makes the optimizer, gradient
// norm and gradient reduction single loops. Weight matrices use the (out, in) layout: y = x·Wᵀ+b.
// The vocabulary is padded to a multiple of 128 (Megatron's make-vocab-size-divisible-by); padded
// rows are zero, excluded from the loss and never sampled.
//
// Tensor parallelism (Megatron-LM): c_attn and mlp.c_fc are column-parallel (each of the t ranks
// holds a slice of the output rows: for c_attn its heads' query, key and value rows), attn.c_proj
// and mlp.c_proj row-parallel (a slice of the input columns); each block does one all-reduce after
// attention and one after the MLP in the forward pass, and one per column-parallel input gradient
// in the backward pass. wte is vocab-parallel (rows [r·Vp/t, (r+1)·Vp/t)), and so are the logits
// and the cross-entropy: no rank ever holds the full logits. LayerNorms, wpe and the row-parallel
// biases are replicated. With sequence parallelism the LayerNorm regions (residual stream, LayerNorm
// outputs) are sharded along the sequence and the all-reduces become all-gather / reduce-scatter.
//
// Initialisation is a pure function of (train.seed, parameter name, element index): weights
// N(0, init_std), the two residual output projections per block N(0, init_std/√(2L)) as GPT-2
// does, biases 0, LayerNorm weights 1.
//
// Thread-safety: one model per rank, driven from one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/backend.h"
#include "runtime/comm.h"
#include "runtime/config.h"
#include "runtime/tensor.h"

namespace strata {

struct GptDims {
  // Tensor parallelism: this rank's place in a group of `tp` ranks; sp = sequence parallelism.
  int tp = 1;
  int tp_rank = 0;
  bool sp = false;

  int L = 0;   // layers
  int C = 0;   // hidden size
  int NH = 0;  // attention heads
  int F = 0;   // MLP hidden size
  int S = 0;   // maximum sequence length (positions)
  int V = 0;   // vocabulary
  int Vp = 0;  // vocabulary padded to a multiple of 128·tp
  bool tie = true;
  double init_std = 0.02;
  // train.precision "bf16": activations, their gradients and a compute copy of the weights are
  // bf16; the fp32 parameters stay the master copy (optimizer memory) and gradients stay fp32.
  bool bf16 = false;

  // This rank's shard sizes.
  int heads_local() const { return NH / tp; }
  int C_local() const { return C / tp; }
  int F_local() const { return F / tp; }
  int V_local() const { return Vp / tp; }
  int vocab_start() const { return tp_rank * V_local(); }
  // Real (non-padding) vocabulary entries in this rank's shard.
  int vocab_valid() const;
  int seq_local(int S_run) const { return sp ? S_run / tp : S_run; }
};
GptDims gpt_dims(const ModelConfig& m, int tp = 1, int tp_rank = 0, bool sp = false);
int pad_vocab(int vocab, int multiple);

enum class ParamInit { kNormal, kOnes, kZeros };

// How a parameter is divided over the tensor-parallel ranks.
enum class ParamSplit {
  kReplicated,  // every rank holds all of it
  kRows,        // rank r holds rows [r·R/t, (r+1)·R/t) (column-parallel weights and biases, wte)
  kCols,        // rank r holds columns [r·K/t, (r+1)·K/t) (row-parallel weights)
  kQkvRows,     // three row blocks (q, k, v) of C rows, each split as kRows
};

// One named parameter: its shape, where it sits in the flat buffers, how it starts.
struct ParamInfo {
  std::string name;
  Shape shape;       // this rank's shard
  Shape full_shape;  // the whole parameter
  ParamSplit split = ParamSplit::kReplicated;
  int64_t offset = 0;  // elements into the flat buffer
  int64_t numel = 0;
  ParamInit init = ParamInit::kZeros;
  double std = 0;     // for kNormal
  int64_t rows_initialised = -1;  // kNormal: rows past this stay 0 (padded vocabulary); -1 all
  bool decay = false;  // AdamW weight decay applies (matrices and embeddings, not biases/norms)
  // With sequence parallelism each rank sees only its part of the sequence in this parameter's
  // forward (the LayerNorms), so its gradient is a partial sum over the tensor group.
  bool sequence_partial_grad = false;
  // The last pipeline stage's copy of the tied embedding (wte used by the LM head on a stage
  // that does not hold the embedding): its gradient is summed with the first stage's, and it
  // is not counted twice in the gradient norm.
  bool tied_copy = false;
};

// A contiguous piece of the model held by one pipeline stage: layers [first_layer,
// first_layer + num_layers), plus the embeddings when it is the first piece and ln_f, the LM
// head and the loss when it is the last. A stage holds one piece, or v with interleaving.
struct ModelPiece {
  int first_layer = 0;
  int num_layers = 0;
  bool embedding = false;
  bool head = false;
};
// The whole model as one piece.
std::vector<ModelPiece> whole_model(const GptDims& d);

// train.recompute: none keeps every activation for the backward pass; selective recomputes the
// attention core (scores, softmax, weighted sum) from the saved q, k, v; full keeps only each
// block's input and re-runs the block's forward in the backward pass.
enum class Recompute { kNone, kSelective, kFull };
Recompute parse_recompute(const std::string& s);

// Index in the full parameter of element `local` of this rank's shard.
int64_t global_index(const ParamInfo& p, int64_t local, int tp_rank, int tp);

// FLOPs of one training iteration in Megatron-LM's counting (matrix multiplies only; attention
// scores counted over the full S×S as Megatron does).
struct FlopCount {
  double model = 0;     // forward + backward (3× forward)
  double hardware = 0;  // plus recomputed forward passes
};

class GptModel {
 public:
  // What one micro-batch's forward keeps for its backward (defined in gpt.cc).
  struct Acts;
  struct ActsDeleter {
    void operator()(Acts* a) const;
  };
  using ActsPtr = std::unique_ptr<Acts, ActsDeleter>;

  // tp: the tensor-parallel group (size dims.tp), nullptr when dims.tp is 1. pieces: what this
  // pipeline stage holds (empty: the whole model).
  GptModel(const GptDims& dims, Backend& backend, uint64_t seed, Communicator* tp = nullptr,
           std::vector<ModelPiece> pieces = {}, Recompute recompute = Recompute::kNone);
  ~GptModel();
  GptModel(const GptModel&) = delete;
  GptModel& operator=(const GptModel&) = delete;

  const GptDims& dims() const { return dims_; }
  const std::vector<ParamInfo>& param_infos() const { return infos_; }
  int64_t num_parameters() const { return params_.numel(); }
  // Parameters of the whole model without the padded vocabulary rows (the model size).
  int64_t num_real_parameters() const { return real_parameters(dims_); }
  static int64_t real_parameters(const GptDims& d);

  Tensor& params() { return params_; }  // (N) flat, fp32 (the master copy in bf16 mode)
  // Computes with another buffer of the same layout from now on (PipeDream-2BW's weight
  // versions); params() then returns it.
  void use_params(const Tensor& p);
  Tensor& grads() { return grads_; }    // (N) flat, same layout
  // bf16 mode: re-rounds the bf16 compute copy from params() — to call whenever params() was
  // written (optimizer step, parameter all-gather, checkpoint load); a no-op in fp32.
  void params_changed();
  // The element type of activations and of the tensors passed between pipeline stages.
  DType activation_dtype() const { return dims_.bf16 ? DType::kBF16 : DType::kF32; }
  Tensor param(const std::string& name) const;  // a view of params() (fp32)
  Tensor grad(const std::string& name) const;
  const ParamInfo& info(const std::string& name) const;
  // Index of a parameter of this stage in param_infos() (checked: it must exist here).
  int param_index(const std::string& name) const;

  // (Re)initialises every parameter from `seed`.
  void init_parameters(uint64_t seed);
  void zero_grads();

  const std::vector<ModelPiece>& pieces() const { return pieces_; }

  // Forward of one micro-batch through piece `piece`: `input` is the previous piece's output
  // (B, S_local, C), unused by the first piece; tokens, targets (B, S) i32 are read by the first
  // piece (embedding) and the last (loss). Returns the saved activations; on the last piece
  // *loss_sum receives Σ of the B·S token losses (double), elsewhere 0.
  ActsPtr forward_piece(int piece, const Tensor& input, const Tensor& tokens,
                        const Tensor& targets, double* loss_sum);
  // The output a forward_piece produced (B, S_local, C) for the next piece; undefined on the
  // last piece.
  static const Tensor& output(const Acts& acts);
  // Backward of a forward_piece: dout is the gradient of its output (ignored on the last piece,
  // whose gradient starts at the loss). Returns the gradient of its input (undefined on the first
  // piece).
  // defer_weight_grads (zero-bubble B pass): compute only the input gradients and keep what the
  // matrix weight gradients need; backward_weight_piece (the W pass) computes them later.
  // The activations must stay alive until then.
  Tensor backward_piece(Acts& acts, const Tensor& dout, float grad_scale, bool last_microbatch,
                        bool defer_weight_grads = false);
  void backward_weight_piece(Acts& acts, bool last_microbatch);

  // Whole-model forward (single-piece models): tokens, targets (B, S) i32 on this backend's
  // device. Returns the saved activations; *loss_sum receives Σ of the B·S token losses.
  ActsPtr forward(const Tensor& tokens, const Tensor& targets, double* loss_sum);
  // Backward of a forward: accumulates parameter gradients of (grad_scale · Σ token losses),
  // i.e. grad_scale = 1 / (tokens in the global batch) gives the gradient of the mean loss.
  // last_microbatch: gradients are final after this backward (the sequence-parallel LayerNorm
  // gradients are then summed over the tensor group, and the ready hook is called).
  void backward(Acts& acts, float grad_scale, bool last_microbatch = true);
  // Called during the last micro-batch's backward with [first, last) parameter indices whose
  // gradients have just become final, in the order they do: data parallelism starts reducing
  // them while the backward pass goes on.
  void set_grad_ready_hook(std::function<void(int first, int last)> hook) {
    ready_hook_ = std::move(hook);
  }
  // The logits (B·S, Vp) a forward computed (valid until backward consumes them).
  static const Tensor& logits(const Acts& acts);
  // Forward only, for evaluation: Σ of the token losses.
  double loss_sum(const Tensor& tokens, const Tensor& targets);

  static FlopCount flops_per_iteration(const GptDims& d, int64_t global_batch_sequences,
                                       int seq_len, bool full_recompute);
  static std::vector<ParamInfo> layout(const GptDims& d,
                                       const std::vector<ModelPiece>& pieces = {});

 private:
  // recomputing: called from the backward pass to rebuild what recompute dropped (keep it all).
  void block_forward(int l, const Tensor& x, Acts& a, bool recomputing = false);
  void block_backward(int l, const Tensor& x, Acts& a, Tensor& dresid);
  // residual + inp · wᵀ + bias for the row-parallel projection `name` (attn.c_proj, mlp.c_proj),
  // summed over the tensor group: (B, S, C) without sp, this rank's (B, S/t, C) chunk with it.
  // The residual rides in the GEMM where t = 1.
  Tensor projection(const Tensor& inp, const std::string& name, const Tensor& residual);
  // dinp += dout·W now; dW (and db) += now or, when acts defers weight gradients, in the W pass.
  void linear_backward(Acts& a, Tensor* dinp, const std::string& weight, const std::string& bias,
                       const Tensor& dout, const Tensor& inp, bool dout_changes_later = false);
  // Tensor-parallel communication helpers; no-ops when dims_.tp is 1.
  void tp_sum(Tensor& t);                      // all-reduce sum over the tensor group
  Tensor sp_gather(const Tensor& shard);       // (B, S/t, C) → (B, S, C) (sp only)
  Tensor sp_reduce_scatter(const Tensor& full);  // (B, S, C) partial → (B, S/t, C) summed
  // After a column-parallel layer's input gradient (partial over the group): the full-sequence
  // sum (no sp) or this rank's sequence shard of it (sp).
  Tensor reduce_input_grad(Tensor& partial);
  // Before a layer needing the full sequence: the input itself (no sp) or its gather (sp).
  Tensor full_sequence(const Tensor& x);
  void param_ready(const std::string& first, const std::string& last);
  // The weights the forward and backward compute with: the bf16 copy in bf16 mode, else param().
  Tensor cparam(const std::string& name) const;
  Tensor act(const Shape& s);        // an activation of activation_dtype()
  Tensor act_zeros(const Shape& s);
  Tensor stat(const Shape& s);       // f32 statistics (LayerNorm, cross-entropy rows)

  GptDims dims_;
  Backend& be_;
  Communicator* tp_;
  std::function<void(int, int)> ready_hook_;
  bool hook_active_ = false;
  std::vector<ModelPiece> pieces_;
  Recompute recompute_;
  std::vector<ParamInfo> infos_;
  std::unordered_map<std::string, int> index_;  // name → index in infos_ (ops look up by name)
  Tensor params_;  // (N) parameters
  Tensor params_lp_;  // (N) bf16 compute copy (bf16 mode only)
  Tensor grads_;   // (N) gradients
};

}  // namespace strata
