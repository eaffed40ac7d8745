#include "models/transformer/transformer.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "models/layers/ring_attention.h"
#include "runtime/base/check.h"

namespace strata {

TransformerSpec transformer_sizes(const std::string& arch, const ModelConfig& m) {
  TransformerSpec s;
  s.arch = arch;
  s.L = m.num_layers;
  s.C = m.hidden_size;
  s.S = m.seq_len;
  s.V = m.vocab_size;
  s.init_std = m.init_std;
  s.block.attention.heads = m.num_heads;
  s.block.attention.kv_heads = m.kv_heads();
  s.block.attention.head_size = m.head_size();
  s.block.mlp.hidden = m.ffn_hidden_size;
  s.block.init_std = m.init_std;
  s.block.proj_init_std = m.init_std;
  s.shape_keys = {{"num_layers", m.num_layers},
                  {"hidden_size", m.hidden_size},
                  {"num_heads", m.num_heads},
                  {"ffn_hidden_size", m.ffn_hidden_size},
                  {"seq_len", m.seq_len},
                  {"vocab_size", m.vocab_size},
                  {"tie_embeddings", m.tie_embeddings}};
  return s;
}

int TransformerSpec::moe_layers() const {
  int n = 0;
  for (int l = 0; l < L; ++l) n += layer_block(l).mlp.is_moe();
  return n;
}

ParamRef declare_tied_table(ParamLayout& layout, const HeadContext& ctx) {
  if (ctx.table.valid()) return ctx.table;
  // Same name as the first stage's table, so the same initial values.
  const VocabParallelEmbedding copy(layout, ctx.vocab, ctx.C, ctx.init_std, ctx.table_name, 0, "");
  ParamInfo& info = layout.infos()[static_cast<size_t>(copy.table.index)];
  info.tied = true;
  info.tied_copy = true;
  return copy.table;
}

void ModelHead::decode_logits(const LayerEnv&, const Tensor&, std::vector<float>*) const {
  throw std::runtime_error("this model does not generate");
}

// The token lookup and, where the spec has one, the norm of its sum.
struct TransformerModel::Embedding {
  VocabParallelEmbedding lookup;
  std::optional<Norm> norm;
  ParamRef first, last;  // its parameters [first, last] in the flat buffers
};

struct TransformerModel::Acts final : PieceActs {
  int piece = 0;
  std::vector<DeferredWeightGrad> deferred;  // zero-bubble W pass, in backward order
  ModelBatch batch;
  Tensor embedded;                         // (B, Sl, C) the lookup's sum (first piece, with a norm)
  Norm::Saved embedding_norm;              // (B, Sl, C) its norm
  Tensor input;                            // (B, Sl, C) the piece's input: embedding or received
  std::vector<TransformerBlock::Saved> h;  // [layer − first layer of the piece]
  std::unique_ptr<HeadActs> head;          // last piece
  // A mixture of experts with a load-balancing loss: its gradient on every token's routing
  // probabilities, per expert, before the backward's scale (moe.h); and the routing statistics
  // of the piece's MoE layers (piece_routing: 2E).
  std::vector<float> aux_grad;
  std::vector<double> moe_sums;
};

namespace {

// The routing statistics of the MoE layers of one piece for one micro-batch (moe.h): into
// sums, [0, E) the assignments per expert and [E, 2E) the probability sums, added over the
// layers; the worst layer's load into loss->expert_load.
void piece_routing(size_t E, const std::vector<TransformerBlock::Saved>& h, double* sums,
                   LossSum* loss) {
  for (const TransformerBlock::Saved& s : h) {
    const MixtureOfExperts::Stats& st = s.moe_stats;
    if (st.routed.empty()) continue;
    double total = 0, most = 0;
    for (size_t e = 0; e < E; ++e) {
      sums[e] += st.routed[e];
      sums[E + e] += st.prob_sum[e];
      total += st.routed[e];
      most = std::max(most, st.routed[e]);
    }
    if (total > 0) loss->expert_load = std::max(loss->expert_load, most * E / total);
  }
}

// Context parallelism: a micro-batch's sequences are split over the context ranks, so each MoE
// layer's routing statistics (routed counts and probability sums, moe.h) are summed over the
// context group, in place: every context rank then holds the whole micro-batch's, and its loads
// and balancing loss are the single process's. One all-reduce of 2E values a layer.
void sum_routing_over_context(const LayerEnv& env, size_t E,
                              std::vector<TransformerBlock::Saved>& h) {
  if (!env.cp || env.cp->size() == 1) return;
  std::vector<float> host;
  for (const TransformerBlock::Saved& s : h) {
    const MixtureOfExperts::Stats& st = s.moe_stats;
    if (st.routed.empty()) continue;
    host.insert(host.end(), st.routed.begin(), st.routed.end());
    host.insert(host.end(), st.prob_sum.begin(), st.prob_sum.end());
  }
  if (host.empty()) return;
  Tensor sums = env.stat({static_cast<int64_t>(host.size())});
  env.be.upload(sums, host.data());
  env.cp->all_reduce(sums, ReduceOp::kSum);
  env.be.download(host.data(), sums);
  size_t at = 0;
  for (TransformerBlock::Saved& s : h) {
    MixtureOfExperts::Stats& st = s.moe_stats;
    if (st.routed.empty()) continue;
    st.routed.assign(host.begin() + static_cast<std::ptrdiff_t>(at),
                     host.begin() + static_cast<std::ptrdiff_t>(at + E));
    st.prob_sum.assign(host.begin() + static_cast<std::ptrdiff_t>(at + E),
                       host.begin() + static_cast<std::ptrdiff_t>(at + 2 * E));
    st.tokens *= env.cp->size();
    at += 2 * E;
  }
}

// The load-balancing loss of Hugging Face's load_balancing_loss_func over the `layers` MoE
// layers of a micro-batch of `tokens` tokens, from their statistics summed (piece_routing):
// times its coefficient into loss->aux, with its gradient per expert.
void finish_balance(const MoeSpec& m, const double* sums, double layers, double tokens,
                    LossSum* loss, std::vector<float>* aux_grad) {
  const size_t E = static_cast<size_t>(m.experts);
  if (layers == 0 || m.aux_coef == 0) return;
  const double n = layers * tokens;
  double aux = 0;
  for (size_t e = 0; e < E; ++e) aux += (sums[e] / n) * (sums[E + e] / n);
  loss->aux = m.aux_coef * static_cast<double>(E) * aux;
  // The objective holds coef · aux · N (a sum over the micro-batch's N tokens, as its token
  // losses are, so that the scale 1 / tokens of the global batch makes it the mean over the
  // micro-batches of coef · aux, as gradient accumulation over Hugging Face's loss does):
  // d(coef · aux · N)/d p_ne = coef · E · f_e · N / (L·N) = coef · E · f_e / L.
  aux_grad->resize(E);
  for (size_t e = 0; e < E; ++e)
    (*aux_grad)[e] =
        static_cast<float>(m.aux_coef * static_cast<double>(E) * (sums[e] / n) / layers);
}

}  // namespace

ParamLayout TransformerModel::layout(const TransformerSpec& spec, int tensor, int tensor_rank,
                                     bool sp, const std::vector<ModelPiece>& pieces, int expert,
                                     int expert_rank) {
  ModelOptions o;
  o.tensor = tensor;
  o.tensor_rank = tensor_rank;
  o.expert = expert;
  o.expert_rank = expert_rank;
  o.sequence_parallel = sp;
  o.pieces = pieces;
  TransformerModel declared_only(spec, o);
  return std::move(declared_only.declared_);
}

TransformerModel::TransformerModel(const TransformerSpec& spec, const ModelOptions& options)
    : spec_(spec),
      options_(options),
      pieces_(options.pieces.empty() ? whole_model(spec.L) : options.pieces),
      declared_(options.tensor, options.tensor_rank, options.expert, options.expert_rank) {
  declare(declared_);
}

TransformerModel::TransformerModel(const TransformerSpec& spec, const ModelOptions& options,
                                   Backend& backend)
    : TransformerModel(spec, options) {
  const AttentionSpec& a = spec_.block.attention;
  STRATA_CHECK(a.kv_heads >= 1 && a.heads % a.kv_heads == 0,
               "heads " << a.heads << " % key/value heads " << a.kv_heads);
  for (int k = 0; k < spec_.kinds(); ++k) {
    const std::string why = TransformerBlock::split_reason(spec_.kind_block(k), options_.tensor);
    STRATA_CHECK(why.empty() && spec_.C % options_.tensor == 0, why);
  }
  tp_ = std::make_unique<TensorParallel>(backend, options_.tensor_group, options_.tensor,
                                         options_.tensor_rank, options_.sequence_parallel,
                                         activation_dtype());
  store_ =
      std::make_unique<ParamStore>(std::move(declared_), backend, options_.bf16, options_.seed);
  env_ = std::make_unique<LayerEnv>(LayerEnv{backend, *store_, *tp_, activation_dtype(),
                                             options_.expert_group, options_.context_group});
  // Decoding runs the tensor-parallel layers without sequence parallelism (a step may be one
  // position): the same weights, whole-sequence activations on every rank of the group.
  decode_tp_ = std::make_unique<TensorParallel>(backend, options_.tensor_group, options_.tensor,
                                                options_.tensor_rank, false, activation_dtype());
  decode_env_ = std::make_unique<LayerEnv>(
      LayerEnv{backend, *store_, *decode_tp_, activation_dtype(), options_.expert_group});
  // With context parallelism the rotary table's rows are this rank's positions (its two
  // chunks'), and the learned positions are looked up by id.
  if (options_.context > 1) {
    STRATA_CHECK(options_.context_group && options_.context_group->size() == options_.context,
                 "context " << options_.context << " without its group");
    context_positions_ =
        ContextChunks{options_.context, options_.context_rank, spec_.S}.positions();
  }
  if (a.rotary)
    rope_ = RotaryEmbedding(backend, spec_.S, static_cast<int>(a.head_size), spec_.rope_theta,
                            spec_.rope_scaling, context_positions_);
}

TransformerModel::~TransformerModel() = default;

void TransformerModel::declare(ParamLayout& layout) {
  const TransformerSpec& d = spec_;
  const EmbeddingSpec& e = d.embedding;
  const VocabShard vocab = vocab_shard(d.V, options_.tensor, options_.tensor_rank);
  const bool holds_head = pieces_.back().head;
  block_of_layer_.assign(static_cast<size_t>(d.L), -1);
  for (const ModelPiece& piece : pieces_) {
    if (piece.embedding) {
      embedding_ = std::make_unique<Embedding>();
      const int first = static_cast<int>(layout.infos().size());
      embedding_->lookup = VocabParallelEmbedding(layout, vocab, d.C, d.init_std, e.table,
                                                  e.positions.empty() ? 0 : d.S, e.positions);
      if (!e.types.empty())
        embedding_->lookup.add_token_types(layout, e.type_vocab, d.C, d.init_std, e.types);
      if (e.norm) embedding_->norm = Norm(layout, *e.norm, e.norm_name, d.C);
      embedding_->first = ParamRef{first};
      embedding_->last = ParamRef{static_cast<int>(layout.infos().size()) - 1};
      // Split over two stages, a tied table's gradient is final only once summed with the
      // head's copy.
      if (d.head->ties_embedding() && !holds_head)
        layout.infos()[static_cast<size_t>(embedding_->lookup.table.index)].tied = true;
    }
    for (int l = piece.first_layer; l < piece.first_layer + piece.num_layers; ++l) {
      block_of_layer_[static_cast<size_t>(l)] = static_cast<int>(blocks_.size());
      // The attention layers keep a pointer to the rotary table, which the backend
      // constructor fills.
      blocks_.emplace_back(layout, d.layer_block(l), d.C, d.layer_prefix + std::to_string(l) + ".",
                           &rope_);
    }
    if (piece.head) {
      HeadContext ctx;
      ctx.vocab = vocab;
      ctx.C = d.C;
      ctx.init_std = d.init_std;
      ctx.table = embedding_ ? embedding_->lookup.table : ParamRef();
      ctx.table_name = e.table;
      head_ = d.head->declare(layout, ctx);
    }
  }
}

const Tensor* TransformerModel::context_position_ids(int64_t B, int64_t S) {
  if (context_positions_.empty()) return nullptr;
  STRATA_CHECK(
      S == static_cast<int64_t>(context_positions_.size()),
      "context rank's batch of " << S << " positions, expected " << context_positions_.size());
  if (!position_ids_.defined() || position_ids_.size(0) != B) {
    std::vector<int32_t> ids(static_cast<size_t>(B * S));
    for (size_t i = 0; i < ids.size(); ++i)
      ids[i] = static_cast<int32_t>(context_positions_[i % static_cast<size_t>(S)]);
    position_ids_ = Tensor();
    position_ids_ = env_->be.empty({B, S}, MemCategory::kBuffers, DType::kI32);
    env_->be.upload(position_ids_, ids.data());
  }
  return &position_ids_;
}

Shape TransformerModel::boundary_shape(int micro_batch, int seq_len) const {
  const bool sp = options_.sequence_parallel && options_.tensor > 1;
  const int local = seq_len / options_.context;  // context parallelism: the rank's chunks
  return {micro_batch, sp ? local / options_.tensor : local, spec_.C};
}

const TransformerBlock& TransformerModel::block(int layer) const {
  return blocks_[static_cast<size_t>(block_of_layer_[static_cast<size_t>(layer)])];
}

const Tensor& TransformerModel::block_input(const Acts& a, int i) const {
  if (i == 0) return a.input;
  const ModelPiece& pc = pieces_[static_cast<size_t>(a.piece)];
  return block(pc.first_layer + i - 1).output(a.h[static_cast<size_t>(i - 1)]);
}

const Tensor& TransformerModel::piece_output(const PieceActs& acts) const {
  const Acts& a = static_cast<const Acts&>(acts);
  return block_input(a, static_cast<int>(a.h.size()));
}

const HeadActs& TransformerModel::head_acts(const PieceActs& acts) {
  const Acts& a = static_cast<const Acts&>(acts);
  STRATA_CHECK(a.head, "the head's activations of a piece without the head");
  return *a.head;
}

PieceActsPtr TransformerModel::forward_piece(int piece, const Tensor& input,
                                             const ModelBatch& batch, LossSum* loss) {
  const LayerEnv& env = *env_;
  const ModelPiece& pc = pieces_.at(static_cast<size_t>(piece));
  const int64_t B = batch.tokens.size(0), S = batch.tokens.size(1);
  STRATA_CHECK(S <= spec_.S, "sequence " << S << " > model.seq_len " << spec_.S);
  auto a = std::make_unique<Acts>();
  a->piece = piece;
  a->batch = batch;
  *loss = LossSum{};

  if (pc.embedding) {
    const Embedding& e = *embedding_;
    if (e.lookup.types.valid() && !batch.token_types.defined())  // a plain token batch: segment A
      a->batch.token_types = env.be.zeros({B, S}, MemCategory::kActivations, DType::kI32);
    const Tensor embedded =
        e.lookup.forward(env, batch.tokens, a->batch.token_types, context_position_ids(B, S));
    if (e.norm) {
      a->embedded = embedded;
      e.norm->forward(env, a->embedding_norm, a->embedded);
      a->input = a->embedding_norm.out;
    } else {
      a->input = embedded;
    }
  } else {
    a->input = input;
  }
  a->h.resize(static_cast<size_t>(pc.num_layers));
  for (int i = 0; i < pc.num_layers; ++i)
    block(pc.first_layer + i)
        .forward(env, block_input(*a, i), batch.key_lengths, options_.recompute, false,
                 a->h[static_cast<size_t>(i)]);
  if (pc.head) a->head = head_->forward(env, piece_output(*a), a->batch, loss);
  if (spec_.block.mlp.is_moe()) {
    const MoeSpec& m = spec_.block.mlp.moe;
    const size_t E = static_cast<size_t>(m.experts);
    a->moe_sums.assign(2 * E, 0.0);
    sum_routing_over_context(env, E, a->h);
    piece_routing(E, a->h, a->moe_sums.data(), loss);
    // The whole model in one piece: the loss is complete here; otherwise the statistics of
    // every piece meet on the last one (forward_stats). L is the model's MoE layers (its dense
    // layers route nothing), as Hugging Face pools the router logits of its sparse layers only.
    if (boundary_stats() == 0)
      finish_balance(m, a->moe_sums.data(), spec_.moe_layers(), micro_batch_tokens(B * S), loss,
                     &a->aux_grad);
  }
  return a;
}

double TransformerModel::micro_batch_tokens(int64_t local) const {
  const int c = env_->cp ? env_->cp->size() : 1;
  return static_cast<double>(local) * c;
}

int TransformerModel::boundary_stats() const {
  const MlpSpec& mlp = spec_.block.mlp;
  const bool whole = pieces_.size() == 1 && pieces_[0].embedding && pieces_[0].head;
  return mlp.is_moe() && mlp.moe.aux_coef > 0 && !whole ? 2 * mlp.moe.experts : 0;
}

void TransformerModel::forward_stats(PieceActs& acts, const double* in, double* out,
                                     LossSum* loss) {
  Acts& a = static_cast<Acts&>(acts);
  const int n = boundary_stats();
  if (n == 0) return;
  // The pieces before this one, then its own layers (the single process's order of layers).
  std::vector<double> sums(static_cast<size_t>(n), 0.0);
  for (int i = 0; in && i < n; ++i) sums[static_cast<size_t>(i)] = in[i];
  for (int i = 0; i < n; ++i) sums[static_cast<size_t>(i)] += a.moe_sums[static_cast<size_t>(i)];
  if (pieces_[static_cast<size_t>(a.piece)].head) {
    const double tokens = micro_batch_tokens(a.batch.tokens.numel());
    finish_balance(spec_.block.mlp.moe, sums.data(), spec_.moe_layers(), tokens, loss, &a.aux_grad);
  } else {
    std::copy(sums.begin(), sums.end(), out);
  }
}

void TransformerModel::backward_stats(PieceActs& acts, const double* in, double* out) {
  Acts& a = static_cast<Acts&>(acts);
  const int n = boundary_stats();
  if (n == 0) return;
  const size_t E = static_cast<size_t>(n / 2);
  // The last piece computed the gradient per expert (forward_stats); the others receive it.
  if (in) a.aux_grad.assign(in, in + E);
  std::fill(out, out + n, 0.0);
  for (size_t e = 0; e < a.aux_grad.size(); ++e) out[e] = a.aux_grad[e];
}

Tensor TransformerModel::backward_piece(PieceActs& acts, const Tensor& dout, float grad_scale,
                                        bool last_microbatch, bool defer_weight_grads) {
  const LayerEnv& env = *env_;
  Acts& a = static_cast<Acts&>(acts);
  const ModelPiece& pc = pieces_[static_cast<size_t>(a.piece)];
  BackwardPass pass{defer_weight_grads, last_microbatch, &a.deferred};
  // With deferred weight gradients nothing is final before the W pass reports it.
  store_->set_reporting(last_microbatch && !defer_weight_grads);

  Tensor dy;  // the gradient of the current hidden state, (B, Sl, C)
  if (pc.head) {
    dy = head_->backward(env, pass, *a.head, piece_output(a), a.batch, grad_scale);
    head_->report_ready(*store_);
  } else if (spec_.block.placement == NormPlacement::kPre) {
    // The gradient arrives from the next stage; the blocks accumulate into it in place.
    dy = env.act(dout.shape());
    env.be.copy(dy, dout);
  } else {
    dy = dout;
  }
  Tensor aux_grad;  // the load-balancing loss's gradient per expert, scaled
  if (!a.aux_grad.empty()) {
    std::vector<float> g(a.aux_grad);
    for (float& x : g) x *= grad_scale;
    aux_grad = env.stat({static_cast<int64_t>(g.size())});
    env.be.upload(aux_grad, g.data());
  }
  for (int i = pc.num_layers - 1; i >= 0; --i) {
    const TransformerBlock& blk = block(pc.first_layer + i);
    a.h[static_cast<size_t>(i)].moe.aux_grad = aux_grad;
    dy = blk.backward(env, pass, block_input(a, i), a.batch.key_lengths, options_.recompute,
                      a.h[static_cast<size_t>(i)], dy);
    store_->report_ready(blk.first, blk.last);
  }

  Tensor dinput;
  if (pc.embedding) {
    const Embedding& e = *embedding_;
    if (e.norm) {
      Tensor dembedded = env.act_zeros(a.embedded.shape());
      e.norm->backward(env, pass, dembedded, dy, a.embedded, a.embedding_norm);
      dy = dembedded;
    }
    e.lookup.backward(env, dy, a.batch.tokens, a.batch.token_types,
                      context_position_ids(a.batch.tokens.size(0), a.batch.tokens.size(1)));
    report_embedding_ready();
  } else {
    dinput = dy;
  }
  store_->set_reporting(false);
  return dinput;
}

void TransformerModel::backward_weight_piece(PieceActs& acts, bool last_microbatch) {
  Acts& a = static_cast<Acts&>(acts);
  run_deferred_weight_grads(*env_, a.deferred);
  // Every gradient of the piece is final now: report them all at once.
  if (last_microbatch) {
    store_->set_reporting(true);
    report_piece_ready(a.piece);
    store_->set_reporting(false);
  }
}

void TransformerModel::report_embedding_ready() const {
  store_->report_ready(embedding_->first, embedding_->last);
}

void TransformerModel::report_piece_ready(int piece) const {
  const ModelPiece& pc = pieces_[static_cast<size_t>(piece)];
  if (pc.head) head_->report_ready(*store_);
  for (int l = pc.first_layer + pc.num_layers - 1; l >= pc.first_layer; --l)
    store_->report_ready(block(l).first, block(l).last);
  if (pc.embedding) report_embedding_ready();
}

void TransformerModel::rerun_selective_recompute(const PieceActs& acts) {
  const Acts& a = static_cast<const Acts&>(acts);
  const ModelPiece& pc = pieces_[static_cast<size_t>(a.piece)];
  for (int i = 0; i < pc.num_layers; ++i)
    block(pc.first_layer + i).rerun_selective_recompute(*env_, a.h[static_cast<size_t>(i)]);
}

// The key and value caches of every layer: (B, capacity, KVH/t, HS) each, activation type.
struct TransformerGeneration final : GenerationState {
  std::vector<Tensor> k, v;  // [layer]
};

std::unique_ptr<GenerationState> TransformerModel::start_generation(int batch, int64_t capacity) {
  if (!spec_.head->generates()) return Model::start_generation(batch, capacity);
  if (capacity < 1 || capacity > spec_.S)
    throw std::runtime_error("generation of " + std::to_string(capacity) +
                             " positions: the model has " + std::to_string(spec_.S));
  auto g = std::make_unique<TransformerGeneration>();
  g->batch = batch;
  g->capacity = capacity;
  g->width = spec_.C;
  g->vocab = spec_.V;
  const LayerEnv& env = *decode_env_;
  g->k.resize(static_cast<size_t>(spec_.L));
  g->v.resize(static_cast<size_t>(spec_.L));
  for (int l = 0; l < spec_.L; ++l) {
    if (block_of_layer_[static_cast<size_t>(l)] < 0) continue;  // another stage's layer
    const Shape cache = block(l).attention().cache_shape(batch, capacity);
    g->k[static_cast<size_t>(l)] = env.act_zeros(cache);
    g->v[static_cast<size_t>(l)] = env.act_zeros(cache);
  }
  return g;
}

Tensor TransformerModel::decode_piece(GenerationState& state, int piece, const Tensor& input,
                                      const std::vector<int32_t>& ids, int T,
                                      std::vector<float>* logits) {
  TransformerGeneration& g = static_cast<TransformerGeneration&>(state);
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
    x = embedding_->lookup.forward_at(env, tokens, pos0);
    if (embedding_->norm) {
      Norm::Saved n;
      embedding_->norm->forward(env, n, x);
      x = n.out;
    }
  } else {
    STRATA_CHECK(input.defined() && input.numel() == B * T * spec_.C,
                 "decode: piece " << piece << " takes the previous piece's (" << B << ", " << T
                                  << ", " << spec_.C << ") output");
    x = input;
  }
  for (int l = pc.first_layer; l < pc.first_layer + pc.num_layers; ++l)
    x = block(l).decode(env, x, g.k[static_cast<size_t>(l)], g.v[static_cast<size_t>(l)], pos0);
  if (!pc.head) return x;
  head_->decode_logits(env, x, logits);
  return Tensor();
}

}  // namespace strata
