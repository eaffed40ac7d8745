#include "models/decoder/decoder.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "runtime/base/check.h"

namespace strata {

// One transformer block: its layers and the range of its parameters.
struct DecoderModel::Block {
  Norm ln1, ln2;
  SelfAttention attn;
  MLP mlp;
  ParamRef first, last;  // norm_1.weight … the MLP projection's last parameter

  // What the block's forward keeps. Shapes: B micro-batch, S sequence, Sl = S/t with sequence
  // parallelism (else S), C hidden, t tensor-parallel size.
  struct Saved {
    Norm::Saved ln1;            // (B, Sl, C) norm_1(x)
    SelfAttention::Saved attn;  // q/k/v (B, S, (NH + 2·KVH)·HS/t), the core's state and output
    Tensor res1;                // (B, Sl, C) x + attn(x)
    Norm::Saved ln2;            // (B, Sl, C)
    MLP::Saved mlp;             // (B, S, F/t or 2F/t) before and (B, S, F/t) after the activation
    Tensor out;                 // (B, Sl, C) block output = next block's input
  };
};

// ln_f, the LM head and the loss.
struct DecoderModel::Head {
  Norm ln_f;
  ColumnParallelLinear lm_head;  // weight: lm_head.weight, or wte (tied)
  VocabParallelCrossEntropy loss;
  bool own_weight = false;  // an untied lm_head.weight
};

struct DecoderModel::Acts final : PieceActs {
  int piece = 0;
  std::vector<DeferredWeightGrad> deferred;  // zero-bubble W pass, in backward order
  ModelBatch batch;
  Tensor input;                 // (B, Sl, C) the piece's input: embedding output or received
  std::vector<Block::Saved> h;  // [layer − first layer of the piece]
  Norm::Saved lnf;              // (B, Sl, C)
  Tensor logits;                // (B·S, Vp/t)
  VocabParallelCrossEntropy::Saved ce;
};

ParamLayout DecoderModel::layout(const DecoderShape& shape, int tensor, int tensor_rank, bool sp,
                                 const std::vector<ModelPiece>& pieces) {
  ModelOptions o;
  o.tensor = tensor;
  o.tensor_rank = tensor_rank;
  o.sequence_parallel = sp;
  o.pieces = pieces;
  DecoderModel declared_only(shape, o);
  return std::move(declared_only.declared_);
}

DecoderModel::DecoderModel(const DecoderShape& shape, const ModelOptions& options)
    : shape_(shape),
      options_(options),
      pieces_(options.pieces.empty() ? whole_model(shape.L) : options.pieces),
      declared_(options.tensor, options.tensor_rank) {
  declare(declared_);
}

DecoderModel::DecoderModel(const DecoderShape& shape, const ModelOptions& options, Backend& backend)
    : DecoderModel(shape, options) {
  const DecoderShape& d = shape_;
  STRATA_CHECK(d.C % d.NH == 0, "hidden " << d.C << " % heads " << d.NH);
  STRATA_CHECK(d.KVH >= 1 && d.NH % d.KVH == 0, "heads " << d.NH << " % key/value heads " << d.KVH);
  STRATA_CHECK(d.NH % options_.tensor == 0 && d.KVH % options_.tensor == 0 &&
                   d.C % options_.tensor == 0 && d.F % options_.tensor == 0,
               "heads, key/value heads, hidden and ffn must divide by tensor " << options_.tensor);
  tp_ = std::make_unique<TensorParallel>(backend, options_.tensor_group, options_.tensor,
                                         options_.tensor_rank, options_.sequence_parallel,
                                         activation_dtype());
  store_ =
      std::make_unique<ParamStore>(std::move(declared_), backend, options_.bf16, options_.seed);
  env_ = std::make_unique<LayerEnv>(LayerEnv{backend, *store_, *tp_, activation_dtype()});
  // Decoding runs the tensor-parallel layers without sequence parallelism (a step may be one
  // position): the same weights, whole-sequence activations on every rank of the group.
  decode_tp_ = std::make_unique<TensorParallel>(backend, options_.tensor_group, options_.tensor,
                                                options_.tensor_rank, false, activation_dtype());
  decode_env_ =
      std::make_unique<LayerEnv>(LayerEnv{backend, *store_, *decode_tp_, activation_dtype()});
  if (!d.learned_positions)
    rope_ = RotaryEmbedding(backend, d.S, d.head_size(), d.rope_theta, d.rope_scaling);
}

DecoderModel::~DecoderModel() = default;

void DecoderModel::declare(ParamLayout& layout) {
  const DecoderShape& d = shape_;
  const DecoderNames& n = d.names;
  const VocabShard vocab = vocab_shard(d.V, options_.tensor, options_.tensor_rank);
  const LinearInit w{d.init_std};
  // GPT-2's residual scaling of the two output projections.
  const LinearInit proj{d.scaled_proj_init ? d.init_std / std::sqrt(2.0 * d.L) : d.init_std};
  const bool holds_embedding = pieces_.front().embedding;
  const bool holds_head = pieces_.back().head;
  // The attention layers keep a pointer to the table, which the backend constructor fills.
  const RotaryEmbedding* rope = d.learned_positions ? nullptr : &rope_;
  block_of_layer_.assign(static_cast<size_t>(d.L), -1);
  for (const ModelPiece& piece : pieces_) {
    if (piece.embedding) {
      embedding_ = VocabParallelEmbedding(layout, vocab, d.C, d.init_std, n.embedding,
                                          d.learned_positions ? d.S : 0, n.positions);
      // Split over two stages, the tied table's gradient is final only once summed with the
      // head's copy.
      if (d.tie && !holds_head)
        layout.infos()[static_cast<size_t>(embedding_.table.index)].tied = true;
    }
    for (int l = piece.first_layer; l < piece.first_layer + piece.num_layers; ++l) {
      const std::string h = n.layer + std::to_string(l) + ".";
      Block b;
      b.ln1 = Norm(layout, d.norm, h + n.norm_1, d.C, d.norm_eps);
      b.attn = SelfAttention(layout, h + n.qkv, h + n.attn_proj, d.C, d.NH, d.KVH, w, proj, d.bias,
                             rope);
      b.ln2 = Norm(layout, d.norm, h + n.norm_2, d.C, d.norm_eps);
      b.mlp = MLP(layout, d.mlp, h + n.mlp_fc, h + n.mlp_proj, d.C, d.F, w, proj, d.bias);
      b.first = b.ln1.first();
      b.last = b.mlp.proj.bias.valid() ? b.mlp.proj.bias : b.mlp.proj.weight;
      block_of_layer_[static_cast<size_t>(l)] = static_cast<int>(blocks_.size());
      blocks_.push_back(std::move(b));
    }
    if (piece.head) {
      head_ = std::make_unique<Head>();
      head_->ln_f = Norm(layout, d.norm, n.final_norm, d.C, d.norm_eps);
      if (!d.tie) {
        head_->lm_head = ColumnParallelLinear(layout, n.lm_head, d.C, vocab.Vp, w, /*bias=*/false);
        // Padded vocabulary rows stay zero, as in the embedding.
        layout.infos()[static_cast<size_t>(head_->lm_head.weight.index)].rows_initialised = d.V;
        head_->own_weight = true;
      } else if (!holds_embedding) {
        // The last stage's own copy of the tied embedding: same name, so the same initial
        // values; its gradient is summed with the first stage's every step, so it stays equal.
        const VocabParallelEmbedding copy(layout, vocab, d.C, d.init_std, n.embedding, 0, "");
        ParamInfo& info = layout.infos()[static_cast<size_t>(copy.table.index)];
        info.tied = true;
        info.tied_copy = true;
        head_->lm_head = ColumnParallelLinear::tied_to(copy.table, vocab.local);
      } else {
        head_->lm_head = ColumnParallelLinear::tied_to(embedding_.table, vocab.local);
      }
      head_->loss = VocabParallelCrossEntropy(vocab);
    }
  }
}

Shape DecoderModel::boundary_shape(int micro_batch, int seq_len) const {
  const bool sp = options_.sequence_parallel && options_.tensor > 1;
  return {micro_batch, sp ? seq_len / options_.tensor : seq_len, shape_.C};
}

const Tensor& DecoderModel::piece_output(const PieceActs& acts) const {
  const Acts& a = static_cast<const Acts&>(acts);
  return a.h.empty() ? a.input : a.h.back().out;
}

const Tensor& DecoderModel::logits(const PieceActs& acts) {
  return static_cast<const Acts&>(acts).logits;
}

PieceActsPtr DecoderModel::forward_piece(int piece, const Tensor& input, const ModelBatch& batch,
                                         LossSum* loss) {
  const LayerEnv& env = *env_;
  const ModelPiece& pc = pieces_.at(static_cast<size_t>(piece));
  const int64_t B = batch.tokens.size(0), S = batch.tokens.size(1);
  STRATA_CHECK(S <= shape_.S, "sequence " << S << " > model.seq_len " << shape_.S);
  auto a = std::make_unique<Acts>();
  a->piece = piece;
  a->batch = batch;
  *loss = LossSum{};

  a->input = pc.embedding ? embedding_.forward(env, batch.tokens) : input;
  a->h.resize(static_cast<size_t>(pc.num_layers));
  for (int i = 0; i < pc.num_layers; ++i) {
    const Block& blk = block(pc.first_layer + i);
    block_forward(blk, i > 0 ? a->h[static_cast<size_t>(i - 1)].out : a->input, *a, i, false);
  }
  if (!pc.head) return a;

  const Head& head = *head_;
  head.ln_f.forward(env, a->lnf, piece_output(*a));
  a->logits = head.lm_head.forward(env, a->lnf.out).reshape({B * S, head.lm_head.out_local});
  *loss = head.loss.forward(env, a->logits, batch.targets, batch.loss_mask, a->ce);
  return a;
}

void DecoderModel::block_forward(const Block& blk, const Tensor& x, Acts& a, int i,
                                 bool recomputing) const {
  const LayerEnv& env = *env_;
  Block::Saved& h = a.h[static_cast<size_t>(i)];
  blk.ln1.forward(env, h.ln1, x);
  h.res1 = blk.attn.forward(env, h.ln1.out, x, h.attn);
  // Selective recompute: the attention core is recomputed from q/k/v in the backward pass, so
  // its S×S state (the largest activation at long sequences) and output are dropped.
  if (options_.recompute == Recompute::kSelective && !recomputing) SelfAttention::drop_core(h.attn);
  blk.ln2.forward(env, h.ln2, h.res1);
  h.out = blk.mlp.forward(env, h.ln2.out, h.res1, h.mlp);
  if (options_.recompute == Recompute::kFull && !recomputing) {
    // Keep only the block's output (the next block's input); the backward pass re-runs this
    // forward from the input to get the rest back.
    Tensor out = h.out;
    h = Block::Saved();
    h.out = out;
  }
}

Tensor DecoderModel::backward_piece(PieceActs& acts, const Tensor& dout, float grad_scale,
                                    bool last_microbatch, bool defer_weight_grads) {
  const LayerEnv& env = *env_;
  Acts& a = static_cast<Acts&>(acts);
  const ModelPiece& pc = pieces_[static_cast<size_t>(a.piece)];
  BackwardPass pass{defer_weight_grads, last_microbatch, &a.deferred};
  // With deferred weight gradients nothing is final before the W pass reports it.
  store_->set_reporting(last_microbatch && !defer_weight_grads);
  const int64_t B = a.batch.tokens.size(0), S = a.batch.tokens.size(1);
  const int64_t Sl = tp_->seq_local(S);

  Tensor dresid;  // gradient of the residual stream, (B, Sl, C)
  if (pc.head) {
    const Head& head = *head_;
    dresid = env.act_zeros({B, Sl, shape_.C});
    Tensor dlogits = env.act(a.logits.shape());
    head.loss.backward(env, dlogits, a.logits, a.ce, a.batch.targets, a.batch.loss_mask,
                       grad_scale);
    a.logits = Tensor();  // the largest activation: release it as soon as it is consumed
    const Tensor dlnf = head.lm_head.backward(env, pass, std::move(dlogits), a.lnf.out);
    head.ln_f.backward(env, pass, dresid, dlnf, piece_output(a), a.lnf);
    report_head_ready();
  } else {
    // The gradient arrives from the next stage; it is accumulated in place below.
    dresid = env.act({B, Sl, shape_.C});
    env.be.copy(dresid, dout);
  }

  for (int i = pc.num_layers - 1; i >= 0; --i) {
    const Tensor& x = i > 0 ? a.h[static_cast<size_t>(i - 1)].out : a.input;
    const Block& blk = block(pc.first_layer + i);
    block_backward(blk, x, a, i, pass, dresid);
  }

  Tensor dinput;
  if (pc.embedding) {
    embedding_.backward(env, dresid, a.batch.tokens);
    report_embedding_ready();
  } else {
    dinput = dresid;
  }
  store_->set_reporting(false);
  return dinput;
}

void DecoderModel::block_backward(const Block& blk, const Tensor& x, Acts& a, int i,
                                  BackwardPass& pass, Tensor& dresid) const {
  const LayerEnv& env = *env_;
  Block::Saved& h = a.h[static_cast<size_t>(i)];
  if (options_.recompute == Recompute::kFull) block_forward(blk, x, a, i, true);
  if (options_.recompute == Recompute::kSelective) blk.attn.recompute_core(env, h.attn);
  // MLP branch: dresid holds d(out); it is also d(res1) through the residual.
  {
    const Tensor dln2 = blk.mlp.backward(env, pass, dresid, h.ln2.out, h.mlp);
    blk.ln2.backward(env, pass, dresid, dln2, h.res1, h.ln2);
  }
  // Attention branch: dresid now holds d(res1), also d(x) through the residual.
  {
    const Tensor dln1 = blk.attn.backward(env, pass, dresid, h.ln1.out, h.attn);
    blk.ln1.backward(env, pass, dresid, dln1, x, h.ln1);
  }
  h = Block::Saved();  // this block's activations are consumed
  store_->report_ready(blk.first, blk.last);
}

void DecoderModel::backward_weight_piece(PieceActs& acts, bool last_microbatch) {
  Acts& a = static_cast<Acts&>(acts);
  run_deferred_weight_grads(*env_, a.deferred);
  // Every gradient of the piece is final now: report them all at once.
  if (last_microbatch) {
    store_->set_reporting(true);
    report_piece_ready(a.piece);
    store_->set_reporting(false);
  }
}

const DecoderModel::Block& DecoderModel::block(int layer) const {
  return blocks_[static_cast<size_t>(block_of_layer_[static_cast<size_t>(layer)])];
}

void DecoderModel::report_embedding_ready() const {
  store_->report_ready(embedding_.table,
                       embedding_.positions.valid() ? embedding_.positions : embedding_.table);
}

void DecoderModel::report_head_ready() const {
  if (head_->own_weight) store_->report_ready(head_->lm_head.weight, head_->lm_head.weight);
  store_->report_ready(head_->ln_f.first(), head_->ln_f.last());
}

void DecoderModel::report_piece_ready(int piece) const {
  const ModelPiece& pc = pieces_[static_cast<size_t>(piece)];
  if (pc.head) report_head_ready();
  for (int l = pc.first_layer + pc.num_layers - 1; l >= pc.first_layer; --l) {
    const Block& blk = block(l);
    store_->report_ready(blk.first, blk.last);
  }
  if (pc.embedding) report_embedding_ready();
}

void DecoderModel::rerun_selective_recompute(const PieceActs& acts) {
  const Acts& a = static_cast<const Acts&>(acts);
  const ModelPiece& pc = pieces_[static_cast<size_t>(a.piece)];
  for (int i = 0; i < pc.num_layers; ++i) {
    const Block& blk = block(pc.first_layer + i);
    SelfAttention::Saved again;
    again.qkv = a.h[static_cast<size_t>(i)].attn.qkv;
    blk.attn.recompute_core(*env_, again);
  }
}

// The key and value caches of every layer: (B, capacity, KVH/t, HS) each, activation type.
struct DecoderGeneration final : GenerationState {
  std::vector<Tensor> k, v;  // [layer]
};

std::unique_ptr<GenerationState> DecoderModel::start_generation(int batch, int64_t capacity) {
  if (capacity < 1 || capacity > shape_.S)
    throw std::runtime_error("generation of " + std::to_string(capacity) +
                             " positions: the model has " + std::to_string(shape_.S));
  auto g = std::make_unique<DecoderGeneration>();
  g->batch = batch;
  g->capacity = capacity;
  g->width = shape_.C;
  g->vocab = shape_.V;
  const LayerEnv& env = *decode_env_;
  g->k.resize(static_cast<size_t>(shape_.L));
  g->v.resize(static_cast<size_t>(shape_.L));
  for (int l = 0; l < shape_.L; ++l) {
    if (block_of_layer_[static_cast<size_t>(l)] < 0) continue;  // another stage's layer
    const SelfAttention& attn = block(l).attn;
    const Shape cache{batch, capacity, attn.kv_heads_local, attn.head_size};
    g->k[static_cast<size_t>(l)] = env.act_zeros(cache);
    g->v[static_cast<size_t>(l)] = env.act_zeros(cache);
  }
  return g;
}

Tensor DecoderModel::decode_piece(GenerationState& state, int piece, const Tensor& input,
                                  const std::vector<int32_t>& ids, int T,
                                  std::vector<float>* logits_out) {
  DecoderGeneration& g = static_cast<DecoderGeneration&>(state);
  const LayerEnv& env = *decode_env_;
  const ModelPiece& pc = pieces_[static_cast<size_t>(piece)];
  const int64_t B = g.batch, pos0 = g.length;
  if (T < 1) throw std::invalid_argument("decode: T >= 1 new positions");
  if (pos0 + T > g.capacity)
    throw std::runtime_error("decode: positions " + std::to_string(pos0 + T) + " beyond the " +
                             std::to_string(g.capacity) + " the caches hold");
  Tensor x;
  if (pc.embedding) {
    if (static_cast<int64_t>(ids.size()) != B * T)
      throw std::invalid_argument("decode: tokens (batch, T) row-major");
    Tensor tokens = env.be.empty({B, T}, MemCategory::kActivations, DType::kI32);
    env.be.upload(tokens, ids.data());
    x = embedding_.forward_at(env, tokens, pos0);
  } else {
    STRATA_CHECK(input.defined() && input.numel() == B * T * shape_.C,
                 "decode: piece " << piece << " takes the previous piece's (" << B << ", " << T
                                  << ", " << shape_.C << ") output");
    x = input;
  }
  for (int l = pc.first_layer; l < pc.first_layer + pc.num_layers; ++l) {
    const Block& blk = block(l);
    const SelfAttention& attn = blk.attn;
    Tensor& k_cache = g.k[static_cast<size_t>(l)];
    Tensor& v_cache = g.v[static_cast<size_t>(l)];
    Norm::Saved ln1, ln2;
    blk.ln1.forward(env, ln1, x);
    Tensor qkv = attn.qkv.forward(env, ln1.out);  // (B, T, (NH + 2·KVH)·HS / t)
    if (attn.rope) {
      const Tensor& table = attn.rope->table;  // (S, HS): rows from pos0
      const int64_t HS = table.size(1);
      env.be.rope_forward(qkv, table.view(pos0 * HS, {table.size(0) - pos0, HS}), attn.heads_local,
                          attn.kv_heads_local);
    }
    Tensor q = env.act({B, T, attn.heads_local, attn.head_size});
    env.be.kv_cache_append(q, k_cache, v_cache, qkv, attn.heads_local, attn.kv_heads_local, pos0);
    qkv = Tensor();
    Tensor core = env.act({B, T, attn.heads_local, attn.head_size});
    env.be.attention_decode(core, q, k_cache, v_cache, attn.heads_local, attn.kv_heads_local, pos0);
    const Tensor res1 =
        attn.proj.forward_residual(env, core.reshape({B, T, attn.heads_local * attn.head_size}), x);
    blk.ln2.forward(env, ln2, res1);
    MLP::Saved mlp;
    x = blk.mlp.forward(env, ln2.out, res1, mlp);
  }
  if (!pc.head) return x;
  // The head on every position (the last ones are kept), gathered over the vocabulary shards.
  const Head& head = *head_;
  Norm::Saved lnf;
  head.ln_f.forward(env, lnf, x);
  const int64_t local = head.lm_head.out_local;
  const Tensor logits = head.lm_head.forward(env, lnf.out).reshape({B * T, local});
  Tensor f32 = env.be.empty({B * T, local}, MemCategory::kActivations);
  env.be.cast(f32, logits);
  std::vector<float> rows(static_cast<size_t>(B * T * local));
  env.be.download(rows.data(), f32);
  const VocabShard vocab = vocab_shard(shape_.V, options_.tensor, options_.tensor_rank);
  std::vector<float> full(static_cast<size_t>(B) * vocab.Vp, 0.0f);
  for (int64_t b = 0; b < B; ++b)
    std::copy_n(rows.data() + ((b + 1) * T - 1) * local, local,
                full.data() + b * vocab.Vp + vocab.start);
  if (options_.tensor > 1) {  // each rank holds its shard's columns, zeros elsewhere: a sum
    Tensor gathered = env.be.empty({B, static_cast<int64_t>(vocab.Vp)}, MemCategory::kActivations);
    env.be.upload(gathered, full.data());
    env.tp.sum(gathered);
    env.be.download(full.data(), gathered);
  }
  logits_out->resize(static_cast<size_t>(B) * shape_.V);
  for (int64_t b = 0; b < B; ++b)
    std::copy_n(full.data() + b * vocab.Vp, shape_.V, logits_out->data() + b * shape_.V);
  return Tensor();
}

}  // namespace strata
