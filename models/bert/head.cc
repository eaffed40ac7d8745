// BERT's pre-training heads (models/bert/bert.h): the masked-LM transform and the decoder tied to
// the word embeddings with its own bias, and the pooler with the 2-way sentence classifier on
// [CLS]; their two losses weighted so that the iteration's loss is Hugging Face's.
#include <algorithm>

#include "models/bert/bert.h"
#include "models/layers/cross_entropy.h"
#include "models/layers/linear.h"
#include "models/layers/norm.h"

namespace strata {
namespace {

class BertHead final : public ModelHead {
 public:
  struct Acts final : HeadActs {
    // Masked LM.
    Tensor mlm_pre, mlm_act;  // (B, Sl, C) transform.dense output before and after the GELU
    Norm::Saved mlm_ln;       // (B, Sl, C)
    Tensor mlm_logits;        // (B·S, Vp/t)
    VocabParallelCrossEntropy::Saved mlm_ce;
    LossSum mlm;
    // Sentence.
    Tensor cls;              // (B, C) the [CLS] rows
    Tensor pooled;           // (B, C) tanh(pooler.dense(cls))
    Tensor sentence_logits;  // (B, 2)
    Tensor sentence_labels;  // (B) i32
    VocabParallelCrossEntropy::Saved sentence_ce;
    LossSum sentence;
  };

  std::unique_ptr<HeadActs> forward(const LayerEnv& env, const Tensor& y, const ModelBatch& batch,
                                    LossSum* loss) const override {
    const int64_t B = batch.tokens.size(0), S = batch.tokens.size(1);
    auto a = std::make_unique<Acts>();
    // Masked LM: every position's logits, the loss over the masked ones.
    transform.forward_gelu(env, y, &a->mlm_pre, &a->mlm_act, GeluKind::kErf);
    transform_ln.forward(env, a->mlm_ln, a->mlm_act);
    a->mlm_logits = decoder.forward(env, a->mlm_ln.out).reshape({B * S, decoder.out_local});
    a->mlm = mlm_loss.forward(env, a->mlm_logits, batch.targets, batch.loss_mask, a->mlm_ce);
    // Sentence: the pooler on [CLS], the 2-way classifier.
    a->cls = first_tokens(env, y);
    const Tensor pre = pooler.forward(env, a->cls);
    a->pooled = env.act(pre.shape());
    env.be.tanh_forward(a->pooled, pre);
    a->sentence_logits = classifier.forward(env, a->pooled);
    a->sentence_labels = batch.sentence_labels;
    if (!a->sentence_labels.defined())  // a plain token batch: label 0 ("is next")
      a->sentence_labels = env.be.zeros({B}, MemCategory::kActivations, DType::kI32);
    a->sentence = sentence_loss.forward(env, a->sentence_logits, a->sentence_labels, Tensor(),
                                        a->sentence_ce);
    loss->sum = a->mlm.sum + batch.sentence_loss_weight * a->sentence.sum;
    loss->count = a->mlm.count;
    return a;
  }

  Tensor backward(const LayerEnv& env, BackwardPass& pass, HeadActs& acts, const Tensor& y,
                  const ModelBatch& batch, float grad_scale) const override {
    Acts& a = static_cast<Acts&>(acts);
    // Masked LM, back to the transform's input.
    Tensor dlogits = env.act(a.mlm_logits.shape());
    mlm_loss.backward(env, dlogits, a.mlm_logits, a.mlm_ce, batch.targets, batch.loss_mask,
                      grad_scale);
    a.mlm_logits = Tensor();  // the largest activation: release it as soon as it is consumed
    const Tensor dln = decoder.backward(env, pass, std::move(dlogits), a.mlm_ln.out);
    Tensor dact = env.act_zeros(a.mlm_act.shape());
    transform_ln.backward(env, pass, dact, dln, a.mlm_act, a.mlm_ln);
    Tensor dpre = env.act(a.mlm_pre.shape());
    env.be.gelu_backward(dpre, a.mlm_pre, dact, GeluKind::kErf);
    Tensor dy = env.act(y.shape());
    transform.backward(env, pass, &dy, dpre, y);
    // Sentence: its loss weighs sentence_loss_weight in the sum the backward is scaled for.
    Tensor dsl = env.act(a.sentence_logits.shape());
    sentence_loss.backward(env, dsl, a.sentence_logits, a.sentence_ce, a.sentence_labels, Tensor(),
                           static_cast<float>(grad_scale * batch.sentence_loss_weight));
    Tensor dpooled = env.act(a.pooled.shape());
    classifier.backward(env, pass, &dpooled, dsl, a.pooled);
    Tensor dpooled_pre = env.act(a.pooled.shape());
    env.be.tanh_backward(dpooled_pre, a.pooled, dpooled);
    Tensor dcls = env.act(a.cls.shape());
    pooler.backward(env, pass, &dcls, dpooled_pre, a.cls);
    add_first_tokens(env, dy, dcls);
    return dy;
  }

  void report_ready(ParamStore& store) const override {
    store.report_ready(pooler.weight, classifier.bias);
  }

  ReplicatedLinear pooler;       // pooler.dense, on the [CLS] rows (the same on every rank)
  ReplicatedLinear transform;    // cls.predictions.transform.dense, on this rank's rows
  Norm transform_ln;             // cls.predictions.transform.LayerNorm
  ColumnParallelLinear decoder;  // the word embeddings (or the last stage's copy) + its bias
  ReplicatedLinear classifier;   // cls.seq_relationship (2, C)
  VocabParallelCrossEntropy mlm_loss;
  VocabParallelCrossEntropy sentence_loss;  // 2 classes, whole on every rank

 private:
  // The [CLS] rows (B, C) of a (B, S_local, C) hidden state, on every rank of the group: with
  // sequence parallelism position 0 is in tensor rank 0's chunk, on every rank without.
  static Tensor first_tokens(const LayerEnv& env, const Tensor& x) {
    const int64_t B = x.size(0), Sl = x.size(1), C = x.size(2);
    const bool sp = env.tp.sequence_parallel();
    Tensor cls = env.act({B, C});
    if (!sp || env.tp.rank() == 0) {
      for (int64_t b = 0; b < B; ++b) {
        Tensor row = cls.view(b * C, {C});
        env.be.copy(row, x.view(b * Sl * C, {C}));
      }
    } else {
      env.be.zero(cls);
    }
    if (sp) env.tp.sum(cls);
    return cls;
  }
  // The converse: dcls added into those rows of the gradient where this rank holds them.
  static void add_first_tokens(const LayerEnv& env, Tensor& dx, const Tensor& dcls) {
    if (env.tp.sequence_parallel() && env.tp.rank() != 0) return;
    const int64_t B = dx.size(0), Sl = dx.size(1), C = dx.size(2);
    for (int64_t b = 0; b < B; ++b) {
      Tensor row = dx.view(b * Sl * C, {C});
      env.be.add_inplace(row, dcls.view(b * C, {C}));
    }
  }
};

const BertHead::Acts& acts_of(const PieceActs& acts) {
  return static_cast<const BertHead::Acts&>(TransformerModel::head_acts(acts));
}

class BertHeadSpec final : public HeadSpec {
 public:
  explicit BertHeadSpec(double ln_eps) : ln_eps_(ln_eps) {}
  bool ties_embedding() const override { return true; }
  bool generates() const override { return false; }

  std::unique_ptr<ModelHead> declare(ParamLayout& layout, const HeadContext& ctx) const override {
    auto h = std::make_unique<BertHead>();
    const int64_t C = ctx.C;
    const LinearInit w{ctx.init_std};
    const ParamRef table = declare_tied_table(layout, ctx);
    h->pooler = ReplicatedLinear(layout, "pooler.dense", C, C, w, /*sequence_sharded=*/false);
    h->transform = ReplicatedLinear(layout, "cls.predictions.transform.dense", C, C, w,
                                    /*sequence_sharded=*/true);
    h->transform_ln =
        Norm(layout, NormKind::kLayerNorm, "cls.predictions.transform.LayerNorm", C, ln_eps_);
    h->decoder = ColumnParallelLinear::tied_to(table, ctx.vocab.local);
    // The decoder's own bias, a (Vp, 1) column so that it is padded, split and resharded with
    // the vocabulary exactly as the tables' rows are (its padded entries stay 0: no gradient
    // reaches them).
    h->decoder.bias = layout.add({"cls.predictions.bias",
                                  {ctx.vocab.Vp, 1},
                                  ParamSplit::kRows,
                                  ParamInit::kZeros,
                                  0,
                                  ctx.vocab.V,
                                  false,
                                  {}});
    h->classifier =
        ReplicatedLinear(layout, "cls.seq_relationship", C, 2, w, /*sequence_sharded=*/false);
    h->mlm_loss = VocabParallelCrossEntropy(ctx.vocab);
    h->sentence_loss = VocabParallelCrossEntropy(vocab_shard(2, 1, 0), /*over_group=*/false);
    return h;
  }

  PartWork work(int64_t C, int64_t Vp, const WorkShape& s) const override {
    const double c = static_cast<double>(C);
    PartWork w = ReplicatedLinear::work(C, C, s.tokens_local());
    w.elementwise(2 * s.tokens_local() * c);  // the transform's GELU
    w += Norm::work(C, s);
    w += ColumnParallelLinear::work(C, Vp, s);
    w += VocabParallelCrossEntropy::work(s.tokens(), static_cast<double>(Vp) / s.t, s);
    if (s.sp)  // the [CLS] rows shared over the group
      w.collectives_fwd.push_back({CommGroup::kTensor, CollectiveKind::kAllReduce, s.b * c});
    w += ReplicatedLinear::work(C, C, s.b);
    w.elementwise(2 * s.b * c);  // the pooler's tanh
    w += ReplicatedLinear::work(C, 2, s.b);
    w += VocabParallelCrossEntropy::work(s.b, 2, s, /*over_group=*/false);
    return w;
  }

  ActivationElems activations(int64_t C, int64_t Vp, const WorkShape& s) const override {
    const double c = static_cast<double>(C), tl = s.tokens_local();
    const double logits = s.tokens() * static_cast<double>(Vp) / s.t;
    ActivationElems e;
    // The transform before and after the GELU, its LayerNorm, the logits and their row
    // statistics; [CLS], the pooled rows, the sentence logits and their statistics.
    e.saved = 2 * tl * c + Norm::activations(NormKind::kLayerNorm, C, s).saved + logits +
              VocabParallelCrossEntropy::saved(s.tokens()) + 2 * s.b * c + 2 * s.b +
              VocabParallelCrossEntropy::saved(s.b);
    // d(logits) beside the logits, d(LayerNorm) over the full sequence, d(act), d(pre) and the
    // hidden state's gradient.
    e.transient = logits + s.tokens() * c + 3 * tl * c;
    e.freed_before_layers = logits;
    return e;
  }

  double flops_per_token(int64_t C, int V) const override {
    const double c = static_cast<double>(C);
    return 2.0 * c * c + 2.0 * c * V;
  }
  double flops_per_sequence(int64_t C) const override {
    const double c = static_cast<double>(C);
    return 2.0 * c * c + 2.0 * c * 2;
  }

 private:
  double ln_eps_;
};

}  // namespace

std::shared_ptr<const HeadSpec> bert_head_spec(double ln_eps) {
  return std::make_shared<BertHeadSpec>(ln_eps);
}

const Tensor& bert_mlm_logits(const PieceActs& acts) {
  return acts_of(acts).mlm_logits;
}
const Tensor& bert_sentence_logits(const PieceActs& acts) {
  return acts_of(acts).sentence_logits;
}
LossSum bert_mlm_loss(const PieceActs& acts) {
  return acts_of(acts).mlm;
}
LossSum bert_sentence_loss(const PieceActs& acts) {
  return acts_of(acts).sentence;
}

}  // namespace strata
