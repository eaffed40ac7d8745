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
  int layer_kinds() const override { return d_.kinds(); }
  int layer_kind(int layer) const override { return d_.kind_of(layer); }
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
    std::string mlp = moe.experts > 0 ? std::to_string(moe.experts) + " experts of ffn " +
                                            std::to_string(moe.hidden) + ", " +
                                            std::to_string(moe.top_k) + " per token"
                                      : "ffn " + std::to_string(d_.block.mlp.hidden);
    // The other kinds of layer: " (2 of the layers dense, ffn 96)".
    for (int k = 1; k < d_.kinds(); ++k) {
      int n = 0;
      for (int l = 0; l < d_.L; ++l) n += d_.kind_of(l) == k;
      const MlpSpec& other = d_.kind_block(k).mlp;
      mlp += " (" + std::to_string(n) + " of the layers " +
             (other.is_moe() ? "a mixture" : "dense, ffn " + std::to_string(other.hidden)) + ")";
    }
    const std::string head_size =
        a.head_size * a.heads != d_.C ? " of " + std::to_string(a.head_size) : std::string();
    return std::to_string(d_.L) + " layers, hidden " + std::to_string(d_.C) + ", " +
           std::to_string(a.heads) + " heads" + head_size + kv + ", " + mlp + ", seq " +
           std::to_string(d_.S) + ", vocab " + std::to_string(d_.V) +
           (a.causal ? "" : " (encoder)");
  }
  std::string tensor_split_reason(int t, bool sequence_parallel) const override {
    for (int k = 0; k < d_.kinds(); ++k) {
      const std::string why = TransformerBlock::split_reason(d_.kind_block(k), t);
      if (!why.empty()) return why;
    }
    if (sequence_parallel && d_.S % t != 0)
      return "tensor " + std::to_string(t) + " does not divide sequence " + std::to_string(d_.S);
    return "";
  }
  nlohmann::json shape_json() const override { return d_.shape_keys; }

  int64_t parameters() const override {
    // The first layer's piece with the embedding and the head, unpadded, and every other layer as
    // its kind's count: a layout of every layer took 40 µs a layer (a config of a million layers,
    // 40 s), and the layers have no padded rows.
    const std::vector<int> first = layer_kind_counts(*this, 0, 1);
    const std::vector<int> all = layer_kind_counts(*this, 0, d_.L);
    int64_t n = unpadded_parameters(
        TransformerModel::layout(d_, 1, 0, false, {ModelPiece{0, 1, true, true}}));
    for (size_t k = 0; k < all.size(); ++k)
      n += int64_t{all[k] - first[k]} * layer_parameters(1, static_cast<int>(k));
    return n;
  }
  int64_t layer_parameters(int t, int kind) const override {
    return counts_.at(t).layer.at(static_cast<size_t>(kind));
  }
  int64_t embedding_parameters(int t) const override { return counts_.at(t).embedding; }
  int64_t head_parameters(int t) const override { return counts_.at(t).head; }
  int64_t tied_copy_parameters(int t) const override { return counts_.at(t).tied_copy; }
  int64_t layer_expert_parameters(int t, int kind) const override {
    return counts_.at(t).layer_experts.at(static_cast<size_t>(kind));
  }

  FlopCount flops_per_iteration(double sequences, Recompute recompute) const override {
    // Every layer's own (a dense layer of a mixture counts its MLP, a sparse one its router and
    // active experts).
    const std::vector<int> n = layer_kind_counts(*this, 0, d_.L);
    double per_token_layers = 0, repeated = 0;
    for (int k = 0; k < d_.kinds(); ++k) {
      const BlockSpec& block = d_.kind_block(k);
      const double layers = n[static_cast<size_t>(k)];
      per_token_layers += layers * TransformerBlock::flops_per_token(block, d_.C, d_.S);
      repeated +=
          layers * TransformerBlock::recomputed_flops_per_token(block, d_.C, d_.S, recompute);
    }
    const double per_token_fwd = per_token_layers + d_.head->flops_per_token(d_.C, d_.V);
    const double per_sequence_fwd = d_.head->flops_per_sequence(d_.C);
    const double tokens = sequences * d_.S;
    FlopCount f;
    f.model = 3.0 * (per_token_fwd * tokens + per_sequence_fwd * sequences);
    // Recompute repeats forward work of the layers (never of the head) in the backward pass.
    f.hardware = f.model;
    if (repeated > 0) f.hardware += repeated * tokens;
    return f;
  }

  PartWork layer_work(int b, const RankShape& r, int kind) const override {
    return TransformerBlock::work(d_.kind_block(kind), d_.C, shape(b, r));
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
                                    bool flash_attention, int kind) const override {
    return TransformerBlock::activations(d_.kind_block(kind), d_.C, shape(b, r), recompute,
                                         flash_attention);
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

  // [kind] its first layer.
  static std::vector<int> kind_layers(const TransformerSpec& d) {
    std::vector<int> first(static_cast<size_t>(d.kinds()), -1);
    for (int l = d.L - 1; l >= 0; --l) first[static_cast<size_t>(d.kind_of(l))] = l;
    return first;
  }

  TransformerSpec d_;
  PartParameterCounts counts_{[d = d_](int t, const std::vector<ModelPiece>& pieces) {
                                return TransformerModel::layout(d, t, 0, false, pieces);
                              },
                              d_.L, kind_layers(d_),
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
