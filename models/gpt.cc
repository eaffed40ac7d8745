#include "models/gpt.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "runtime/check.h"
#include "runtime/rng.h"

namespace strata {

int pad_vocab(int vocab, int multiple) { return (vocab + multiple - 1) / multiple * multiple; }

GptDims gpt_dims(const ModelConfig& m) {
  GptDims d;
  d.L = m.num_layers;
  d.C = m.hidden_size;
  d.NH = m.num_heads;
  d.F = m.ffn_hidden_size;
  d.S = m.seq_len;
  d.V = m.vocab_size;
  d.Vp = pad_vocab(m.vocab_size, 128);
  d.tie = m.tie_embeddings;
  d.init_std = m.init_std;
  return d;
}

std::vector<ParamInfo> GptModel::layout(const GptDims& d) {
  std::vector<ParamInfo> v;
  int64_t offset = 0;
  auto add = [&](std::string name, Shape shape, ParamInit init, double std, bool decay,
                 int64_t rows = -1) {
    ParamInfo p;
    p.name = std::move(name);
    p.shape = std::move(shape);
    p.numel = shape_numel(p.shape);
    p.offset = offset;
    p.init = init;
    p.std = std;
    p.decay = decay;
    p.rows_initialised = rows;
    offset += p.numel;
    v.push_back(std::move(p));
  };
  const double std = d.init_std;
  const double proj_std = d.init_std / std::sqrt(2.0 * d.L);  // GPT-2's residual scaling
  add("wte", {d.Vp, d.C}, ParamInit::kNormal, std, true, d.V);
  add("wpe", {d.S, d.C}, ParamInit::kNormal, std, true);
  for (int l = 0; l < d.L; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    add(h + "ln_1.weight", {d.C}, ParamInit::kOnes, 0, false);
    add(h + "ln_1.bias", {d.C}, ParamInit::kZeros, 0, false);
    add(h + "attn.c_attn.weight", {3 * d.C, d.C}, ParamInit::kNormal, std, true);
    add(h + "attn.c_attn.bias", {3 * d.C}, ParamInit::kZeros, 0, false);
    add(h + "attn.c_proj.weight", {d.C, d.C}, ParamInit::kNormal, proj_std, true);
    add(h + "attn.c_proj.bias", {d.C}, ParamInit::kZeros, 0, false);
    add(h + "ln_2.weight", {d.C}, ParamInit::kOnes, 0, false);
    add(h + "ln_2.bias", {d.C}, ParamInit::kZeros, 0, false);
    add(h + "mlp.c_fc.weight", {d.F, d.C}, ParamInit::kNormal, std, true);
    add(h + "mlp.c_fc.bias", {d.F}, ParamInit::kZeros, 0, false);
    add(h + "mlp.c_proj.weight", {d.C, d.F}, ParamInit::kNormal, proj_std, true);
    add(h + "mlp.c_proj.bias", {d.C}, ParamInit::kZeros, 0, false);
  }
  add("ln_f.weight", {d.C}, ParamInit::kOnes, 0, false);
  add("ln_f.bias", {d.C}, ParamInit::kZeros, 0, false);
  if (!d.tie) add("lm_head.weight", {d.Vp, d.C}, ParamInit::kNormal, std, true, d.V);
  return v;
}

GptModel::GptModel(const GptDims& dims, Backend& backend, uint64_t seed)
    : dims_(dims), be_(backend), infos_(layout(dims)) {
  STRATA_CHECK(dims_.C % dims_.NH == 0, "hidden " << dims_.C << " % heads " << dims_.NH);
  const int64_t n = infos_.back().offset + infos_.back().numel;
  params_ = be_.empty({n}, MemCategory::kParameters);
  grads_ = be_.zeros({n}, MemCategory::kGradients);
  init_parameters(seed);
}

GptModel::~GptModel() = default;

int64_t GptModel::num_real_parameters() const {
  int64_t n = 0;
  for (const ParamInfo& p : infos_) {
    n += p.rows_initialised >= 0 ? p.rows_initialised * p.shape[1] : p.numel;
  }
  return n;
}

const ParamInfo& GptModel::info(const std::string& name) const {
  for (const ParamInfo& p : infos_)
    if (p.name == name) return p;
  STRATA_CHECK(false, "no parameter named " << name);
  return infos_.front();
}

Tensor GptModel::param(const std::string& name) const {
  const ParamInfo& p = info(name);
  return params_.view(p.offset, p.shape);
}

Tensor GptModel::grad(const std::string& name) const {
  const ParamInfo& p = info(name);
  return grads_.view(p.offset, p.shape);
}

void GptModel::init_parameters(uint64_t seed) {
  // Values are produced on the host and uploaded, so every backend starts from identical bits.
  std::vector<float> host(static_cast<size_t>(params_.numel()), 0.0f);
  for (const ParamInfo& p : infos_) {
    float* dst = host.data() + p.offset;
    switch (p.init) {
      case ParamInit::kZeros: break;
      case ParamInit::kOnes: std::fill(dst, dst + p.numel, 1.0f); break;
      case ParamInit::kNormal: {
        const uint64_t key = mix64(seed ^ hash_name(p.name));
        const int64_t n =
            p.rows_initialised >= 0 ? p.rows_initialised * shape_numel({p.shape.begin() + 1,
                                                                        p.shape.end()})
                                    : p.numel;
        for (int64_t i = 0; i < n; ++i)
          dst[i] = static_cast<float>(p.std * normal01(key, static_cast<uint64_t>(i)));
        break;
      }
    }
  }
  be_.upload(params_, host.data());
}

void GptModel::zero_grads() { be_.zero(grads_); }

// ---------------------------------------------------------------------------------------------
// Activations. B = micro-batch, S = sequence, C = hidden, F = MLP hidden, NH = heads,
// Vp = padded vocabulary. Everything is accounted as activations.

struct BlockActs {
  Tensor ln1;       // (B, S, C)  ln_1(x)
  Tensor ln1_mean;  // (B, S)
  Tensor ln1_rstd;  // (B, S)
  Tensor qkv;       // (B, S, 3C)  [q | k | v], heads contiguous within each
  Tensor att;       // (B, NH, S, S) softmax probabilities
  Tensor atty;      // (B, S, C)  attention output before c_proj
  Tensor res1;      // (B, S, C)  x + attn(x)
  Tensor ln2;       // (B, S, C)
  Tensor ln2_mean;  // (B, S)
  Tensor ln2_rstd;  // (B, S)
  Tensor fch;       // (B, S, F)  c_fc output, before GELU
  Tensor fch_gelu;  // (B, S, F)
  Tensor out;       // (B, S, C)  block output = next block's input
};

struct GptModel::Acts {
  Tensor tokens;             // (B, S) i32
  Tensor targets;            // (B, S) i32
  Tensor x0;                 // (B, S, C) embedding output
  std::vector<BlockActs> h;  // [layer]
  Tensor lnf;                // (B, S, C)
  Tensor lnf_mean;           // (B, S)
  Tensor lnf_rstd;           // (B, S)
  Tensor logits;             // (B·S, Vp)
  Tensor row_max;            // (B·S)
  Tensor row_sumexp;         // (B·S)
};

namespace {
constexpr MemCategory kAct = MemCategory::kActivations;
}

void GptModel::ActsDeleter::operator()(Acts* a) const { delete a; }

GptModel::ActsPtr GptModel::forward(const Tensor& tokens, const Tensor& targets,
                                    double* loss_sum) {
  const GptDims& d = dims_;
  const int64_t B = tokens.size(0), S = tokens.size(1);
  STRATA_CHECK(S <= d.S, "sequence " << S << " > model.seq_len " << d.S);
  ActsPtr a(new Acts());
  a->tokens = tokens;
  a->targets = targets;

  Tensor wte = param("wte");
  Tensor wpe = param("wpe");
  a->x0 = be_.empty({B, S, d.C}, kAct);
  be_.embedding_forward(a->x0, tokens, wte, &wpe, 0);

  Tensor x = a->x0;
  a->h.resize(static_cast<size_t>(d.L));
  for (int l = 0; l < d.L; ++l) {
    const std::string p = "h." + std::to_string(l) + ".";
    BlockActs& h = a->h[static_cast<size_t>(l)];
    h.ln1 = be_.empty({B, S, d.C}, kAct);
    h.ln1_mean = be_.empty({B, S}, kAct);
    h.ln1_rstd = be_.empty({B, S}, kAct);
    be_.layernorm_forward(h.ln1, h.ln1_mean, h.ln1_rstd, x, param(p + "ln_1.weight"),
                          param(p + "ln_1.bias"));
    h.qkv = be_.empty({B, S, 3 * d.C}, kAct);
    const Tensor qkv_b = param(p + "attn.c_attn.bias");
    be_.matmul_forward(h.qkv, h.ln1, param(p + "attn.c_attn.weight"), &qkv_b);
    h.att = be_.empty({B, d.NH, S, S}, kAct);
    h.atty = be_.empty({B, S, d.C}, kAct);
    be_.attention_forward(h.atty, h.att, h.qkv, d.NH);
    h.res1 = be_.empty({B, S, d.C}, kAct);
    const Tensor proj_b = param(p + "attn.c_proj.bias");
    be_.matmul_forward(h.res1, h.atty, param(p + "attn.c_proj.weight"), &proj_b);
    be_.add_inplace(h.res1, x);

    h.ln2 = be_.empty({B, S, d.C}, kAct);
    h.ln2_mean = be_.empty({B, S}, kAct);
    h.ln2_rstd = be_.empty({B, S}, kAct);
    be_.layernorm_forward(h.ln2, h.ln2_mean, h.ln2_rstd, h.res1, param(p + "ln_2.weight"),
                          param(p + "ln_2.bias"));
    h.fch = be_.empty({B, S, d.F}, kAct);
    const Tensor fc_b = param(p + "mlp.c_fc.bias");
    be_.matmul_forward(h.fch, h.ln2, param(p + "mlp.c_fc.weight"), &fc_b);
    h.fch_gelu = be_.empty({B, S, d.F}, kAct);
    be_.gelu_forward(h.fch_gelu, h.fch);
    h.out = be_.empty({B, S, d.C}, kAct);
    const Tensor mp_b = param(p + "mlp.c_proj.bias");
    be_.matmul_forward(h.out, h.fch_gelu, param(p + "mlp.c_proj.weight"), &mp_b);
    be_.add_inplace(h.out, h.res1);
    x = h.out;
  }

  a->lnf = be_.empty({B, S, d.C}, kAct);
  a->lnf_mean = be_.empty({B, S}, kAct);
  a->lnf_rstd = be_.empty({B, S}, kAct);
  be_.layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, x, param("ln_f.weight"),
                        param("ln_f.bias"));
  const int64_t N = B * S;
  a->logits = be_.empty({N, d.Vp}, kAct);
  be_.matmul_forward(a->logits, a->lnf, param(d.tie ? "wte" : "lm_head.weight"), nullptr);
  a->row_max = be_.empty({N}, kAct);
  a->row_sumexp = be_.empty({N}, kAct);
  be_.ce_row_max(a->row_max, a->logits, d.V);
  be_.ce_row_sumexp(a->row_sumexp, a->logits, a->row_max, d.V);
  Tensor target_logit = be_.empty({N}, kAct);
  be_.ce_target_logit(target_logit, a->logits, targets, 0, d.V);
  Tensor losses = be_.empty({N}, kAct);
  be_.ce_losses(losses, a->row_max, a->row_sumexp, target_logit);
  *loss_sum = be_.sum(losses);
  return a;
}

void GptModel::backward(Acts& a, float grad_scale) {
  const GptDims& d = dims_;
  const int64_t B = a.tokens.size(0), S = a.tokens.size(1), N = B * S;

  // Head: dlogits = grad_scale · (softmax − onehot); padded columns get 0.
  Tensor dresid = be_.zeros({B, S, d.C}, kAct);  // gradient of the residual stream
  {
    Tensor dlogits = be_.empty({N, d.Vp}, kAct);
    be_.ce_backward(dlogits, a.logits, a.row_max, a.row_sumexp, a.targets, grad_scale, 0, d.V);
    a.logits = Tensor();  // the largest activation: release it as soon as it is consumed
    Tensor dlnf = be_.zeros({B, S, d.C}, kAct);
    const std::string head = d.tie ? "wte" : "lm_head.weight";
    Tensor dhead = grad(head);
    be_.matmul_backward(&dlnf, dhead, nullptr, dlogits, a.lnf, param(head));
    const Tensor x_last = d.L > 0 ? a.h.back().out : a.x0;
    Tensor dw = grad("ln_f.weight"), db = grad("ln_f.bias");
    be_.layernorm_backward(dresid, dw, db, dlnf, x_last, param("ln_f.weight"), a.lnf_mean,
                           a.lnf_rstd);
  }

  for (int l = d.L - 1; l >= 0; --l) {
    const std::string p = "h." + std::to_string(l) + ".";
    BlockActs& h = a.h[static_cast<size_t>(l)];
    const Tensor& x = l > 0 ? a.h[static_cast<size_t>(l - 1)].out : a.x0;
    // MLP branch: dresid holds d(out); it is also d(res1) through the residual.
    {
      Tensor dgelu = be_.zeros({B, S, d.F}, kAct);
      Tensor dw = grad(p + "mlp.c_proj.weight"), db = grad(p + "mlp.c_proj.bias");
      be_.matmul_backward(&dgelu, dw, &db, dresid, h.fch_gelu, param(p + "mlp.c_proj.weight"));
      Tensor dfch = be_.zeros({B, S, d.F}, kAct);
      be_.gelu_backward(dfch, h.fch, dgelu);
      dgelu = Tensor();
      Tensor dln2 = be_.zeros({B, S, d.C}, kAct);
      Tensor dfw = grad(p + "mlp.c_fc.weight"), dfb = grad(p + "mlp.c_fc.bias");
      be_.matmul_backward(&dln2, dfw, &dfb, dfch, h.ln2, param(p + "mlp.c_fc.weight"));
      Tensor dlw = grad(p + "ln_2.weight"), dlb = grad(p + "ln_2.bias");
      be_.layernorm_backward(dresid, dlw, dlb, dln2, h.res1, param(p + "ln_2.weight"),
                             h.ln2_mean, h.ln2_rstd);
    }
    // Attention branch: dresid now holds d(res1), also d(x) through the residual.
    {
      Tensor datty = be_.zeros({B, S, d.C}, kAct);
      Tensor dw = grad(p + "attn.c_proj.weight"), db = grad(p + "attn.c_proj.bias");
      be_.matmul_backward(&datty, dw, &db, dresid, h.atty, param(p + "attn.c_proj.weight"));
      Tensor dqkv = be_.zeros({B, S, 3 * d.C}, kAct);
      be_.attention_backward(dqkv, datty, h.qkv, h.att, d.NH);
      datty = Tensor();
      Tensor dln1 = be_.zeros({B, S, d.C}, kAct);
      Tensor dqw = grad(p + "attn.c_attn.weight"), dqb = grad(p + "attn.c_attn.bias");
      be_.matmul_backward(&dln1, dqw, &dqb, dqkv, h.ln1, param(p + "attn.c_attn.weight"));
      Tensor dlw = grad(p + "ln_1.weight"), dlb = grad(p + "ln_1.bias");
      be_.layernorm_backward(dresid, dlw, dlb, dln1, x, param(p + "ln_1.weight"), h.ln1_mean,
                             h.ln1_rstd);
    }
    h = BlockActs();  // this block's activations are consumed
  }

  Tensor dwte = grad("wte"), dwpe = grad("wpe");
  be_.embedding_backward(dwte, &dwpe, dresid, a.tokens, 0);
}

const Tensor& GptModel::logits(const Acts& acts) { return acts.logits; }

double GptModel::loss_sum(const Tensor& tokens, const Tensor& targets) {
  double s = 0;
  forward(tokens, targets, &s);  // the activations are dropped at once
  return s;
}

FlopCount GptModel::flops_per_iteration(const GptDims& d, int64_t sequences, int seq_len,
                                        bool full_recompute) {
  // Per token, forward: 2 FLOPs per multiply-add of every weight matrix, plus the attention
  // scores QKᵀ and the weighted sum AV over the full S positions (2·2·S·C per layer).
  const double s = seq_len, C = d.C, F = d.F, V = d.V;
  const double per_token_layer = 2.0 * (3 * C * C + C * C + 2 * C * F) + 4.0 * s * C;
  const double per_token_fwd = d.L * per_token_layer + 2.0 * C * V;
  const double tokens = static_cast<double>(sequences) * s;
  FlopCount f;
  f.model = 3.0 * per_token_fwd * tokens;
  // Full recompute re-runs each layer's forward (not the head) in the backward pass.
  f.hardware = f.model + (full_recompute ? d.L * per_token_layer * tokens : 0.0);
  return f;
}

MemoryPrediction GptModel::predict_memory(const GptDims& d, int micro_batch, int seq_len,
                                          int threads) {
  MemoryPrediction m;
  int64_t n = 0;
  for (const ParamInfo& p : layout(d)) n += p.numel;
  m.parameters = 4 * n;
  m.gradients = 4 * n;
  m.optimizer = 8 * n;  // AdamW m and v in fp32
  const int64_t B = micro_batch, S = seq_len, C = d.C, F = d.F, NH = d.NH, Vp = d.Vp;
  const int64_t BS = B * S;
  // Saved by forward (see BlockActs / Acts), in floats.
  const int64_t block = 8 * BS * C + 2 * BS * F + 4 * BS + B * NH * S * S;
  const int64_t saved = 2 * BS /* tokens, targets */ + BS * C /* x0 */ + d.L * block +
                        BS * C + 2 * BS /* ln_f */ + BS * Vp + 2 * BS /* logits, stats */;
  // Transient peak of backward: at the head, dlogits + dresid + dlnf while everything is live.
  // (The forward's target logits and losses, 2·BS, are freed before backward starts.)
  const int64_t head_transient = BS * Vp + 2 * BS * C;
  const int64_t forward_transient = 2 * BS;
  m.activations = 4 * (saved + std::max(head_transient, forward_transient));
  m.buffers = 4 * static_cast<int64_t>(threads) * S * S;  // attention backward scratch
  return m;
}

}  // namespace strata
