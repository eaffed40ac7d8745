#include "models/gpt.h"

#include <algorithm>
#include <cmath>

#include "runtime/check.h"
#include "runtime/rng.h"

namespace strata {

int pad_vocab(int vocab, int multiple) { return (vocab + multiple - 1) / multiple * multiple; }

GptDims gpt_dims(const ModelConfig& m, int tp, int tp_rank, bool sp) {
  GptDims d;
  d.tp = tp;
  d.tp_rank = tp_rank;
  d.sp = sp && tp > 1;
  d.L = m.num_layers;
  d.C = m.hidden_size;
  d.NH = m.num_heads;
  d.F = m.ffn_hidden_size;
  d.S = m.seq_len;
  d.V = m.vocab_size;
  d.Vp = pad_vocab(m.vocab_size, 128 * tp);  // Megatron's make-vocab-size-divisible-by × t
  d.tie = m.tie_embeddings;
  d.init_std = m.init_std;
  return d;
}

int GptDims::vocab_valid() const {
  return std::clamp(V - vocab_start(), 0, V_local());
}

int64_t global_index(const ParamInfo& p, int64_t local, int tp_rank, int tp) {
  switch (p.split) {
    case ParamSplit::kReplicated: return local;
    case ParamSplit::kRows: return local + tp_rank * p.numel;  // row-major: shard is contiguous
    case ParamSplit::kCols: {
      const int64_t cols = p.shape[1], full_cols = p.full_shape[1];
      return (local / cols) * full_cols + tp_rank * cols + local % cols;
    }
    case ParamSplit::kQkvRows: {
      // Local rows: [q_r; k_r; v_r], each block a third of the shard.
      const int64_t block = p.numel / 3;  // elements of one of q_r, k_r, v_r
      const int64_t which = local / block;
      return which * block * tp + tp_rank * block + local % block;
    }
  }
  return local;
}

std::vector<ModelPiece> whole_model(const GptDims& d) {
  return {ModelPiece{0, d.L, true, true}};
}

Recompute parse_recompute(const std::string& s) {
  if (s == "selective") return Recompute::kSelective;
  if (s == "full") return Recompute::kFull;
  return Recompute::kNone;
}

std::vector<ParamInfo> GptModel::layout(const GptDims& d, const std::vector<ModelPiece>& in) {
  const std::vector<ModelPiece> pieces = in.empty() ? whole_model(d) : in;
  std::vector<ParamInfo> v;
  int64_t offset = 0;
  const int t = d.tp;
  auto add = [&](std::string name, Shape full, ParamSplit split, ParamInit init, double std,
                 bool decay, int64_t rows = -1) {
    ParamInfo p;
    p.name = std::move(name);
    p.full_shape = full;
    p.split = split;
    p.shape = full;
    if (split == ParamSplit::kRows || split == ParamSplit::kQkvRows) p.shape[0] /= t;
    if (split == ParamSplit::kCols) p.shape[1] /= t;
    p.numel = shape_numel(p.shape);
    p.offset = offset;
    p.init = init;
    p.std = std;
    p.decay = decay;
    p.rows_initialised = rows;
    p.sequence_partial_grad = d.sp && p.name.find("ln_") != std::string::npos;
    offset += p.numel;
    v.push_back(std::move(p));
  };
  using S = ParamSplit;
  using I = ParamInit;
  const double std = d.init_std;
  const double proj_std = d.init_std / std::sqrt(2.0 * d.L);  // GPT-2's residual scaling
  bool has_wte = false;
  for (const ModelPiece& piece : pieces) {
    if (piece.embedding) {
      add("wte", {d.Vp, d.C}, S::kRows, I::kNormal, std, true, d.V);
      add("wpe", {d.S, d.C}, S::kReplicated, I::kNormal, std, true);
      has_wte = true;
    }
    for (int l = piece.first_layer; l < piece.first_layer + piece.num_layers; ++l) {
      const std::string h = "h." + std::to_string(l) + ".";
      add(h + "ln_1.weight", {d.C}, S::kReplicated, I::kOnes, 0, false);
      add(h + "ln_1.bias", {d.C}, S::kReplicated, I::kZeros, 0, false);
      add(h + "attn.c_attn.weight", {3 * d.C, d.C}, S::kQkvRows, I::kNormal, std, true);
      add(h + "attn.c_attn.bias", {3 * d.C}, S::kQkvRows, I::kZeros, 0, false);
      add(h + "attn.c_proj.weight", {d.C, d.C}, S::kCols, I::kNormal, proj_std, true);
      add(h + "attn.c_proj.bias", {d.C}, S::kReplicated, I::kZeros, 0, false);
      add(h + "ln_2.weight", {d.C}, S::kReplicated, I::kOnes, 0, false);
      add(h + "ln_2.bias", {d.C}, S::kReplicated, I::kZeros, 0, false);
      add(h + "mlp.c_fc.weight", {d.F, d.C}, S::kRows, I::kNormal, std, true);
      add(h + "mlp.c_fc.bias", {d.F}, S::kRows, I::kZeros, 0, false);
      add(h + "mlp.c_proj.weight", {d.C, d.F}, S::kCols, I::kNormal, proj_std, true);
      add(h + "mlp.c_proj.bias", {d.C}, S::kReplicated, I::kZeros, 0, false);
    }
    if (piece.head) {
      add("ln_f.weight", {d.C}, S::kReplicated, I::kOnes, 0, false);
      add("ln_f.bias", {d.C}, S::kReplicated, I::kZeros, 0, false);
      if (!d.tie) {
        add("lm_head.weight", {d.Vp, d.C}, S::kRows, I::kNormal, std, true, d.V);
      } else if (!has_wte) {
        // The last stage's own copy of the tied embedding: same name, so the same initial
        // values; its gradient is summed with the first stage's every step, so it stays equal.
        add("wte", {d.Vp, d.C}, S::kRows, I::kNormal, std, true, d.V);
        v.back().tied_copy = true;
        has_wte = true;
      }
    }
  }
  return v;
}

GptModel::GptModel(const GptDims& dims, Backend& backend, uint64_t seed, Communicator* tp,
                   std::vector<ModelPiece> pieces, Recompute recompute)
    : dims_(dims),
      be_(backend),
      tp_(tp),
      pieces_(pieces.empty() ? whole_model(dims) : std::move(pieces)),
      recompute_(recompute),
      infos_(layout(dims, pieces_)) {
  for (int k = 0; k < static_cast<int>(infos_.size()); ++k)
    index_.emplace(infos_[static_cast<size_t>(k)].name, k);
  const GptDims& d = dims_;
  STRATA_CHECK(d.C % d.NH == 0, "hidden " << d.C << " % heads " << d.NH);
  STRATA_CHECK(d.NH % d.tp == 0 && d.C % d.tp == 0 && d.F % d.tp == 0,
               "heads, hidden and ffn must divide by tensor " << d.tp);
  STRATA_CHECK(d.tp == 1 || (tp_ && tp_->size() == d.tp && tp_->rank() == d.tp_rank),
               "tensor-parallel group does not match dims (size " << d.tp << ", rank "
                                                                  << d.tp_rank << ")");
  const int64_t n = infos_.back().offset + infos_.back().numel;
  // Mixed precision keeps the fp32 parameters as the optimizer's master copy and computes with
  // a bf16 copy (Megatron's accounting: 2 bytes of parameters, 4 of gradients, 12 of optimizer).
  params_ = be_.empty({n}, d.bf16 ? MemCategory::kOptimizer : MemCategory::kParameters);
  if (d.bf16) params_lp_ = be_.empty({n}, MemCategory::kParameters, DType::kBF16);
  grads_ = be_.zeros({n}, MemCategory::kGradients);
  init_parameters(seed);
}

GptModel::~GptModel() = default;

int64_t GptModel::real_parameters(const GptDims& d) {
  GptDims whole = d;
  whole.tp = 1;
  whole.tp_rank = 0;
  whole.Vp = pad_vocab(d.V, 128);
  int64_t n = 0;
  for (const ParamInfo& p : layout(whole))
    n += p.rows_initialised >= 0 ? p.rows_initialised * p.full_shape[1] : p.numel;
  return n;
}

int GptModel::param_index(const std::string& name) const {
  auto it = index_.find(name);
  STRATA_CHECK(it != index_.end(), "no parameter named " << name << " on this stage");
  return it->second;
}

const ParamInfo& GptModel::info(const std::string& name) const {
  return infos_[static_cast<size_t>(param_index(name))];
}

Tensor GptModel::param(const std::string& name) const {
  const ParamInfo& p = info(name);
  return params_.view(p.offset, p.shape);
}

Tensor GptModel::cparam(const std::string& name) const {
  const ParamInfo& p = info(name);
  return (dims_.bf16 ? params_lp_ : params_).view(p.offset, p.shape);
}

void GptModel::params_changed() {
  if (dims_.bf16) be_.cast(params_lp_, params_);
}

Tensor GptModel::act(const Shape& s) {
  return be_.empty(s, MemCategory::kActivations, activation_dtype());
}
Tensor GptModel::act_zeros(const Shape& s) {
  return be_.zeros(s, MemCategory::kActivations, activation_dtype());
}
Tensor GptModel::stat(const Shape& s) { return be_.empty(s, MemCategory::kActivations); }

Tensor GptModel::grad(const std::string& name) const {
  const ParamInfo& p = info(name);
  return grads_.view(p.offset, p.shape);
}

void GptModel::init_parameters(uint64_t seed) {
  // Values are produced on the host from global indices and uploaded, so every backend and every
  // tensor-parallel layout starts from the same model.
  std::vector<float> host(static_cast<size_t>(params_.numel()), 0.0f);
  for (const ParamInfo& p : infos_) {
    float* dst = host.data() + p.offset;
    switch (p.init) {
      case ParamInit::kZeros: break;
      case ParamInit::kOnes: std::fill(dst, dst + p.numel, 1.0f); break;
      case ParamInit::kNormal: {
        const uint64_t key = mix64(seed ^ hash_name(p.name));
        const int64_t row_len = p.full_shape.size() > 1 ? p.full_shape[1] : 1;
        for (int64_t i = 0; i < p.numel; ++i) {
          const int64_t g = global_index(p, i, dims_.tp_rank, dims_.tp);
          if (p.rows_initialised >= 0 && g / row_len >= p.rows_initialised) continue;  // padding
          dst[i] = static_cast<float>(p.std * normal01(key, static_cast<uint64_t>(g)));
        }
        break;
      }
    }
  }
  be_.upload(params_, host.data());
  params_changed();
}

void GptModel::zero_grads() { be_.zero(grads_); }

void GptModel::use_params(const Tensor& p) {
  STRATA_CHECK(p.numel() == params_.numel(), "parameter buffer of " << p.numel()
                                                 << " elements for a model of "
                                                 << params_.numel());
  // 2bw switches versions per micro-batch: re-round the bf16 copy only on a real switch (a
  // version is written only while no micro-batch computes with it).
  if (p.data() == params_.data()) return;
  params_ = p;
  params_changed();
}

// ---------------------------------------------------------------------------------------------
// Activations. B = micro-batch, S = sequence, Sl = S/t with sequence parallelism (else S),
// C = hidden, Cl = C/t, Fl = F/t, NHl = NH/t heads of this rank, Vl = Vp/t vocabulary shard.
// Everything is accounted as activations.

struct BlockActs {
  Tensor ln1;       // (B, Sl, C)  ln_1(x) (re-gathered in backward with sp)
  Tensor ln1_mean;  // (B, Sl)
  Tensor ln1_rstd;  // (B, Sl)
  Tensor qkv;       // (B, S, 3Cl)  [q | k | v] of this rank's heads
  Tensor att;       // (B, NHl, S, S) softmax probabilities
  Tensor atty;      // (B, S, Cl)  attention output before c_proj
  Tensor res1;      // (B, Sl, C)  x + attn(x)
  Tensor ln2;       // (B, Sl, C)
  Tensor ln2_mean;  // (B, Sl)
  Tensor ln2_rstd;  // (B, Sl)
  Tensor fch;       // (B, S, Fl)  c_fc output, before GELU
  Tensor fch_gelu;  // (B, S, Fl)
  Tensor out;       // (B, Sl, C)  block output = next block's input
};

// A weight gradient deferred to the zero-bubble W pass: dW += doutᵀ·inp (and db += Σ dout).
struct DeferredWeightGrad {
  std::string weight, bias;  // parameter names; bias "" for none
  Tensor dout;               // (N, OC)
  Tensor inp;                // (N, C)
};

struct GptModel::Acts {
  int piece = 0;
  bool defer_weight_grads = false;           // backward_input: W pass comes later
  std::vector<DeferredWeightGrad> deferred;  // in backward order
  Tensor tokens;             // (B, S) i32
  Tensor targets;            // (B, S) i32
  Tensor input;              // (B, Sl, C) the piece's input: embedding output or received
  std::vector<BlockActs> h;  // [layer - first layer of the piece]
  Tensor lnf;                // (B, Sl, C)
  Tensor lnf_mean;           // (B, Sl)
  Tensor lnf_rstd;           // (B, Sl)
  Tensor logits;             // (B·S, Vl)
  Tensor row_max;            // (B·S) over the whole vocabulary
  Tensor row_sumexp;         // (B·S)
};

void GptModel::ActsDeleter::operator()(Acts* a) const { delete a; }

void GptModel::tp_sum(Tensor& t) {
  if (dims_.tp > 1) tp_->all_reduce(t, ReduceOp::kSum);
}

Tensor GptModel::sp_gather(const Tensor& shard) {
  const int t = dims_.tp;
  const int64_t B = shard.size(0), Sl = shard.size(1), C = shard.size(2);
  Tensor chunks = act({t, B, Sl, C});
  tp_->all_gather(shard.data(), chunks.data(), static_cast<size_t>(shard.numel()), shard.dtype());
  Tensor full = act({B, Sl * t, C});
  be_.seq_interleave(full, chunks, t);
  return full;
}

Tensor GptModel::sp_reduce_scatter(const Tensor& full) {
  const int t = dims_.tp;
  const int64_t B = full.size(0), S = full.size(1), C = full.size(2);
  Tensor chunks = act({t, B, S / t, C});
  be_.seq_deinterleave(chunks, full, t);
  Tensor shard = act({B, S / t, C});
  tp_->reduce_scatter(chunks.data(), shard.data(), static_cast<size_t>(shard.numel()),
                      shard.dtype(), ReduceOp::kSum);
  return shard;
}

Tensor GptModel::reduce_input_grad(Tensor& partial) {
  if (dims_.sp) return sp_reduce_scatter(partial);
  tp_sum(partial);
  return partial;
}

Tensor GptModel::full_sequence(const Tensor& x) { return dims_.sp ? sp_gather(x) : x; }

void GptModel::param_ready(const std::string& first, const std::string& last) {
  if (!hook_active_ || !ready_hook_) return;
  // A tied embedding split over two stages is final only after the two copies' gradients are
  // summed, which the trainer does once the whole pipeline has drained.
  if (first == "wte" && dims_.tie && !(pieces_.front().embedding && pieces_.back().head)) {
    if (last == "wte") return;
    param_ready("wpe", last);
    return;
  }
  const int a = param_index(first), b = param_index(last);
  STRATA_CHECK(b >= a, "parameter range " << first << " .. " << last);
  ready_hook_(a, b + 1);
}

GptModel::ActsPtr GptModel::forward(const Tensor& tokens, const Tensor& targets,
                                    double* loss_sum) {
  STRATA_CHECK(pieces_.size() == 1 && pieces_[0].embedding && pieces_[0].head,
               "forward() needs the whole model; use forward_piece on pipeline stages");
  return forward_piece(0, Tensor(), tokens, targets, loss_sum);
}

void GptModel::backward(Acts& acts, float grad_scale, bool last_microbatch) {
  backward_piece(acts, Tensor(), grad_scale, last_microbatch);
}

const Tensor& GptModel::output(const Acts& acts) {
  return acts.h.empty() ? acts.input : acts.h.back().out;
}

GptModel::ActsPtr GptModel::forward_piece(int piece, const Tensor& input, const Tensor& tokens,
                                          const Tensor& targets, double* loss_sum) {
  const GptDims& d = dims_;
  const ModelPiece& pc = pieces_.at(static_cast<size_t>(piece));
  const int64_t B = tokens.size(0), S = tokens.size(1);
  STRATA_CHECK(S <= d.S, "sequence " << S << " > model.seq_len " << d.S);
  ActsPtr a(new Acts());
  a->piece = piece;
  a->tokens = tokens;
  a->targets = targets;
  *loss_sum = 0;

  if (pc.embedding) {
    // Vocab-parallel embedding: each rank adds its vocabulary rows (and rank 0 the positions),
    // the sum over the group is the embedding.
    Tensor x0 = act({B, S, d.C});
    const Tensor wpe = cparam("wpe");
    be_.embedding_forward(x0, tokens, cparam("wte"), d.tp_rank == 0 ? &wpe : nullptr,
                          d.vocab_start());
    a->input = d.sp ? sp_reduce_scatter(x0) : (tp_sum(x0), x0);
  } else {
    a->input = input;
  }

  a->h.resize(static_cast<size_t>(pc.num_layers));
  for (int i = 0; i < pc.num_layers; ++i)
    block_forward(pc.first_layer + i, i > 0 ? a->h[static_cast<size_t>(i - 1)].out : a->input,
                  *a);
  if (!pc.head) return a;

  const Tensor& x = output(*a);
  const int64_t Sl = x.size(1), N = B * S;
  a->lnf = act({B, Sl, d.C});
  a->lnf_mean = stat({B, Sl});
  a->lnf_rstd = stat({B, Sl});
  be_.layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, x, cparam("ln_f.weight"),
                        cparam("ln_f.bias"));
  const Tensor lnf_full = full_sequence(a->lnf);
  a->logits = act({N, d.V_local()});
  be_.matmul_forward(a->logits, lnf_full, cparam(d.tie ? "wte" : "lm_head.weight"), nullptr);
  // Vocab-parallel cross-entropy: each shard's max and Σexp (one read of its logits) are brought
  // to the group's max and summed; the target logit is summed over the group too.
  a->row_max = stat({N});
  a->row_sumexp = stat({N});
  be_.ce_row_stats(a->row_max, a->row_sumexp, a->logits, d.vocab_valid());
  if (d.tp > 1) {
    Tensor local_max = stat({N});
    be_.copy(local_max, a->row_max);
    tp_->all_reduce(a->row_max, ReduceOp::kMax);
    be_.ce_rescale_sumexp(a->row_sumexp, local_max, a->row_max);
    tp_sum(a->row_sumexp);
  }
  Tensor target_logit = stat({N});
  be_.ce_target_logit(target_logit, a->logits, targets, d.vocab_start(), d.vocab_valid());
  tp_sum(target_logit);
  Tensor losses = stat({N});
  be_.ce_losses(losses, a->row_max, a->row_sumexp, target_logit);
  *loss_sum = be_.sum(losses);
  return a;
}

// A row-parallel projection joining the residual stream: residual + inp · wᵀ + bias, summed over
// the tensor group. With t = 1 the residual rides in the GEMM (matmul_residual_forward). With
// t > 1 it joins after the all-reduce (or reduce-scatter, with sp): added to rank 0's partial
// instead, a bf16 all-reduce would round a residual-sized sum at each of its t − 1 steps.
Tensor GptModel::projection(const Tensor& inp, const std::string& name, const Tensor& residual) {
  const GptDims& d = dims_;
  const int64_t B = inp.size(0), S = inp.size(1);
  Tensor out = act({B, S, d.C});  // partial sum over the group
  const Tensor w = cparam(name + ".weight"), b = cparam(name + ".bias");
  if (d.tp == 1) {
    be_.matmul_residual_forward(out, inp, w, &b, residual);
    return out;
  }
  be_.matmul_forward(out, inp, w, d.tp_rank == 0 ? &b : nullptr);  // the bias added once
  Tensor sum = d.sp ? sp_reduce_scatter(out) : (tp_sum(out), out);
  be_.add_inplace(sum, residual);
  return sum;
}

void GptModel::block_forward(int l, const Tensor& x, Acts& a, bool recomputing) {
  const GptDims& d = dims_;
  const std::string p = "h." + std::to_string(l) + ".";
  BlockActs& h = a.h[static_cast<size_t>(l - pieces_[static_cast<size_t>(a.piece)].first_layer)];
  const int64_t B = x.size(0), Sl = x.size(1), S = d.sp ? Sl * d.tp : Sl;

  h.ln1 = act({B, Sl, d.C});
  h.ln1_mean = stat({B, Sl});
  h.ln1_rstd = stat({B, Sl});
  be_.layernorm_forward(h.ln1, h.ln1_mean, h.ln1_rstd, x, cparam(p + "ln_1.weight"),
                        cparam(p + "ln_1.bias"));
  {
    const Tensor ln1_full = full_sequence(h.ln1);
    h.qkv = act({B, S, 3 * d.C_local()});
    const Tensor qkv_b = cparam(p + "attn.c_attn.bias");
    be_.matmul_forward(h.qkv, ln1_full, cparam(p + "attn.c_attn.weight"), &qkv_b);
  }
  h.att = stat(be_.attention_saved_shape(B, d.heads_local(), S));
  h.atty = act({B, S, d.C_local()});
  be_.attention_forward(h.atty, h.att, h.qkv, d.heads_local());
  h.res1 = projection(h.atty, p + "attn.c_proj", x);
  if (recompute_ == Recompute::kSelective && !recomputing) {
    // The attention core is recomputed from qkv in the backward pass: drop the S×S
    // probabilities (the largest activation at long sequences) and its output.
    h.att = Tensor();
    h.atty = Tensor();
  }

  h.ln2 = act({B, Sl, d.C});
  h.ln2_mean = stat({B, Sl});
  h.ln2_rstd = stat({B, Sl});
  be_.layernorm_forward(h.ln2, h.ln2_mean, h.ln2_rstd, h.res1, cparam(p + "ln_2.weight"),
                        cparam(p + "ln_2.bias"));
  {
    const Tensor ln2_full = full_sequence(h.ln2);
    h.fch = act({B, S, d.F_local()});
    h.fch_gelu = act({B, S, d.F_local()});
    be_.matmul_gelu_forward(h.fch, h.fch_gelu, ln2_full, cparam(p + "mlp.c_fc.weight"),
                            cparam(p + "mlp.c_fc.bias"));
  }
  h.out = projection(h.fch_gelu, p + "mlp.c_proj", h.res1);
  if (recompute_ == Recompute::kFull && !recomputing) {
    // Keep only the block's output (the next block's input); the backward pass re-runs this
    // forward from the input to get the rest back.
    Tensor out = h.out;
    h = BlockActs();
    h.out = out;
  }
}

Tensor GptModel::backward_piece(Acts& a, const Tensor& dout, float grad_scale,
                                bool last_microbatch, bool defer_weight_grads) {
  const GptDims& d = dims_;
  const ModelPiece& pc = pieces_[static_cast<size_t>(a.piece)];
  a.defer_weight_grads = defer_weight_grads;
  // With deferred weight gradients nothing is final before the W pass reports it.
  hook_active_ = last_microbatch && !defer_weight_grads;
  const int64_t B = a.tokens.size(0), S = a.tokens.size(1), N = B * S;
  const int64_t Sl = d.seq_local(static_cast<int>(S));

  Tensor dresid;  // gradient of the residual stream, (B, Sl, C)
  if (pc.head) {
    // dlogits = grad_scale · (softmax − onehot) on this rank's vocabulary shard.
    dresid = act_zeros({B, Sl, d.C});
    Tensor dlogits = act({N, d.V_local()});
    be_.ce_backward(dlogits, a.logits, a.row_max, a.row_sumexp, a.targets, grad_scale,
                    d.vocab_start(), d.vocab_valid());
    a.logits = Tensor();  // the largest activation: release it as soon as it is consumed
    Tensor dlnf_full = act({B, S, d.C});  // partial over the vocabulary shards
    linear_backward(a, &dlnf_full, d.tie ? "wte" : "lm_head.weight", "", dlogits,
                    full_sequence(a.lnf));
    dlogits = Tensor();
    const Tensor dlnf = reduce_input_grad(dlnf_full);
    Tensor dw = grad("ln_f.weight"), db = grad("ln_f.bias");
    be_.layernorm_backward(dresid, dw, db, dlnf, output(a), cparam("ln_f.weight"), a.lnf_mean,
                           a.lnf_rstd);
    if (d.sp && last_microbatch) {  // LayerNorm gradients are never deferred
      tp_sum(dw);
      tp_sum(db);
    }
    if (!d.tie) param_ready("lm_head.weight", "lm_head.weight");
    param_ready("ln_f.weight", "ln_f.bias");
    if (d.tie && !pc.embedding) param_ready("wte", "wte");
  } else {
    // The gradient arrives from the next stage; it is accumulated in place below.
    dresid = act({B, Sl, d.C});
    be_.copy(dresid, dout);
  }

  for (int i = pc.num_layers - 1; i >= 0; --i) {
    const Tensor& x = i > 0 ? a.h[static_cast<size_t>(i - 1)].out : a.input;
    block_backward(pc.first_layer + i, x, a, dresid);
  }

  Tensor dinput;
  if (pc.embedding) {
    // Every rank needs the full-sequence gradient for its vocabulary rows and wpe.
    const Tensor dx0 = full_sequence(dresid);
    Tensor dwte = grad("wte"), dwpe = grad("wpe");
    be_.embedding_backward(dwte, &dwpe, dx0, a.tokens, d.vocab_start());
    param_ready("wte", "wpe");
  } else {
    dinput = dresid;
  }
  hook_active_ = false;
  return dinput;
}

void GptModel::block_backward(int l, const Tensor& x, Acts& a, Tensor& dresid) {
  const GptDims& d = dims_;
  const std::string p = "h." + std::to_string(l) + ".";
  BlockActs& h = a.h[static_cast<size_t>(l - pieces_[static_cast<size_t>(a.piece)].first_layer)];
  const int64_t B = x.size(0), Sl = x.size(1), S = d.sp ? Sl * d.tp : Sl;
  const bool reduce_ln = d.sp && hook_active_;
  if (recompute_ == Recompute::kFull) block_forward(l, x, a, true);  // the dropped activations
  if (recompute_ == Recompute::kSelective) {
    h.att = stat(be_.attention_saved_shape(B, d.heads_local(), S));
    h.atty = act({B, S, d.C_local()});
    be_.attention_forward(h.atty, h.att, h.qkv, d.heads_local());
  }
  // MLP branch: dresid holds d(out); it is also d(res1) through the residual.
  {
    // d(fch) straight from d(out) through c_proj and the GELU (one op: fused on a GPU), then
    // c_proj's weight gradients.
    const Tensor dout_full = full_sequence(dresid);
    Tensor dfch = act({B, S, d.F_local()});
    be_.matmul_backward_input_gelu(dfch, dout_full, cparam(p + "mlp.c_proj.weight"), h.fch);
    linear_backward(a, nullptr, p + "mlp.c_proj.weight", p + "mlp.c_proj.bias", dout_full,
                    h.fch_gelu, /*dout_changes_later=*/!d.sp);
    Tensor dln2_full = act({B, S, d.C});
    linear_backward(a, &dln2_full, p + "mlp.c_fc.weight", p + "mlp.c_fc.bias", dfch,
                    full_sequence(h.ln2));
    const Tensor dln2 = reduce_input_grad(dln2_full);
    Tensor dlw = grad(p + "ln_2.weight"), dlb = grad(p + "ln_2.bias");
    be_.layernorm_backward(dresid, dlw, dlb, dln2, h.res1, cparam(p + "ln_2.weight"), h.ln2_mean,
                           h.ln2_rstd);
    if (reduce_ln) {
      tp_sum(dlw);
      tp_sum(dlb);
    }
  }
  // Attention branch: dresid now holds d(res1), also d(x) through the residual.
  {
    Tensor datty = act({B, S, d.C_local()});
    linear_backward(a, &datty, p + "attn.c_proj.weight", p + "attn.c_proj.bias",
                    full_sequence(dresid), h.atty, /*dout_changes_later=*/!d.sp);
    Tensor dqkv = act({B, S, 3 * d.C_local()});
    be_.attention_backward(dqkv, datty, h.qkv, h.atty, h.att, d.heads_local());
    datty = Tensor();
    Tensor dln1_full = act({B, S, d.C});
    linear_backward(a, &dln1_full, p + "attn.c_attn.weight", p + "attn.c_attn.bias", dqkv,
                    full_sequence(h.ln1));
    const Tensor dln1 = reduce_input_grad(dln1_full);
    Tensor dlw = grad(p + "ln_1.weight"), dlb = grad(p + "ln_1.bias");
    be_.layernorm_backward(dresid, dlw, dlb, dln1, x, cparam(p + "ln_1.weight"), h.ln1_mean,
                           h.ln1_rstd);
    if (reduce_ln) {
      tp_sum(dlw);
      tp_sum(dlb);
    }
  }
  h = BlockActs();  // this block's activations are consumed
  param_ready(p + "ln_1.weight", p + "mlp.c_proj.bias");
}

void GptModel::linear_backward(Acts& a, Tensor* dinp, const std::string& weight,
                               const std::string& bias, const Tensor& dout, const Tensor& inp,
                               bool dout_changes_later) {
  if (a.defer_weight_grads) {
    if (dinp) be_.matmul_backward_input(*dinp, dout, cparam(weight));
    // The residual-stream gradient keeps accumulating after this layer: the W pass needs its
    // value now.
    Tensor kept = dout;
    if (dout_changes_later) {
      kept = act(dout.shape());
      be_.copy(kept, dout);
    }
    a.deferred.push_back({weight, bias, kept, inp});
    return;
  }
  Tensor dw = grad(weight);
  Tensor db = bias.empty() ? Tensor() : grad(bias);
  be_.matmul_backward(dinp, dw, bias.empty() ? nullptr : &db, dout, inp, cparam(weight));
}

void GptModel::backward_weight_piece(Acts& a, bool last_microbatch) {
  for (const DeferredWeightGrad& w : a.deferred) {
    Tensor dw = grad(w.weight);
    Tensor db = w.bias.empty() ? Tensor() : grad(w.bias);
    be_.matmul_backward_weight(dw, w.bias.empty() ? nullptr : &db, w.dout, w.inp);
  }
  a.deferred.clear();
  // Every gradient of the piece is final now: report them all at once.
  if (last_microbatch && ready_hook_) {
    hook_active_ = true;
    const ModelPiece& pc = pieces_[static_cast<size_t>(a.piece)];
    if (pc.head) {
      if (!dims_.tie) param_ready("lm_head.weight", "lm_head.weight");
      param_ready("ln_f.weight", "ln_f.bias");
      if (dims_.tie && !pc.embedding) param_ready("wte", "wte");
    }
    for (int l = pc.first_layer + pc.num_layers - 1; l >= pc.first_layer; --l) {
      const std::string p = "h." + std::to_string(l) + ".";
      param_ready(p + "ln_1.weight", p + "mlp.c_proj.bias");
    }
    if (pc.embedding) param_ready("wte", "wpe");
    hook_active_ = false;
  }
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

}  // namespace strata
