#include "models/transformer/lm_head.h"

#include <algorithm>

#include "models/transformer/transformer.h"

namespace strata {
namespace {

class LmHead final : public ModelHead {
 public:
  struct Acts final : HeadActs {
    Norm::Saved norm;  // (B, Sl, C)
    Tensor logits;     // (B·S, Vp/t)
    VocabParallelCrossEntropy::Saved ce;
  };

  std::unique_ptr<HeadActs> forward(const LayerEnv& env, const Tensor& y, const ModelBatch& batch,
                                    LossSum* loss) const override {
    const int64_t B = batch.tokens.size(0), S = batch.tokens.size(1);
    auto a = std::make_unique<Acts>();
    norm.forward(env, a->norm, y);
    a->logits = lm_head.forward(env, a->norm.out).reshape({B * S, lm_head.out_local});
    *loss = ce.forward(env, a->logits, batch.targets, batch.loss_mask, a->ce);
    return a;
  }

  Tensor backward(const LayerEnv& env, BackwardPass& pass, HeadActs& acts, const Tensor& y,
                  const ModelBatch& batch, float grad_scale) const override {
    Acts& a = static_cast<Acts&>(acts);
    Tensor dy = env.act_zeros(y.shape());  // the residual stream's gradient
    Tensor dlogits = env.act(a.logits.shape());
    ce.backward(env, dlogits, a.logits, a.ce, batch.targets, batch.loss_mask, grad_scale);
    a.logits = Tensor();  // the largest activation: release it as soon as it is consumed
    const Tensor dnorm = lm_head.backward(env, pass, std::move(dlogits), a.norm.out);
    norm.backward(env, pass, dy, dnorm, y, a.norm);
    return dy;
  }

  void report_ready(ParamStore& store) const override {
    if (own_weight) store.report_ready(lm_head.weight, lm_head.weight);
    store.report_ready(norm.first(), norm.last());
  }

  // The head on every position (the last ones are kept), gathered over the vocabulary shards.
  void decode_logits(const LayerEnv& env, const Tensor& x,
                     std::vector<float>* logits_out) const override {
    const int64_t B = x.size(0), T = x.size(1);
    Norm::Saved n;
    norm.forward(env, n, x);
    const int64_t local = lm_head.out_local;
    const Tensor logits = lm_head.forward(env, n.out).reshape({B * T, local});
    Tensor f32 = env.be.empty({B * T, local}, MemCategory::kActivations);
    env.be.cast(f32, logits);
    std::vector<float> rows(static_cast<size_t>(B * T * local));
    env.be.download(rows.data(), f32);
    std::vector<float> full(static_cast<size_t>(B) * vocab.Vp, 0.0f);
    for (int64_t b = 0; b < B; ++b)
      std::copy_n(rows.data() + ((b + 1) * T - 1) * local, local,
                  full.data() + b * vocab.Vp + vocab.start);
    if (env.tp.size() > 1) {  // each rank holds its shard's columns, zeros elsewhere: a sum
      Tensor gathered =
          env.be.empty({B, static_cast<int64_t>(vocab.Vp)}, MemCategory::kActivations);
      env.be.upload(gathered, full.data());
      env.tp.sum(gathered);
      env.be.download(full.data(), gathered);
    }
    logits_out->resize(static_cast<size_t>(B) * vocab.V);
    for (int64_t b = 0; b < B; ++b)
      std::copy_n(full.data() + b * vocab.Vp, vocab.V, logits_out->data() + b * vocab.V);
  }

  Norm norm;
  ColumnParallelLinear lm_head;  // weight: its own, or the token table (tied)
  VocabParallelCrossEntropy ce;
  VocabShard vocab;
  bool own_weight = false;  // an untied lm_head.weight
};

class LmHeadSpec final : public HeadSpec {
 public:
  LmHeadSpec(NormSpec norm, std::string norm_name, bool tie, std::string lm_head_name)
      : norm_(norm),
        norm_name_(std::move(norm_name)),
        tie_(tie),
        lm_head_name_(std::move(lm_head_name)) {}

  bool ties_embedding() const override { return tie_; }
  bool generates() const override { return true; }

  std::unique_ptr<ModelHead> declare(ParamLayout& layout, const HeadContext& ctx) const override {
    auto h = std::make_unique<LmHead>();
    h->vocab = ctx.vocab;
    h->norm = Norm(layout, norm_, norm_name_, ctx.C);
    if (!tie_) {
      h->lm_head = ColumnParallelLinear(layout, lm_head_name_, ctx.C, ctx.vocab.Vp,
                                        LinearInit{ctx.init_std}, /*bias=*/false);
      // Padded vocabulary rows stay zero, as in the embedding.
      layout.infos()[static_cast<size_t>(h->lm_head.weight.index)].rows_initialised = ctx.vocab.V;
      h->own_weight = true;
    } else {
      h->lm_head = ColumnParallelLinear::tied_to(declare_tied_table(layout, ctx), ctx.vocab.local);
    }
    h->ce = VocabParallelCrossEntropy(ctx.vocab);
    return h;
  }

  PartWork work(int64_t C, int64_t Vp, const WorkShape& s) const override {
    PartWork w = Norm::work(C, s);
    w += ColumnParallelLinear::work(C, Vp, s);
    w += VocabParallelCrossEntropy::work(s.tokens(), static_cast<double>(Vp) / s.t, s);
    return w;
  }

  ActivationElems activations(int64_t C, int64_t Vp, const WorkShape& s) const override {
    const double logits = s.tokens() * static_cast<double>(Vp) / s.t;
    const double c = static_cast<double>(C);
    ActivationElems e;
    e.saved = Norm::activations(norm_.kind, C, s).saved + logits +
              VocabParallelCrossEntropy::saved(s.tokens());
    // A layer's backward comes after the logits are freed.
    e.transient = logits + s.tokens() * c + s.tokens_local() * c;
    e.freed_before_layers = logits;
    return e;
  }

  double flops_per_token(int64_t C, int V) const override {
    return 2.0 * static_cast<double>(C) * V;
  }

 private:
  NormSpec norm_;
  std::string norm_name_;
  bool tie_;
  std::string lm_head_name_;
};

}  // namespace

std::shared_ptr<const HeadSpec> lm_head_spec(NormSpec norm, std::string norm_name, bool tie,
                                             std::string lm_head_name) {
  return std::make_shared<LmHeadSpec>(norm, std::move(norm_name), tie, std::move(lm_head_name));
}

const Tensor& lm_logits(const PieceActs& acts) {
  return static_cast<const LmHead::Acts&>(TransformerModel::head_acts(acts)).logits;
}

}  // namespace strata
