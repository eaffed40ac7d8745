// The decoder's self-description (models/description.h): parameter counts from the layout
// DecoderModel declares, FLOPs, and the work and activations of each part as
// models/decoder/decoder.cc computes and keeps them (GPT-2 and Llama alike; docs/planner.md
// gives the formulas).
#include "models/decoder/decoder.h"

namespace strata {
namespace {

class DecoderDescription final : public ModelDescription {
 public:
  explicit DecoderDescription(const DecoderShape& d) : d_(d) {}

  std::string arch() const override { return d_.arch; }
  int num_layers() const override { return d_.L; }
  int seq_len() const override { return d_.S; }
  int hidden_size() const override { return d_.C; }
  int num_heads() const override { return d_.NH; }
  int vocab_size() const override { return d_.V; }
  int64_t padded_vocab(int tensor) const override { return pad_vocab(d_.V, 128 * tensor); }
  std::string summary() const override {
    const std::string kv =
        d_.KVH != d_.NH ? " (" + std::to_string(d_.KVH) + " key/value)" : std::string();
    return std::to_string(d_.L) + " layers, hidden " + std::to_string(d_.C) + ", " +
           std::to_string(d_.NH) + " heads" + kv + ", ffn " + std::to_string(d_.F) + ", seq " +
           std::to_string(d_.S) + ", vocab " + std::to_string(d_.V);
  }
  std::string tensor_split_reason(int t, bool sequence_parallel) const override {
    const std::string by = "tensor " + std::to_string(t) + " does not divide ";
    if (t < 1 || d_.NH % t != 0) return by + std::to_string(d_.NH) + " heads";
    if (d_.KVH % t != 0) return by + std::to_string(d_.KVH) + " key/value heads";
    if (d_.F % t != 0) return by + "ffn " + std::to_string(d_.F);
    if (sequence_parallel && d_.S % t != 0) return by + "sequence " + std::to_string(d_.S);
    return "";
  }
  nlohmann::json shape_json() const override {
    nlohmann::json j = {{"num_layers", d_.L},      {"hidden_size", d_.C}, {"num_heads", d_.NH},
                        {"ffn_hidden_size", d_.F}, {"seq_len", d_.S},     {"vocab_size", d_.V},
                        {"tie_embeddings", d_.tie}};
    // The Llama family's keys (GPT-2's record stays as it was: older checkpoints compare equal).
    if (!d_.learned_positions) {
      j["num_key_value_heads"] = d_.KVH;
      j["rope_theta"] = d_.rope_theta;
      j["rope_scaling"] = d_.rope_scaling ? nlohmann::json(*d_.rope_scaling) : nlohmann::json();
      j["rms_norm_eps"] = d_.norm_eps;
    }
    return j;
  }

  int64_t parameters() const override {
    return unpadded_parameters(DecoderModel::layout(d_, 1, 0, false, whole_model(d_.L)));
  }
  int64_t layer_parameters(int t) const override { return counts(t).layer; }
  int64_t embedding_parameters(int t) const override { return counts(t).embedding; }
  int64_t head_parameters(int t) const override { return counts(t).head; }
  int64_t tied_copy_parameters(int t) const override { return counts(t).tied_copy; }

  FlopCount flops_per_iteration(double sequences, Recompute recompute) const override {
    // Per token, forward: 2 FLOPs per multiply-add of every weight matrix (q/k/v with KVH
    // key/value heads, the output projection, two MLP matrices or three with SwiGLU), plus the
    // attention scores QKᵀ and the weighted sum AV over the full S positions (2·2·S·C per
    // layer, every query head).
    const double s = d_.S, C = d_.C, F = d_.F, V = d_.V;
    const double attention = 4.0 * s * C;
    const double per_token_layer =
        2.0 * (C * qkv_width() + C * C + mlp_matrices() * C * F) + attention;
    const double per_token_fwd = d_.L * per_token_layer + 2.0 * C * V;
    const double tokens = sequences * s;
    FlopCount f;
    f.model = 3.0 * per_token_fwd * tokens;
    // Recompute repeats forward work in the backward pass: each layer's whole forward (full),
    // or its attention core (selective); never the head.
    f.hardware = f.model;
    if (recompute == Recompute::kFull) f.hardware += d_.L * per_token_layer * tokens;
    if (recompute == Recompute::kSelective) f.hardware += d_.L * attention * tokens;
    return f;
  }

  PartWork layer_work(int b, const RankShape& r) const override {
    const double bs = double{1.0} * b * d_.S, h = d_.C, f = d_.F, t = r.tensor;
    const double sl = seq_local(r), qkv = qkv_width();
    PartWork w;
    // q/k/v, the attention's output projection, the MLP's expansion ([gate; up] with SwiGLU)
    // and projection, on this rank's slice.
    w.gemms = {
        {bs, qkv / t, h}, {bs, h, h / t}, {bs, (mlp_matrices() - 1) * f / t, h}, {bs, h, f / t}};
    // Causal attention computes half of the s² score matrix Megatron counts.
    w.attention_flops = 0.5 * 4 * b * double{1.0} * d_.S * d_.S * h / t;
    w.attention = {double{1.0} * b, d_.NH / t, d_.KVH / t, double{1.0} * d_.S,
                   double{1.0} * d_.head_size()};
    // Norms (read + write), two residual adds (2 reads, 1 write, a byte mask), bias-GELU (read
    // + write) or SwiGLU (2 reads, 1 write), the q/k/v and attention-output layout copies (read
    // + write), and the rotation of q and k (read + write).
    const double activation = d_.mlp == MlpActivation::kSwiGlu ? 3 : 2;
    const double rope = d_.learned_positions ? 0 : 2 * bs * (qkv - h / d_.NH * d_.KVH) / t;
    w.elementwise_fwd = 11 * b * sl * h + activation * bs * f / t + 2 * bs * (qkv + h) / t + rope;
    w.elementwise_bwd = 2 * w.elementwise_fwd;
    // One reduction after the attention and one after the MLP (all-gather/reduce-scatter pairs
    // with sequence parallelism); the backward's two input-gradient reductions mirror them, and
    // with sequence parallelism the two column-parallel layers gather their input again
    // (models/layers/linear.cc): two more all-gathers, one more all-reduce's worth.
    if (r.tensor > 1) {
      w.tp_collectives_fwd = {bs * h, bs * h};
      w.tp_collectives_bwd = {bs * h, bs * h};
      if (sp(r)) w.tp_collectives_bwd.push_back(bs * h);
    }
    return w;
  }

  PartWork embedding_work(int b, const RankShape& r) const override {
    const double bs = double{1.0} * b * d_.S, h = d_.C;
    PartWork w;
    // Gather (+ position add); the backward scatter-adds into the table.
    const double passes = d_.learned_positions ? 3 : 2;
    w.elementwise_fwd = passes * bs * h;
    w.elementwise_bwd = passes * bs * h;
    // The vocab-parallel lookup's sum (a reduce-scatter, half an all-reduce, with sequence
    // parallelism, whose backward gathers the gradient back: the other half).
    if (r.tensor > 1) w.tp_collectives_fwd = {sp(r) ? bs * h / 2 : bs * h};
    if (sp(r)) w.tp_collectives_bwd = {bs * h / 2};
    return w;
  }

  PartWork head_work(int b, const RankShape& r) const override {
    const double bs = double{1.0} * b * d_.S, h = d_.C, t = r.tensor;
    const double vl = static_cast<double>(padded_vocab(r.tensor)) / t;
    const double sl = seq_local(r);
    PartWork w;
    w.gemms = {{bs, vl, h}};  // the (b·s, V/t) logits
    w.logits = bs * vl;
    // The fp32 cross-entropy reads the logits for its statistics, its target and its gradient.
    w.f32_fwd = 3 * bs * vl;
    w.f32_bwd = 3 * bs * vl;
    w.elementwise_fwd = 2 * b * sl * h;  // ln_f
    w.elementwise_bwd = 4 * b * sl * h;
    // The vocab-parallel head: with sequence parallelism its input gathered (half an
    // all-reduce); the loss's row max, sum of exponentials and target logit over the group
    // (models/layers/cross_entropy.cc); backward, the input gradient's sum (with sequence
    // parallelism a gather of the input again and a reduce-scatter).
    if (r.tensor > 1) {
      w.tp_collectives_fwd = {bs, bs, bs};
      if (sp(r)) w.tp_collectives_fwd.push_back(bs * h / 2);
      w.tp_collectives_bwd = {bs * h};
    }
    return w;
  }

  // Counted tensor by tensor as DecoderModel keeps them (Block::Saved in models/gpt/gpt.cc).
  ActivationElems layer_activations(int b, const RankShape& r, Recompute recompute,
                                    bool flash_attention) const override {
    const double s = d_.S, h = d_.C, f = d_.F, t = r.tensor, a = d_.NH;
    const double sl = seq_local(r);
    const double bsh_l = b * sl * h;
    const double layernorm = bsh_l + Norm::stats_per_token(d_.norm) * b * sl;  // out, statistics
    const double qkv = b * s * qkv_width() / t;
    // The core's saved state: the log-sum-exp per row (fused kernels) or the probabilities.
    const double probs = flash_attention ? b * a / t * s : b * a / t * s * s;
    const double core = probs + b * s * h / t;          // plus the core's output
    const double mlp = b * s * mlp_matrices() * f / t;  // before ([gate | up]) and after
    // ln_1, attention, res1, ln_2, MLP, block output.
    const double full_block = 2 * layernorm + qkv + core + bsh_l + mlp + bsh_l;
    // Backward of one layer: d(gelu) and d(fc) together, the residual gradient, and with
    // sequence parallelism the gathered full-sequence copy of a LayerNorm output. (A GPU that
    // runs c_proj's input gradient and GELU's as one GEMM never holds d(gelu): one (b, s, f/t)
    // buffer less than this, which the prediction keeps as margin for when cuBLASLt declines.)
    const double grads = b * s * mlp_matrices() * f / t + bsh_l + (sp(r) ? b * s * h : 0);
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
    // ln_f output and statistics, the logits (b·s, V/t) and their row statistics.
    e.saved = b * sl * h + Norm::stats_per_token(d_.norm) * b * sl + logits + 2 * b * s;
    // The head's backward: d(logits) beside the logits, d(ln_f) over the full sequence and the
    // residual gradient; a layer's backward comes after the logits are freed.
    e.transient = logits + b * s * h + b * sl * h;
    e.freed_before_layers = logits;
    return e;
  }

  double piece_input_elems(int b, const RankShape& r) const override {
    return b * seq_local(r) * d_.C + 2.0 * b * d_.S;  // the input and the token ids, targets
  }
  double boundary_elems(int b, const RankShape& r) const override {
    return b * seq_local(r) * d_.C;
  }
  double sequence_gather_elems(int b, const RankShape& r) const override {
    return sp(r) ? double{1.0} * b * d_.S * d_.C : 0;
  }
  double attention_scratch_f32(int b, const RankShape& r) const override {
    // The fused attention backward's dq accumulator of the local heads and one row sum per
    // query row (cuDNN's workspace holds the same two).
    const double s = d_.S, t = r.tensor;
    return b * s * d_.C / t + b * d_.NH / t * s;
  }
  double cpu_attention_scratch_f32_per_thread() const override { return double{1.0} * d_.S * d_.S; }

 private:
  static bool sp(const RankShape& r) { return r.sequence_parallel && r.tensor > 1; }
  // Rows of the fused q/k/v weight: NH query and 2·KVH key/value heads.
  double qkv_width() const { return double{1.0} * (d_.NH + 2 * d_.KVH) * d_.head_size(); }
  // Weight matrices of the MLP (GELU: fc, proj; SwiGLU: gate, up, proj).
  double mlp_matrices() const { return d_.mlp == MlpActivation::kSwiGlu ? 3 : 2; }
  double seq_local(const RankShape& r) const {
    return sp(r) ? static_cast<double>(d_.S) / r.tensor : d_.S;
  }
  PartParameterCounts::Counts counts(int t) const { return counts_.at(t); }

  DecoderShape d_;
  PartParameterCounts counts_{
      [d = d_](int t, const std::vector<ModelPiece>& pieces) {
        return DecoderModel::layout(d, t, 0, false, pieces);
      },
      d_.L, [d = d_](int t) -> int64_t { return d.tie ? pad_vocab(d.V, 128 * t) / t * d.C : 0; }};
};

}  // namespace

std::unique_ptr<ModelDescription> describe_decoder(const DecoderShape& shape) {
  return std::make_unique<DecoderDescription>(shape);
}

}  // namespace strata
