// transformer.h — the one transformer model every architecture is a value of: an embedding, L
// blocks (models/layers/block.h) and a head (head.h), described by a TransformerSpec.
// GPT-2 and Llama are pre-norm decoders with an LM head; BERT a post-norm encoder with its
// pre-training heads (models/*/arch.cc build their specs from the config).
//
//   x = embed(tokens) [+ learned positions] [+ token types] [then a norm]
//   L blocks (BlockSpec: norm placement, attention, MLP; one for every layer, or a few kinds:
//            Qwen3-MoE's dense layers are its block with a dense MLP in the mixture's slot)
//   the head: the loss of the micro-batch (lm_head_spec: final norm, LM head, cross-entropy)
//
// Parameters, in the flat buffers' order: the embedding (table, positions, token types, norm),
// layer 0 … L−1 (each "<layer_prefix><l>." + the block's names), the head's. Initialisation:
// weights and embeddings N(0, init_std) (the block's output projections as BlockSpec says),
// biases 0, norm weights 1.
//
// Tensor parallelism and sequence parallelism are the layers' (models/layers/parallel.h): the
// embedding and the LM head vocab-parallel, q/k/v and the MLP's expansion column-parallel, the
// two output projections row-parallel, norms and positions replicated. A rank holds the pieces
// ModelOptions::pieces names (models/model.h); with a tied head split from the embedding over
// pipeline stages, the last stage holds its own copy of the table (head.h).
//
// Thread-safety: one model per rank, driven from one thread.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "models/description.h"
#include "models/layers/block.h"
#include "models/layers/embedding.h"
#include "models/layers/norm.h"
#include "models/layers/rope.h"
#include "models/model.h"
#include "models/transformer/head.h"
#include "runtime/base/config.h"

namespace strata {

// The embedding of a model: a vocab-parallel token table and what is added to it.
struct EmbeddingSpec {
  std::string table;             // the token table's name (Vp, C)
  std::string positions;         // learned positions' table (S, C), "" without (rotary or none)
  std::string types;             // token types' table (type_vocab, C), "" without (BERT's)
  int type_vocab = 0;            //
  std::optional<NormSpec> norm;  // a norm of the sum (BERT's LayerNorm), named norm_name
  std::string norm_name;
};

struct TransformerSpec {
  std::string arch;        // model.arch
  int L = 0;               // layers
  int64_t C = 0;           // hidden size
  int S = 0;               // positions (model.seq_len)
  int V = 0;               // vocabulary
  double init_std = 0.02;  // the embedding's and the head's weights
  EmbeddingSpec embedding;
  // Rotary embeddings (block.attention.rotary): Llama's theta and 3.1's frequency scaling.
  double rope_theta = 10000;
  std::optional<RopeScaling> rope_scaling;
  // The model's block. Layers may take another (Qwen3-MoE's dense layers: `block` with a dense
  // SwiGLU MLP and its names where `block` has the mixture): kind k > 0 of layer_kind is
  // variants[k − 1]. Every layer of a kind is the same block (parameters, work, activations).
  BlockSpec block;
  std::vector<BlockSpec> variants;
  std::vector<int> layer_kind;  // [layer] 0: `block`, k: variants[k − 1]; empty: every layer 0
  std::string layer_prefix;     // "h." → layer 3's parameters are "h.3." + BlockNames
  std::shared_ptr<const HeadSpec> head;
  // Its batches are masked-LM samples (token types, key lengths, a loss mask, sentence labels
  // besides tokens and targets: ModelBatch).
  bool masked_lm = false;
  // The model keys that fix parameter shapes, as plans and checkpoints record them.
  nlohmann::json shape_keys;

  // Kinds of layer (1 + variants), the kind of layer l, the block of kind k and of layer l.
  int kinds() const { return 1 + static_cast<int>(variants.size()); }
  int kind_of(int l) const { return layer_kind.empty() ? 0 : layer_kind[static_cast<size_t>(l)]; }
  const BlockSpec& kind_block(int k) const {
    return k == 0 ? block : variants[static_cast<size_t>(k - 1)];
  }
  const BlockSpec& layer_block(int l) const { return kind_block(kind_of(l)); }
  // The layers whose MLP is a mixture of experts: the L of the load-balancing loss (moe.h).
  int moe_layers() const;
};

// A spec of the sizes the config's common keys give every architecture: layers, hidden size,
// positions, vocabulary, init_std, the attention's heads (model.num_key_value_heads of them
// key/value heads) of hidden/heads each, the MLP's width, and the shape keys they fix. The
// architecture's arch.cc sets the rest (its embedding, norms, options, names and head).
TransformerSpec transformer_sizes(const std::string& arch, const ModelConfig& m);

class TransformerModel final : public Model {
 public:
  TransformerModel(const TransformerSpec& spec, const ModelOptions& options, Backend& backend);
  ~TransformerModel() override;

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
  int boundary_stats() const override;
  void forward_stats(PieceActs& acts, const double* in, double* out, LossSum* loss) override;
  void backward_stats(PieceActs& acts, const double* in, double* out) override;
  std::unique_ptr<GenerationState> start_generation(int batch, int64_t capacity) override;
  Tensor decode_piece(GenerationState& state, int piece, const Tensor& input,
                      const std::vector<int32_t>& tokens, int T,
                      std::vector<float>* logits) override;

  const TransformerSpec& spec() const { return spec_; }
  // What the head of a last-piece forward keeps (lm_head.h's lm_logits, BERT's accessors).
  static const HeadActs& head_acts(const PieceActs& acts);

  // The parameter layout of `pieces` at tensor size t, rank r, expert size e, rank j (built,
  // never allocated): what the model holds on that rank, and what its self-description counts.
  static ParamLayout layout(const TransformerSpec& spec, int tensor, int tensor_rank, bool sp,
                            const std::vector<ModelPiece>& pieces, int expert = 1,
                            int expert_rank = 0);

 private:
  struct Embedding;
  struct Acts;
  // The layers of options.pieces declared into declared_, nothing allocated (layout()).
  TransformerModel(const TransformerSpec& spec, const ModelOptions& options);
  void declare(ParamLayout& layout);
  // The block holding layer `layer` (one this rank holds).
  const TransformerBlock& block(int layer) const;
  // The input of block i of a piece's forward: the piece's input or block i−1's output.
  const Tensor& block_input(const Acts& a, int i) const;
  void report_embedding_ready() const;
  // Context parallelism: the positions of a (B, S/c) batch of this rank's rows; null without.
  const Tensor* context_position_ids(int64_t B, int64_t S);
  // The tokens of a micro-batch of which this rank holds `local`: times the context size.
  double micro_batch_tokens(int64_t local) const;
  // Reports the final gradients of every parameter of `piece`.
  void report_piece_ready(int piece) const;

  TransformerSpec spec_;
  ModelOptions options_;
  std::vector<ModelPiece> pieces_;
  ParamLayout declared_;  // moved into store_ once allocated
  std::unique_ptr<TensorParallel> tp_;
  std::unique_ptr<ParamStore> store_;
  std::unique_ptr<LayerEnv> env_;
  std::unique_ptr<TensorParallel> decode_tp_;  // the tensor group without sequence parallelism
  std::unique_ptr<LayerEnv> decode_env_;       // generation's layer calls
  std::unique_ptr<Embedding> embedding_;       // when this rank holds the first piece
  RotaryEmbedding rope_;                       // with rotary attention, once built on a backend
  // Context parallelism: the positions of this rank's rows, and as (B, S/c) i32 ids for the
  // learned position table (made for the micro-batch size in use).
  std::vector<int64_t> context_positions_;
  Tensor position_ids_;
  std::vector<TransformerBlock> blocks_;  // [layer − first layer of this rank's first piece …]
  std::unique_ptr<ModelHead> head_;       // when this rank holds the last piece
  std::vector<int> block_of_layer_;       // [layer] index into blocks_, -1 when not held
};

// The self-description of a model of `spec` (models/description.h): every figure the sum of what
// its layers report of themselves (models/layers/work.h).
std::unique_ptr<ModelDescription> describe_transformer(const TransformerSpec& spec);

}  // namespace strata
