#include "models/bert/bert.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "runtime/base/check.h"

namespace strata {

BertShape bert_shape(const ModelConfig& m) {
  BertShape s;
  s.L = m.num_layers;
  s.C = m.hidden_size;
  s.NH = m.num_heads;
  s.F = m.ffn_hidden_size;
  s.S = m.seq_len;
  s.V = m.vocab_size;
  s.T = m.type_vocab_size;
  s.init_std = m.init_std;
  s.ln_eps = m.layer_norm_eps;
  return s;
}

// One post-norm encoder block: its layers and the range of its parameters.
struct BertModel::Block {
  SelfAttention attn;
  Norm ln_attn;  // attention.output.LayerNorm
  MLP mlp;
  Norm ln_out;           // output.LayerNorm
  ParamRef first, last;  // the q/k/v weight … output.LayerNorm.bias

  // What the block's forward keeps. Shapes: B micro-batch, S sequence, Sl = S/t with sequence
  // parallelism (else S), C hidden, t tensor-parallel size. The block's input (the previous
  // block's output or the piece's input) is kept by its owner.
  struct Saved {
    SelfAttention::Saved attn;  // q/k/v (B, S, 3C/t), the core's state and output
    Tensor res1;                // (B, Sl, C) x + attention(x)
    Norm::Saved ln1;            // (B, Sl, C) a = LayerNorm(res1), the MLP's input
    MLP::Saved mlp;             // (B, S, F/t) before and after the GELU
    Tensor res2;                // (B, Sl, C) a + mlp(a)
    Norm::Saved ln2;            // (B, Sl, C) the block's output = next block's input
  };
};

// The two heads and their losses.
struct BertModel::Head {
  ReplicatedLinear pooler;       // pooler.dense, on the [CLS] rows (the same on every rank)
  ReplicatedLinear transform;    // cls.predictions.transform.dense, on this rank's rows
  Norm transform_ln;             // cls.predictions.transform.LayerNorm
  ColumnParallelLinear decoder;  // the word embeddings (or the last stage's copy) + its bias
  ReplicatedLinear classifier;   // cls.seq_relationship (2, C)
  VocabParallelCrossEntropy mlm_loss;
  VocabParallelCrossEntropy sentence_loss;  // 2 classes, whole on every rank
  ParamRef first, last;                     // pooler.dense.weight … cls.seq_relationship.bias
};

struct BertModel::Acts final : PieceActs {
  int piece = 0;
  std::vector<DeferredWeightGrad> deferred;  // zero-bubble W pass, in backward order
  ModelBatch batch;
  Tensor key_lengths;           // (B) i32, or undefined: no padding
  Tensor embedded;              // (B, Sl, C) the embeddings' sum (first piece)
  Norm::Saved emb_ln;           // (B, Sl, C) its LayerNorm = the first block's input
  Tensor input;                 // (B, Sl, C) the piece's input: emb_ln.out or received
  std::vector<Block::Saved> h;  // [layer − first layer of the piece]
  // Head: masked LM.
  Tensor mlm_pre, mlm_act;  // (B, Sl, C) transform.dense output before and after the GELU
  Norm::Saved mlm_ln;       // (B, Sl, C)
  Tensor mlm_logits;        // (B·S, Vp/t)
  VocabParallelCrossEntropy::Saved mlm_ce;
  LossSum mlm;
  // Head: sentence.
  Tensor cls;              // (B, C) the [CLS] rows
  Tensor pooled;           // (B, C) tanh(pooler.dense(cls))
  Tensor sentence_logits;  // (B, 2)
  Tensor sentence_labels;  // (B) i32
  VocabParallelCrossEntropy::Saved sentence_ce;
  LossSum sentence;
};

ParamLayout BertModel::layout(const BertShape& shape, int tensor, int tensor_rank, bool sp,
                              const std::vector<ModelPiece>& pieces) {
  ModelOptions o;
  o.tensor = tensor;
  o.tensor_rank = tensor_rank;
  o.sequence_parallel = sp;
  o.pieces = pieces;
  BertModel declared_only(shape, o);
  return std::move(declared_only.declared_);
}

BertModel::BertModel(const BertShape& shape, const ModelOptions& options)
    : shape_(shape),
      options_(options),
      pieces_(options.pieces.empty() ? whole_model(shape.L) : options.pieces),
      declared_(options.tensor, options.tensor_rank) {
  declare(declared_);
}

BertModel::BertModel(const BertShape& shape, const ModelOptions& options, Backend& backend)
    : BertModel(shape, options) {
  const BertShape& d = shape_;
  STRATA_CHECK(d.C % d.NH == 0, "hidden " << d.C << " % heads " << d.NH);
  STRATA_CHECK(
      d.NH % options_.tensor == 0 && d.C % options_.tensor == 0 && d.F % options_.tensor == 0,
      "heads, hidden and ffn must divide by tensor " << options_.tensor);
  tp_ = std::make_unique<TensorParallel>(backend, options_.tensor_group, options_.tensor,
                                         options_.tensor_rank, options_.sequence_parallel,
                                         activation_dtype());
  store_ =
      std::make_unique<ParamStore>(std::move(declared_), backend, options_.bf16, options_.seed);
  env_ = std::make_unique<LayerEnv>(LayerEnv{backend, *store_, *tp_, activation_dtype()});
}

BertModel::~BertModel() = default;

void BertModel::declare(ParamLayout& layout) {
  const BertShape& d = shape_;
  const VocabShard vocab = vocab_shard(d.V, options_.tensor, options_.tensor_rank);
  const LinearInit w{d.init_std};
  const bool holds_embedding = pieces_.front().embedding;
  const bool holds_head = pieces_.back().head;
  block_of_layer_.assign(static_cast<size_t>(d.L), -1);
  for (const ModelPiece& piece : pieces_) {
    if (piece.embedding) {
      embedding_ = VocabParallelEmbedding(layout, vocab, d.C, d.init_std,
                                          "embeddings.word_embeddings.weight", d.S,
                                          "embeddings.position_embeddings.weight");
      embedding_.add_token_types(layout, d.T, d.C, d.init_std,
                                 "embeddings.token_type_embeddings.weight");
      embedding_ln_ = Norm(layout, NormKind::kLayerNorm, "embeddings.LayerNorm", d.C, d.ln_eps);
      // Split over two stages, the word embeddings' gradient is final only once summed with
      // the decoder's copy.
      if (!holds_head) layout.infos()[static_cast<size_t>(embedding_.table.index)].tied = true;
    }
    for (int l = piece.first_layer; l < piece.first_layer + piece.num_layers; ++l) {
      const std::string h = "encoder.layer." + std::to_string(l) + ".";
      Block b;
      b.attn = SelfAttention(layout, h + "attention.self.qkv", h + "attention.output.dense", d.C,
                             d.NH, d.NH, w, w, /*bias=*/true, /*rope=*/nullptr,
                             /*causal=*/false);
      b.ln_attn =
          Norm(layout, NormKind::kLayerNorm, h + "attention.output.LayerNorm", d.C, d.ln_eps);
      b.mlp = MLP(layout, MlpActivation::kGeluErf, h + "intermediate.dense", h + "output.dense",
                  d.C, d.F, w, w, /*bias=*/true);
      b.ln_out = Norm(layout, NormKind::kLayerNorm, h + "output.LayerNorm", d.C, d.ln_eps);
      b.first = b.attn.qkv.weight;
      b.last = b.ln_out.last();
      block_of_layer_[static_cast<size_t>(l)] = static_cast<int>(blocks_.size());
      blocks_.push_back(std::move(b));
    }
    if (piece.head) {
      head_ = std::make_unique<Head>();
      Head& hd = *head_;
      ParamRef table = embedding_.table;
      if (!holds_embedding) {
        // The last stage's own copy of the word embeddings: same name, so the same initial
        // values; its gradient is summed with the first stage's every step, so it stays equal.
        const VocabParallelEmbedding copy(layout, vocab, d.C, d.init_std,
                                          "embeddings.word_embeddings.weight", 0, "");
        ParamInfo& info = layout.infos()[static_cast<size_t>(copy.table.index)];
        info.tied = true;
        info.tied_copy = true;
        table = copy.table;
      }
      hd.pooler = ReplicatedLinear(layout, "pooler.dense", d.C, d.C, w, /*sequence_sharded=*/false);
      hd.transform = ReplicatedLinear(layout, "cls.predictions.transform.dense", d.C, d.C, w,
                                      /*sequence_sharded=*/true);
      hd.transform_ln =
          Norm(layout, NormKind::kLayerNorm, "cls.predictions.transform.LayerNorm", d.C, d.ln_eps);
      hd.decoder = ColumnParallelLinear::tied_to(table, vocab.local);
      // The decoder's own bias, a (Vp, 1) column so that it is padded, split and resharded
      // with the vocabulary exactly as the tables' rows are (its padded entries stay 0: no
      // gradient reaches them).
      hd.decoder.bias = layout.add({"cls.predictions.bias",
                                    {vocab.Vp, 1},
                                    ParamSplit::kRows,
                                    ParamInit::kZeros,
                                    0,
                                    d.V,
                                    false,
                                    {}});
      hd.classifier = ReplicatedLinear(layout, "cls.seq_relationship", d.C, 2, w,
                                       /*sequence_sharded=*/false);
      hd.mlm_loss = VocabParallelCrossEntropy(vocab);
      hd.sentence_loss = VocabParallelCrossEntropy(vocab_shard(2, 1, 0), /*over_group=*/false);
      hd.first = hd.pooler.weight;
      hd.last = hd.classifier.bias;
    }
  }
}

Shape BertModel::boundary_shape(int micro_batch, int seq_len) const {
  const bool sp = options_.sequence_parallel && options_.tensor > 1;
  return {micro_batch, sp ? seq_len / options_.tensor : seq_len, shape_.C};
}

const Tensor& BertModel::piece_output(const PieceActs& acts) const {
  const Acts& a = static_cast<const Acts&>(acts);
  return a.h.empty() ? a.input : a.h.back().ln2.out;
}

const Tensor& BertModel::mlm_logits(const PieceActs& acts) {
  return static_cast<const Acts&>(acts).mlm_logits;
}
const Tensor& BertModel::sentence_logits(const PieceActs& acts) {
  return static_cast<const Acts&>(acts).sentence_logits;
}
LossSum BertModel::mlm_loss(const PieceActs& acts) {
  return static_cast<const Acts&>(acts).mlm;
}
LossSum BertModel::sentence_loss(const PieceActs& acts) {
  return static_cast<const Acts&>(acts).sentence;
}

PieceActsPtr BertModel::forward_piece(int piece, const Tensor& input, const ModelBatch& batch,
                                      LossSum* loss) {
  const LayerEnv& env = *env_;
  const ModelPiece& pc = pieces_.at(static_cast<size_t>(piece));
  const int64_t B = batch.tokens.size(0), S = batch.tokens.size(1);
  STRATA_CHECK(S <= shape_.S, "sequence " << S << " > model.seq_len " << shape_.S);
  auto a = std::make_unique<Acts>();
  a->piece = piece;
  a->batch = batch;
  a->key_lengths = batch.key_lengths;
  *loss = LossSum{};

  if (pc.embedding) {
    // A batch without segments (a tool's plain token batch) is all segment A.
    Tensor types = batch.token_types;
    if (!types.defined()) types = env.be.zeros({B, S}, MemCategory::kActivations, DType::kI32);
    a->batch.token_types = types;
    a->embedded = embedding_.forward(env, batch.tokens, types);
    embedding_ln_.forward(env, a->emb_ln, a->embedded);
    a->input = a->emb_ln.out;
  } else {
    a->input = input;
  }
  a->h.resize(static_cast<size_t>(pc.num_layers));
  for (int i = 0; i < pc.num_layers; ++i) {
    const Block& blk = block(pc.first_layer + i);
    block_forward(blk, i > 0 ? a->h[static_cast<size_t>(i - 1)].ln2.out : a->input, *a, i, false);
  }
  if (pc.head) head_forward(*a, loss);
  return a;
}

void BertModel::block_forward(const Block& blk, const Tensor& x, Acts& a, int i,
                              bool recomputing) const {
  const LayerEnv& env = *env_;
  Block::Saved& h = a.h[static_cast<size_t>(i)];
  h.res1 = blk.attn.forward(env, x, x, h.attn, a.key_lengths);
  // Selective recompute: the attention core is recomputed from q/k/v in the backward pass.
  if (options_.recompute == Recompute::kSelective && !recomputing) SelfAttention::drop_core(h.attn);
  blk.ln_attn.forward(env, h.ln1, h.res1);
  h.res2 = blk.mlp.forward(env, h.ln1.out, h.ln1.out, h.mlp);
  blk.ln_out.forward(env, h.ln2, h.res2);
  if (options_.recompute == Recompute::kFull && !recomputing) {
    // Keep only the block's output (the next block's input); the backward pass re-runs this
    // forward from the input to get the rest back.
    Norm::Saved out = h.ln2;
    h = Block::Saved();
    h.ln2.out = out.out;
  }
}

void BertModel::head_forward(Acts& a, LossSum* loss) const {
  const LayerEnv& env = *env_;
  const Head& hd = *head_;
  const ModelBatch& batch = a.batch;
  const int64_t B = batch.tokens.size(0), S = batch.tokens.size(1);
  const Tensor& y = piece_output(a);
  // Masked LM: every position's logits, the loss over the masked ones.
  hd.transform.forward_gelu(env, y, &a.mlm_pre, &a.mlm_act, GeluKind::kErf);
  hd.transform_ln.forward(env, a.mlm_ln, a.mlm_act);
  a.mlm_logits = hd.decoder.forward(env, a.mlm_ln.out).reshape({B * S, hd.decoder.out_local});
  a.mlm = hd.mlm_loss.forward(env, a.mlm_logits, batch.targets, batch.loss_mask, a.mlm_ce);
  // Sentence: the pooler on [CLS], the 2-way classifier.
  a.cls = first_tokens(y);
  const Tensor pre = hd.pooler.forward(env, a.cls);
  a.pooled = env.act(pre.shape());
  env.be.tanh_forward(a.pooled, pre);
  a.sentence_logits = hd.classifier.forward(env, a.pooled);
  a.sentence_labels = batch.sentence_labels;
  if (!a.sentence_labels.defined())  // a plain token batch: label 0 ("is next")
    a.sentence_labels = env.be.zeros({B}, MemCategory::kActivations, DType::kI32);
  a.sentence =
      hd.sentence_loss.forward(env, a.sentence_logits, a.sentence_labels, Tensor(), a.sentence_ce);
  loss->sum = a.mlm.sum + batch.sentence_loss_weight * a.sentence.sum;
  loss->count = a.mlm.count;
}

Tensor BertModel::first_tokens(const Tensor& x) const {
  const LayerEnv& env = *env_;
  const int64_t B = x.size(0), Sl = x.size(1), C = x.size(2);
  const bool sp = tp_->sequence_parallel();
  Tensor cls = env.act({B, C});
  // Position 0 is in tensor rank 0's chunk with sequence parallelism, on every rank without.
  if (!sp || tp_->rank() == 0) {
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

void BertModel::add_first_tokens(Tensor& dx, const Tensor& dcls) const {
  const LayerEnv& env = *env_;
  if (tp_->sequence_parallel() && tp_->rank() != 0) return;
  const int64_t B = dx.size(0), Sl = dx.size(1), C = dx.size(2);
  for (int64_t b = 0; b < B; ++b) {
    Tensor row = dx.view(b * Sl * C, {C});
    env.be.add_inplace(row, dcls.view(b * C, {C}));
  }
}

Tensor BertModel::backward_piece(PieceActs& acts, const Tensor& dout, float grad_scale,
                                 bool last_microbatch, bool defer_weight_grads) {
  const LayerEnv& env = *env_;
  Acts& a = static_cast<Acts&>(acts);
  const ModelPiece& pc = pieces_[static_cast<size_t>(a.piece)];
  BackwardPass pass{defer_weight_grads, last_microbatch, &a.deferred};
  // With deferred weight gradients nothing is final before the W pass reports it.
  store_->set_reporting(last_microbatch && !defer_weight_grads);

  Tensor dy;  // gradient of the current hidden state, (B, Sl, C)
  if (pc.head) {
    dy = head_backward(a, pass, grad_scale);
    report_head_ready();
  } else {
    dy = dout;
  }
  for (int i = pc.num_layers - 1; i >= 0; --i) {
    const Tensor& x = i > 0 ? a.h[static_cast<size_t>(i - 1)].ln2.out : a.input;
    const Block& blk = block(pc.first_layer + i);
    dy = block_backward(blk, x, a, i, pass, dy);
  }
  Tensor dinput;
  if (pc.embedding) {
    Tensor dembedded = env.act_zeros(a.embedded.shape());
    embedding_ln_.backward(env, pass, dembedded, dy, a.embedded, a.emb_ln);
    embedding_.backward(env, dembedded, a.batch.tokens, a.batch.token_types);
    report_embedding_ready();
  } else {
    dinput = dy;
  }
  store_->set_reporting(false);
  return dinput;
}

Tensor BertModel::head_backward(Acts& a, BackwardPass& pass, float grad_scale) const {
  const LayerEnv& env = *env_;
  const Head& hd = *head_;
  const ModelBatch& batch = a.batch;
  const Tensor& y = piece_output(a);
  // Masked LM, back to the transform's input.
  Tensor dlogits = env.act(a.mlm_logits.shape());
  hd.mlm_loss.backward(env, dlogits, a.mlm_logits, a.mlm_ce, batch.targets, batch.loss_mask,
                       grad_scale);
  a.mlm_logits = Tensor();  // the largest activation: release it as soon as it is consumed
  const Tensor dln = hd.decoder.backward(env, pass, std::move(dlogits), a.mlm_ln.out);
  Tensor dact = env.act_zeros(a.mlm_act.shape());
  hd.transform_ln.backward(env, pass, dact, dln, a.mlm_act, a.mlm_ln);
  Tensor dpre = env.act(a.mlm_pre.shape());
  env.be.gelu_backward(dpre, a.mlm_pre, dact, GeluKind::kErf);
  Tensor dy = env.act(y.shape());
  hd.transform.backward(env, pass, &dy, dpre, y);
  // Sentence: its loss weighs sentence_loss_weight in the sum the backward is scaled for.
  Tensor dsl = env.act(a.sentence_logits.shape());
  hd.sentence_loss.backward(env, dsl, a.sentence_logits, a.sentence_ce, a.sentence_labels, Tensor(),
                            static_cast<float>(grad_scale * batch.sentence_loss_weight));
  Tensor dpooled = env.act(a.pooled.shape());
  hd.classifier.backward(env, pass, &dpooled, dsl, a.pooled);
  Tensor dpooled_pre = env.act(a.pooled.shape());
  env.be.tanh_backward(dpooled_pre, a.pooled, dpooled);
  Tensor dcls = env.act(a.cls.shape());
  hd.pooler.backward(env, pass, &dcls, dpooled_pre, a.cls);
  add_first_tokens(dy, dcls);
  return dy;
}

Tensor BertModel::block_backward(const Block& blk, const Tensor& x, Acts& a, int i,
                                 BackwardPass& pass, const Tensor& dout) const {
  const LayerEnv& env = *env_;
  Block::Saved& h = a.h[static_cast<size_t>(i)];
  if (options_.recompute == Recompute::kFull) block_forward(blk, x, a, i, true);
  if (options_.recompute == Recompute::kSelective) blk.attn.recompute_core(env, h.attn);
  // out = LN(res2), res2 = a + mlp(a): d(a) = d(res2) + the MLP's input gradient.
  Tensor dres2 = env.act_zeros(h.res2.shape());
  blk.ln_out.backward(env, pass, dres2, dout, h.res2, h.ln2);
  Tensor da = blk.mlp.backward(env, pass, dres2, h.ln1.out, h.mlp);
  env.be.add_inplace(da, dres2);
  dres2 = Tensor();
  // a = LN(res1), res1 = x + attention(x): d(x) = d(res1) + the attention's input gradient.
  Tensor dres1 = env.act_zeros(h.res1.shape());
  blk.ln_attn.backward(env, pass, dres1, da, h.res1, h.ln1);
  da = Tensor();
  Tensor dx = blk.attn.backward(env, pass, dres1, x, h.attn);
  env.be.add_inplace(dx, dres1);
  h = Block::Saved();  // this block's activations are consumed
  store_->report_ready(blk.first, blk.last);
  return dx;
}

void BertModel::backward_weight_piece(PieceActs& acts, bool last_microbatch) {
  Acts& a = static_cast<Acts&>(acts);
  run_deferred_weight_grads(*env_, a.deferred);
  // Every gradient of the piece is final now: report them all at once.
  if (last_microbatch) {
    store_->set_reporting(true);
    report_piece_ready(a.piece);
    store_->set_reporting(false);
  }
}

const BertModel::Block& BertModel::block(int layer) const {
  return blocks_[static_cast<size_t>(block_of_layer_[static_cast<size_t>(layer)])];
}

void BertModel::report_embedding_ready() const {
  store_->report_ready(embedding_.table, embedding_ln_.last());
}

void BertModel::report_head_ready() const {
  store_->report_ready(head_->first, head_->last);
}

void BertModel::report_piece_ready(int piece) const {
  const ModelPiece& pc = pieces_[static_cast<size_t>(piece)];
  if (pc.head) report_head_ready();
  for (int l = pc.first_layer + pc.num_layers - 1; l >= pc.first_layer; --l) {
    const Block& blk = block(l);
    store_->report_ready(blk.first, blk.last);
  }
  if (pc.embedding) report_embedding_ready();
}

void BertModel::rerun_selective_recompute(const PieceActs& acts) {
  const Acts& a = static_cast<const Acts&>(acts);
  const ModelPiece& pc = pieces_[static_cast<size_t>(a.piece)];
  for (int i = 0; i < pc.num_layers; ++i) {
    const Block& blk = block(pc.first_layer + i);
    SelfAttention::Saved again;
    again.qkv = a.h[static_cast<size_t>(i)].attn.qkv;
    again.key_lengths = a.key_lengths;
    blk.attn.recompute_core(*env_, again);
  }
}

}  // namespace strata
