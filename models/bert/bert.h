// bert.h — BERT (the "bert" architecture), as Hugging Face's BertForPreTraining computes it, so
// that weights move both ways: a post-norm transformer (models/transformer/) with BERT's
// pre-training heads (models/bert/head.cc).
//
//   x = LayerNorm(word[tokens] + position[s] + token_type[types])            embeddings
//   L post-norm encoder blocks (models/layers/block.h) of
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
// Thread-safety: pure functions (the head: as the model).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "models/transformer/transformer.h"
#include "runtime/base/config.h"

namespace strata {

// BERT of a config's model keys: the post-norm encoder and its pre-training heads.
TransformerSpec bert_spec(const ModelConfig& m);

// BertForPreTraining's two heads (models/transformer/head.h), with LayerNorm eps `ln_eps`. Its
// self-description: the transform on this rank's rows (with its GELU and LayerNorm), the
// decoder's (b·s, V/t) logits and their loss, the pooler (with its tanh) and the classifier on
// [CLS] and the sentence loss, with sp the [CLS] rows shared over the group; FLOPs: the transform
// and the decoder on every position, the pooler and classifier per sequence.
std::shared_ptr<const HeadSpec> bert_head_spec(double ln_eps);

// The masked-LM logits (B·S, Vp/t) and the sentence logits (B, 2) of a last-piece forward
// (valid until its backward consumes them), and its two losses, unweighted: Σ over the masked
// tokens (with their count) and Σ over the sequences.
const Tensor& bert_mlm_logits(const PieceActs& acts);
const Tensor& bert_sentence_logits(const PieceActs& acts);
LossSum bert_mlm_loss(const PieceActs& acts);
LossSum bert_sentence_loss(const PieceActs& acts);

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
