// The self-description of a transformer (models/description.h), composed: parameter counts from
// the layout TransformerModel declares, and every figure of work, collectives, activations and
// FLOPs the sum of what its embedding, block (models/layers/block.h) and head report of
// themselves (models/layers/work.h). docs/planner.md gives the resulting formulas.
#include <utility>

#include "models/transformer/transformer.h"

namespace strata {
namespace {

class TransformerDescription final : public ModelDescription {
 public:
  explicit TransformerDescription(TransformerSpec spec) : d_(std::move(spec)) {}

  std::string arch() const override { return d_.arch; }
  int num_layers() const override { return d_.L; }
  int seq_len() const override { return d_.S; }
  int hidden_size() const override { return static_cast<int>(d_.C); }
  int num_heads() const override { return attention().heads; }
  int vocab_size() const override { return d_.V; }
  int num_experts() const override { return d_.block.mlp.moe.experts; }
  int64_t padded_vocab(int tensor) const override { return pad_vocab(d_.V, 128 * tensor); }
  std::string summary() const override {
    const AttentionSpec& a = attention();
    const std::string kv =
        a.kv_heads != a.heads ? " (" + std::to_string(a.kv_heads) + " key/value)" : std::string();
    const MoeSpec& moe = d_.block.mlp.moe;
    const std::string mlp = moe.experts > 0 ? std::to_string(moe.experts) + " experts of ffn " +
                                                  std::to_string(moe.hidden) + ", " +
                                                  std::to_string(moe.top_k) + " per token"
                                            : "ffn " + std::to_string(d_.block.mlp.hidden);
    const std::string head_size =
        a.head_size * a.heads != d_.C ? " of " + std::to_string(a.head_size) : std::string();
    return std::to_string(d_.L) + " layers, hidden " + std::to_string(d_.C) + ", " +
           std::to_string(a.heads) + " heads" + head_size + kv + ", " + mlp + ", seq " +
           std::to_string(d_.S) + ", vocab " + std::to_string(d_.V) +
           (a.causal ? "" : " (encoder)");
  }
  std::string tensor_split_reason(int t, bool sequence_parallel) const override {
    const std::string why = TransformerBlock::split_reason(d_.block, t);
    if (!why.empty()) return why;
    if (sequence_parallel && d_.S % t != 0)
      return "tensor " + std::to_string(t) + " does not divide sequence " + std::to_string(d_.S);
    return "";
  }
  nlohmann::json shape_json() const override { return d_.shape_keys; }

  int64_t parameters() const override {
    return unpadded_parameters(TransformerModel::layout(d_, 1, 0, false, whole_model(d_.L)));
  }
  int64_t layer_parameters(int t) const override { return counts_.at(t).layer; }
  int64_t embedding_parameters(int t) const override { return counts_.at(t).embedding; }
  int64_t head_parameters(int t) const override { return counts_.at(t).head; }
  int64_t tied_copy_parameters(int t) const override { return counts_.at(t).tied_copy; }
  int64_t layer_expert_parameters(int t) const override { return counts_.at(t).layer_experts; }

  FlopCount flops_per_iteration(double sequences, Recompute recompute) const override {
    const double per_token_layer = TransformerBlock::flops_per_token(d_.block, d_.C, d_.S);
    const double per_token_fwd = d_.L * per_token_layer + d_.head->flops_per_token(d_.C, d_.V);
    const double per_sequence_fwd = d_.head->flops_per_sequence(d_.C);
    const double tokens = sequences * d_.S;
    FlopCount f;
    f.model = 3.0 * (per_token_fwd * tokens + per_sequence_fwd * sequences);
    // Recompute repeats forward work of the layers (never of the head) in the backward pass.
    f.hardware = f.model;
    const double repeated =
        TransformerBlock::recomputed_flops_per_token(d_.block, d_.C, d_.S, recompute);
    if (repeated > 0) f.hardware += d_.L * repeated * tokens;
    return f;
  }

  PartWork layer_work(int b, const RankShape& r) const override {
    return TransformerBlock::work(d_.block, d_.C, shape(b, r));
  }
  PartWork embedding_work(int b, const RankShape& r) const override {
    const EmbeddingSpec& e = d_.embedding;
    PartWork w =
        VocabParallelEmbedding::work(d_.C, !e.positions.empty(), !e.types.empty(), shape(b, r));
    if (e.norm) w += Norm::work(d_.C, shape(b, r));
    return w;
  }
  PartWork head_work(int b, const RankShape& r) const override {
    return d_.head->work(d_.C, padded_vocab(r.tensor), shape(b, r));
  }

  ActivationElems layer_activations(int b, const RankShape& r, Recompute recompute,
                                    bool flash_attention) const override {
    return TransformerBlock::activations(d_.block, d_.C, shape(b, r), recompute, flash_attention);
  }
  ActivationElems head_activations(int b, const RankShape& r) const override {
    return d_.head->activations(d_.C, padded_vocab(r.tensor), shape(b, r));
  }
  ActivationElems embedding_activations(int b, const RankShape& r) const override {
    // The piece's input is the embedding's output (piece_input_elems); a norm also keeps its
    // input, the lookup's sum, and its statistics.
    ActivationElems e;
    if (d_.embedding.norm) {
      const WorkShape s = shape(b, r);
      e.saved = s.tokens_local() * static_cast<double>(d_.C) +
                Norm::stats_per_token(d_.embedding.norm->kind) * s.tokens_local();
    }
    return e;
  }

  double piece_input_elems(int b, const RankShape& r) const override {
    // The input, and per token its id and target (masked LM: its segment and loss mask too).
    return b * shape(b, r).seq_local() * d_.C + (d_.masked_lm ? 4.0 : 2.0) * b * d_.S;
  }
  double boundary_elems(int b, const RankShape& r) const override {
    return b * shape(b, r).seq_local() * d_.C;
  }
  double sequence_gather_elems(int b, const RankShape& r) const override {
    return shape(b, r).sp ? double{1.0} * b * d_.S * d_.C : 0;
  }
  double attention_scratch_f32(int b, const RankShape& r) const override {
    return SelfAttention::scratch_f32(attention(), shape(b, r));
  }
  double cpu_attention_scratch_f32_per_thread() const override { return double{1.0} * d_.S * d_.S; }

 private:
  const AttentionSpec& attention() const { return d_.block.attention; }
  WorkShape shape(int b, const RankShape& r) const { return WorkShape(b, d_.S, r); }

  TransformerSpec d_;
  PartParameterCounts counts_{[d = d_](int t, const std::vector<ModelPiece>& pieces) {
                                return TransformerModel::layout(d, t, 0, false, pieces);
                              },
                              d_.L,
                              [d = d_](int t) -> int64_t {
                                return d.head->ties_embedding() ? pad_vocab(d.V, 128 * t) / t * d.C
                                                                : 0;
                              }};
};

}  // namespace

std::unique_ptr<ModelDescription> describe_transformer(const TransformerSpec& spec) {
  return std::make_unique<TransformerDescription>(spec);
}

}  // namespace strata
