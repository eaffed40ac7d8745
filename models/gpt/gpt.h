// gpt.h — the GPT decoder (GPT-2 architecture), composed of the tensor-parallel layers of
// models/layers/.
//
// Pre-LayerNorm decoder: token + learned position embeddings; L blocks of
//   a = x + attn.c_proj(attention(attn.c_attn(ln_1(x))))   causal multi-head self-attention
//   y = a + mlp.c_proj(gelu(mlp.c_fc(ln_2(a))))            GELU MLP
// then ln_f and the LM head (tied to wte unless model.tie_embeddings is false), and the mean
// cross-entropy. Parameter names are GPT-2's (Hugging Face's without the `transformer.` prefix);
// weight matrices are (out, in): y = x·Wᵀ + b. The flat order is wte, wpe, h.0.* … h.{L-1}.*,
// ln_f.*, [lm_head]. Initialisation: weights N(0, init_std), the two residual output
// projections of each block N(0, init_std/√(2L)) as GPT-2 does, biases 0, LayerNorm weights 1.
//
// Tensor parallelism and sequence parallelism are the layers' (models/layers/parallel.h): wte
// and the LM head are vocab-parallel, c_attn and mlp.c_fc column-parallel, the two c_proj
// row-parallel, LayerNorms and wpe replicated. With tied embeddings split over pipeline stages,
// the last stage holds its own copy of wte (same name, so the same initial values; its gradient
// is summed with the first stage's every step, so it stays equal).
//
// Thread-safety: one model per rank, driven from one thread.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "models/description.h"
#include "models/layers/attention.h"
#include "models/layers/cross_entropy.h"
#include "models/layers/embedding.h"
#include "models/layers/layernorm.h"
#include "models/layers/mlp.h"
#include "models/model.h"
#include "runtime/config.h"

namespace strata {

// The model keys GPT reads, checked (sizes that must divide by the tensor-parallel size).
struct GptShape {
  int L = 0;   // layers
  int C = 0;   // hidden size
  int NH = 0;  // attention heads
  int F = 0;   // MLP hidden size
  int S = 0;   // maximum sequence length (positions)
  int V = 0;   // vocabulary
  bool tie = true;
  double init_std = 0.02;
};
GptShape gpt_shape(const ModelConfig& m);

class GptModel final : public Model {
 public:
  GptModel(const GptShape& shape, const ModelOptions& options, Backend& backend);
  ~GptModel() override;

  ParamStore& params() override { return *store_; }
  const ParamStore& params() const override { return *store_; }
  const std::vector<ModelPiece>& pieces() const override { return pieces_; }
  DType activation_dtype() const override { return options_.bf16 ? DType::kBF16 : DType::kF32; }
  Shape boundary_shape(int micro_batch, int seq_len) const override;

  PieceActsPtr forward_piece(int piece, const Tensor& input, const ModelBatch& batch,
                             LossSum* loss) override;
  const Tensor& piece_output(const PieceActs& acts) const override;
  Tensor backward_piece(PieceActs& acts, const Tensor& dout, float grad_scale, bool last_microbatch,
                        bool defer_weight_grads) override;
  void backward_weight_piece(PieceActs& acts, bool last_microbatch) override;
  void rerun_selective_recompute(const PieceActs& acts) override;

  // The logits (B·S, Vp/t) of a last-piece forward (valid until its backward consumes them).
  static const Tensor& logits(const PieceActs& acts);

  // The parameter layout of `pieces` at tensor size t, rank r (built, never allocated): what
  // GptModel holds, and what the self-description counts.
  static ParamLayout layout(const GptShape& shape, int tensor, int tensor_rank, bool sp,
                            const std::vector<ModelPiece>& pieces);

 private:
  struct Block;
  struct Head;
  struct Acts;
  // The layers of options.pieces declared into declared_, nothing allocated (layout()).
  GptModel(const GptShape& shape, const ModelOptions& options);
  // Builds this rank's layers, declaring their parameters into `layout`.
  void declare(ParamLayout& layout);
  void block_forward(const Block& blk, const Tensor& x, Acts& a, int i, bool recomputing) const;
  void block_backward(const Block& blk, const Tensor& x, Acts& a, int i, BackwardPass& pass,
                      Tensor& dresid) const;
  // The block holding layer `layer` (one this rank holds).
  const Block& block(int layer) const;
  // Reports the final gradients of the head's parameters, of every parameter of `piece`.
  void report_head_ready() const;
  void report_piece_ready(int piece) const;

  GptShape shape_;
  ModelOptions options_;
  std::vector<ModelPiece> pieces_;
  ParamLayout declared_;  // moved into store_ once allocated
  std::unique_ptr<TensorParallel> tp_;
  std::unique_ptr<ParamStore> store_;
  std::unique_ptr<LayerEnv> env_;
  VocabParallelEmbedding embedding_;  // when this rank holds the first piece
  std::vector<Block> blocks_;         // [layer − first layer of this rank's first piece …]
  std::unique_ptr<Head> head_;        // when this rank holds the last piece
  std::vector<int> block_of_layer_;   // [layer] index into blocks_, -1 when not held
};

// The self-description of a GPT config (models/description.h).
std::unique_ptr<ModelDescription> describe_gpt(const ModelConfig& m);

// Hugging Face GPT2LMHeadModel tensors (transformer.wte.weight (V, C) unpadded, Conv1D weights
// (in, out), lm_head.weight equal to wte) from our full tensors, and the inverse, checked
// against the config.
FullTensors gpt_to_hf(const ModelConfig& m, const FullTensors& ours);
FullTensors gpt_from_hf(const ModelConfig& m, const FullTensors& hf, const std::string& path);
// GPT2Config's config.json for the model, and its check against a directory's config.json
// (InputError(path, key, both values) on a shape key, the activation or the LayerNorm eps).
nlohmann::json gpt_hf_config(const ModelConfig& m);
void gpt_check_hf_config(const ModelConfig& m, const nlohmann::json& hf, const std::string& path);
// GPT2LMHeadModel's state-dict order of the tensor names (how save_pretrained shards).
std::vector<std::string> gpt_hf_order(const ModelConfig& m);

// The registry entry (models/registry.h).
struct ArchSpec;
ArchSpec gpt_arch();

}  // namespace strata
