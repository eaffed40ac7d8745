// BERT's self-description (models/description.h): parameter counts from the layout BertModel
// declares, FLOPs, and the work and activations of each part as models/bert/bert.cc computes and
// keeps them (docs/planner.md gives the formulas). Unlike the decoder's, the attention is
// bidirectional: its kernels compute the whole S×S score matrix (no causal half), and the last
// piece holds two heads (the masked-LM transform and decoder, the pooler and the 2-way
// classifier).
#include "models/bert/bert.h"

namespace strata {
namespace {

class BertDescription final : public ModelDescription {
 public:
  explicit BertDescription(const BertShape& d) : d_(d) {}

  std::string arch() const override { return "bert"; }
  int num_layers() const override { return d_.L; }
  int seq_len() const override { return d_.S; }
  int hidden_size() const override { return d_.C; }
  int num_heads() const override { return d_.NH; }
  int vocab_size() const override { return d_.V; }
  int64_t padded_vocab(int tensor) const override { return pad_vocab(d_.V, 128 * tensor); }
  std::string summary() const override {
    return std::to_string(d_.L) + " layers, hidden " + std::to_string(d_.C) + ", " +
           std::to_string(d_.NH) + " heads, ffn " + std::to_string(d_.F) + ", seq " +
           std::to_string(d_.S) + ", vocab " + std::to_string(d_.V) + " (encoder)";
  }
  std::string tensor_split_reason(int t, bool sequence_parallel) const override {
    const std::string by = "tensor " + std::to_string(t) + " does not divide ";
    if (t < 1 || d_.NH % t != 0) return by + std::to_string(d_.NH) + " heads";
    if (d_.F % t != 0) return by + "ffn " + std::to_string(d_.F);
    if (sequence_parallel && d_.S % t != 0) return by + "sequence " + std::to_string(d_.S);
    return "";
  }
  nlohmann::json shape_json() const override {
    return {{"num_layers", d_.L},      {"hidden_size", d_.C},     {"num_heads", d_.NH},
            {"ffn_hidden_size", d_.F}, {"seq_len", d_.S},         {"vocab_size", d_.V},
            {"tie_embeddings", true},  {"type_vocab_size", d_.T}, {"layer_norm_eps", d_.ln_eps}};
  }

  int64_t parameters() const override {
    return unpadded_parameters(BertModel::layout(d_, 1, 0, false, whole_model(d_.L)));
  }
  int64_t layer_parameters(int t) const override { return counts(t).layer; }
  int64_t embedding_parameters(int t) const override { return counts(t).embedding; }
  int64_t head_parameters(int t) const override { return counts(t).head; }
  int64_t tied_copy_parameters(int t) const override { return counts(t).tied_copy; }

  FlopCount flops_per_iteration(double sequences, Recompute recompute) const override {
    // Per token, forward: the weight matrices of a layer (q/k/v, output projection, two MLP
    // matrices) and the attention scores and weighted sum over all S keys (2·2·S·C), then the
    // masked-LM transform (C×C) and decoder (C×V) on every position; per sequence the pooler
    // and the classifier on [CLS].
    const double s = d_.S, C = d_.C, F = d_.F, V = d_.V;
    const double attention = 4.0 * s * C;
    const double per_token_layer = 2.0 * (3 * C * C + C * C + 2 * C * F) + attention;
    const double per_token_fwd = d_.L * per_token_layer + 2.0 * C * C + 2.0 * C * V;
    const double per_sequence_fwd = 2.0 * C * C + 2.0 * C * 2;
    const double tokens = sequences * s;
    FlopCount f;
    f.model = 3.0 * (per_token_fwd * tokens + per_sequence_fwd * sequences);
    f.hardware = f.model;
    if (recompute == Recompute::kFull) f.hardware += d_.L * per_token_layer * tokens;
    if (recompute == Recompute::kSelective) f.hardware += d_.L * attention * tokens;
    return f;
  }

  PartWork layer_work(int b, const RankShape& r) const override {
    const double bs = double{1.0} * b * d_.S, h = d_.C, f = d_.F, t = r.tensor;
    const double sl = seq_local(r);
    PartWork w;
    w.gemms = {{bs, 3 * h / t, h}, {bs, h, h / t}, {bs, f / t, h}, {bs, h, f / t}};
    // Bidirectional attention computes the whole s² score matrix (padding keys are skipped by
    // the kernels, which this count does not assume).
    w.attention_flops = 4.0 * b * d_.S * double{1.0} * d_.S * h / t;
    // Two LayerNorms (read + write), two residual adds (2 reads, 1 write), the bias-GELU (read
    // + write), the q/k/v and attention-output layout copies (read + write).
    w.elementwise_fwd = 10 * b * sl * h + 2 * bs * f / t + 2 * bs * 4 * h / t;
    w.elementwise_bwd = 2 * w.elementwise_fwd;
    if (r.tensor > 1) {
      w.tp_collectives_fwd = {bs * h, bs * h};
      w.tp_collectives_bwd = {bs * h, bs * h};
    }
    return w;
  }

  PartWork embedding_work(int b, const RankShape& r) const override {
    const double bs = double{1.0} * b * d_.S, h = d_.C, sl = seq_local(r);
    PartWork w;
    // Gather + position add, the token-type gather and add, the LayerNorm; the backward
    // scatter-adds into the three tables.
    w.elementwise_fwd = 5 * bs * h + 2 * b * sl * h;
    w.elementwise_bwd = 5 * bs * h + 4 * b * sl * h;
    if (r.tensor > 1) w.tp_collectives_fwd = {bs * h};  // the vocab-parallel lookup's sum
    return w;
  }

  PartWork head_work(int b, const RankShape& r) const override {
    const double bs = double{1.0} * b * d_.S, h = d_.C, t = r.tensor;
    const double vl = static_cast<double>(padded_vocab(r.tensor)) / t;
    const double sl = seq_local(r);
    PartWork w;
    // The transform on this rank's rows, the (b·s, V/t) logits, the pooler and classifier.
    w.gemms = {{b * sl, h, h}, {bs, vl, h}, {double{1.0} * b, h, h}, {double{1.0} * b, 2, h}};
    w.f32_fwd = 3 * bs * vl;
    w.f32_bwd = 3 * bs * vl;
    // Bias-GELU and the LayerNorm of the transform.
    w.elementwise_fwd = 4 * b * sl * h;
    w.elementwise_bwd = 8 * b * sl * h;
    if (sp(r)) {
      // The [CLS] rows shared over the group.
      w.tp_collectives_fwd = {double{1.0} * b * h};
    }
    return w;
  }

  // Counted tensor by tensor as BertModel keeps them (BertModel::Block::Saved).
  ActivationElems layer_activations(int b, const RankShape& r, Recompute recompute,
                                    bool flash_attention) const override {
    const double s = d_.S, h = d_.C, f = d_.F, t = r.tensor, a = d_.NH;
    const double sl = seq_local(r);
    const double bsh_l = b * sl * h;
    const double layernorm = bsh_l + Norm::stats_per_token(NormKind::kLayerNorm) * b * sl;
    const double qkv = b * s * 3 * h / t;
    const double probs = flash_attention ? b * a / t * s : b * a / t * s * s;
    const double core = probs + b * s * h / t;
    const double mlp = 2 * b * s * f / t;  // before and after the GELU
    // attention (q/k/v and core), res1, its LayerNorm, MLP, res2, its LayerNorm (the output).
    const double full_block = qkv + core + bsh_l + layernorm + mlp + bsh_l + layernorm;
    // Backward of one layer: d(gelu) and d(fc) together, the residual-stream gradients the
    // post-norm block holds at once (the sum's and the branch's), and with sequence parallelism
    // the gathered full-sequence copy of the block's input or of a LayerNorm output.
    const double grads = 2 * b * s * f / t + 3 * bsh_l + (sp(r) ? b * s * h : 0);
    switch (recompute) {
      case Recompute::kNone:
        return {full_block, grads, 0};
      case Recompute::kSelective:
        return {full_block - core, grads + core, 0};
      case Recompute::kFull:
        return {bsh_l, grads + full_block, 0};
    }
    return {full_block, grads, 0};
  }

  ActivationElems head_activations(int b, const RankShape& r) const override {
    const double s = d_.S, h = d_.C, sl = seq_local(r);
    const double logits = b * s * static_cast<double>(padded_vocab(r.tensor)) / r.tensor;
    ActivationElems e;
    // The transform before and after the GELU, its LayerNorm and statistics, the logits and
    // their row statistics; [CLS], the pooled rows, the sentence logits and statistics.
    e.saved = 3 * b * sl * h + 2 * b * sl + logits + 2 * b * s + 2.0 * b * h + 4.0 * b;
    // d(logits) beside the logits, d(LayerNorm) over the full sequence, d(act), d(pre) and the
    // hidden state's gradient.
    e.transient = logits + b * s * h + 3 * b * sl * h;
    e.freed_before_layers = logits;
    return e;
  }

  double piece_input_elems(int b, const RankShape& r) const override {
    // The input, and per token its id, target, segment and loss mask.
    return b * seq_local(r) * d_.C + 4.0 * b * d_.S;
  }
  double boundary_elems(int b, const RankShape& r) const override {
    return b * seq_local(r) * d_.C;
  }
  double sequence_gather_elems(int b, const RankShape& r) const override {
    return sp(r) ? double{1.0} * b * d_.S * d_.C : 0;
  }
  double attention_scratch_f32(int b, const RankShape& r) const override {
    const double s = d_.S, t = r.tensor;
    return b * s * d_.C / t + b * d_.NH / t * s;
  }
  double cpu_attention_scratch_f32_per_thread() const override { return double{1.0} * d_.S * d_.S; }

 private:
  static bool sp(const RankShape& r) { return r.sequence_parallel && r.tensor > 1; }
  double seq_local(const RankShape& r) const {
    return sp(r) ? static_cast<double>(d_.S) / r.tensor : d_.S;
  }
  PartParameterCounts::Counts counts(int t) const { return counts_.at(t); }

  BertShape d_;
  // The decoder's copy of the word embeddings is always there on a head-only piece.
  PartParameterCounts counts_{
      [d = d_](int t, const std::vector<ModelPiece>& pieces) {
        return BertModel::layout(d, t, 0, false, pieces);
      },
      d_.L, [d = d_](int t) -> int64_t { return pad_vocab(d.V, 128 * t) / t * d.C; }};
};

}  // namespace

std::unique_ptr<ModelDescription> describe_bert(const BertShape& shape) {
  return std::make_unique<BertDescription>(shape);
}

}  // namespace strata
