// bert.h — BERT (the "bert" architecture), as Hugging Face's BertForPreTraining computes it, so
// that weights move both ways: composed of the tensor-parallel layers of models/layers/.
//
//   x = LayerNorm(word[tokens] + position[s] + token_type[types])            embeddings
//   L post-norm encoder blocks of
//     a = LayerNorm(x + attention.output.dense(attention(attention.self.qkv(x))))
//     y = LayerNorm(a + output.dense(gelu(intermediate.dense(a))))
//   attention bidirectional over the real keys of each sequence (ModelBatch::key_lengths: a
//   key padding mask), GELU exact (erf), biases everywhere, LayerNorm eps model.layer_norm_eps;
//   then two heads on the last hidden states y:
//     masked LM:   logits = LayerNorm(gelu(transform.dense(y))) · wordᵀ + cls.predictions.bias
//                  (the decoder tied to the word embeddings, its own bias), cross-entropy over
//                  the masked positions only (ModelBatch::loss_mask)
//     sentence:    logits = seq_relationship(tanh(pooler.dense(y[:, 0])))  (2 classes, on
//                  [CLS]), cross-entropy against ModelBatch::sentence_labels (next-sentence
//                  prediction, or sentence order with data.masked_lm.sentence_order)
// The loss of a micro-batch (LossSum) is Σ masked-token losses + w · Σ sentence losses with
// w = ModelBatch::sentence_loss_weight, counting the masked tokens: the iteration's loss is then
// Hugging Face's masked_lm_loss + next_sentence_loss over the global batch.
//
// Parameters (Hugging Face's names without "bert."; the vocabulary padded to 128·t):
//   embeddings.word_embeddings.weight (Vp, C), embeddings.position_embeddings.weight (S, C),
//   embeddings.token_type_embeddings.weight (T, C), embeddings.LayerNorm.{weight,bias};
//   per layer encoder.layer.{i}.attention.self.qkv.{weight (3C, C), bias} (rows: query, key,
//   value: Hugging Face's three matrices stacked), attention.output.dense.*,
//   attention.output.LayerNorm.*, intermediate.dense.{weight (F, C), bias},
//   output.dense.{weight (C, F), bias}, output.LayerNorm.*; then pooler.dense.*,
//   cls.predictions.transform.dense.*, cls.predictions.transform.LayerNorm.*,
//   cls.predictions.bias (Vp, 1) (a column, so that it pads and splits with the vocabulary as
//   the tables' rows do), cls.seq_relationship.{weight (2, C), bias}.
// Initialisation (Hugging Face's _init_weights): matrices and embeddings N(0, init_std), biases
// 0, LayerNorm weights 1.
//
// Parallelism: q/k/v and the MLP's expansion column-parallel, the two output projections
// row-parallel, the embeddings and the decoder vocab-parallel (the masked-LM loss is
// Megatron's vocab-parallel cross-entropy); LayerNorms, positions, token types and the small
// heads (transform, pooler, classifier: ReplicatedLinear) replicated. With sequence parallelism
// the [CLS] rows live on tensor rank 0's chunk and are shared over the group for the pooler.
// Split over pipeline stages, the last stage holds its own copy of the word embeddings for the
// decoder (same name, so the same initial values; its gradient is summed with the first
// stage's every step, as GPT's tied head).
//
// Thread-safety: one model per rank, driven from one thread.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "models/description.h"
#include "models/layers/attention.h"
#include "models/layers/cross_entropy.h"
#include "models/layers/embedding.h"
#include "models/layers/mlp.h"
#include "models/layers/norm.h"
#include "models/model.h"
#include "runtime/base/config.h"

namespace strata {

// The sizes of a BERT (from the config: bert_shape).
struct BertShape {
  int L = 0;   // layers
  int C = 0;   // hidden size
  int NH = 0;  // heads
  int F = 0;   // intermediate size
  int S = 0;   // positions (model.seq_len: Hugging Face's max_position_embeddings)
  int V = 0;   // vocabulary
  int T = 2;   // token types (type_vocab_size)
  double init_std = 0.02;
  double ln_eps = 1e-12;

  int head_size() const { return C / NH; }
};

BertShape bert_shape(const ModelConfig& m);

class BertModel final : public Model {
 public:
  BertModel(const BertShape& shape, const ModelOptions& options, Backend& backend);
  ~BertModel() override;

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

  const BertShape& shape() const { return shape_; }
  // The masked-LM logits (B·S, Vp/t) and the sentence logits (B, 2) of a last-piece forward
  // (valid until its backward consumes them).
  static const Tensor& mlm_logits(const PieceActs& acts);
  static const Tensor& sentence_logits(const PieceActs& acts);
  // The two losses of a last-piece forward, unweighted: Σ over the masked tokens (with their
  // count) and Σ over the sequences.
  static LossSum mlm_loss(const PieceActs& acts);
  static LossSum sentence_loss(const PieceActs& acts);

  // The parameter layout of `pieces` at tensor size t, rank r (built, never allocated): what
  // BertModel holds, and what the self-description counts.
  static ParamLayout layout(const BertShape& shape, int tensor, int tensor_rank, bool sp,
                            const std::vector<ModelPiece>& pieces);

 private:
  struct Block;
  struct Head;
  struct Acts;
  // The layers of options.pieces declared into declared_, nothing allocated (layout()).
  BertModel(const BertShape& shape, const ModelOptions& options);
  void declare(ParamLayout& layout);
  void block_forward(const Block& blk, const Tensor& x, Acts& a, int i, bool recomputing) const;
  // The gradient of the block's input from that of its output (the saved tensors consumed).
  Tensor block_backward(const Block& blk, const Tensor& x, Acts& a, int i, BackwardPass& pass,
                        const Tensor& dout) const;
  void head_forward(Acts& a, LossSum* loss) const;
  Tensor head_backward(Acts& a, BackwardPass& pass, float grad_scale) const;
  // The [CLS] rows (B, C) of a (B, S_local, C) hidden state, on every rank of the group; and
  // the converse: dcls added into those rows of the gradient where this rank holds them.
  Tensor first_tokens(const Tensor& x) const;
  void add_first_tokens(Tensor& dx, const Tensor& dcls) const;
  const Block& block(int layer) const;
  void report_head_ready() const;
  void report_embedding_ready() const;
  void report_piece_ready(int piece) const;

  BertShape shape_;
  ModelOptions options_;
  std::vector<ModelPiece> pieces_;
  ParamLayout declared_;  // moved into store_ once allocated
  std::unique_ptr<TensorParallel> tp_;
  std::unique_ptr<ParamStore> store_;
  std::unique_ptr<LayerEnv> env_;
  VocabParallelEmbedding embedding_;  // when this rank holds the first piece
  Norm embedding_ln_;
  std::vector<Block> blocks_;        // [layer − first layer of this rank's first piece …]
  std::unique_ptr<Head> head_;       // when this rank holds the last piece
  std::vector<int> block_of_layer_;  // [layer] index into blocks_, -1 when not held
};

// The self-description of a BERT (models/description.h).
std::unique_ptr<ModelDescription> describe_bert(const BertShape& shape);

// Hugging Face BertForPreTraining tensors (bert.* and cls.*, q/k/v separate, the vocabulary
// unpadded, cls.predictions.decoder.weight equal to the word embeddings) from our full tensors,
// and the inverse, checked against the config (InputError naming `path` and the tensor).
FullTensors bert_to_hf(const ModelConfig& m, const FullTensors& ours);
FullTensors bert_from_hf(const ModelConfig& m, const FullTensors& hf, const std::string& path);
// BertConfig's config.json for the model, and its check against a directory's config.json.
nlohmann::json bert_hf_config(const ModelConfig& m);
void bert_check_hf_config(const ModelConfig& m, const nlohmann::json& hf, const std::string& path);
// The model keys of a BertConfig config.json.
ModelConfig bert_model_config_from_hf(const nlohmann::json& hf, const std::string& path);
// BertForPreTraining's state-dict order of its tensor names.
std::vector<std::string> bert_hf_order(const ModelConfig& m);
// Tensor names as from_hf reads them; the position_ids buffer older files carry is not a
// parameter (nullopt).
std::optional<std::string> bert_canonical_name(const std::string& name);

// The registry entry (models/registry.h).
struct ArchSpec;
ArchSpec bert_arch();

}  // namespace strata
