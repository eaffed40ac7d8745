#include "models/layers/embedding.h"

#include "runtime/base/check.h"

namespace strata {

int pad_vocab(int vocab, int multiple) {
  return (vocab + multiple - 1) / multiple * multiple;
}

VocabShard vocab_shard(int vocab, int tp, int tp_rank) {
  VocabShard v;
  v.V = vocab;
  v.Vp = pad_vocab(vocab, 128 * tp);  // Megatron's make-vocab-size-divisible-by × t
  v.local = v.Vp / tp;
  v.start = tp_rank * v.local;
  return v;
}

VocabParallelEmbedding::VocabParallelEmbedding(ParamLayout& layout, const VocabShard& v, int64_t C,
                                               double std, const std::string& table_name,
                                               int64_t n_positions,
                                               const std::string& positions_name)
    : vocab(v) {
  table = layout.add(
      {table_name, {v.Vp, C}, ParamSplit::kRows, ParamInit::kNormal, std, v.V, true, {}});
  if (n_positions > 0) {
    positions = layout.add({positions_name,
                            {n_positions, C},
                            ParamSplit::kReplicated,
                            ParamInit::kNormal,
                            std,
                            -1,
                            true,
                            {}});
  }
}

void VocabParallelEmbedding::add_token_types(ParamLayout& layout, int64_t n_types, int64_t C,
                                             double std, const std::string& types_name) {
  types = layout.add(
      {types_name, {n_types, C}, ParamSplit::kReplicated, ParamInit::kNormal, std, -1, true, {}});
}

Tensor VocabParallelEmbedding::forward(const LayerEnv& env, const Tensor& tokens,
                                       const Tensor& token_types,
                                       const Tensor* position_ids) const {
  if (!types.valid()) return lookup(env, tokens, 0, nullptr, position_ids);
  STRATA_CHECK(token_types.defined(), "an embedding with token types needs their ids");
  return lookup(env, tokens, 0, &token_types, position_ids);
}

Tensor VocabParallelEmbedding::forward_at(const LayerEnv& env, const Tensor& tokens,
                                          int64_t pos0) const {
  return lookup(env, tokens, pos0, nullptr);
}

Tensor VocabParallelEmbedding::lookup(const LayerEnv& env, const Tensor& tokens, int64_t pos0,
                                      const Tensor* token_types, const Tensor* position_ids) const {
  const int64_t B = tokens.size(0), S = tokens.size(1);
  const ParamInfo& t = env.params.info(table);
  Tensor x0 = env.act({B, S, t.shape[1]});
  Tensor pos;
  const bool by_id = position_ids != nullptr && positions.valid();
  if (positions.valid() && !by_id) {
    const Tensor all = env.w(positions);  // (S_max, C)
    const int64_t C = all.size(1), rows = all.size(0) - pos0;
    pos = all.view(pos0 * C, {rows, C});
  }
  env.be.embedding_forward(x0, tokens, env.w(table),
                           positions.valid() && !by_id && env.tp.rank() == 0 ? &pos : nullptr,
                           vocab.start);
  if (by_id && env.tp.rank() == 0) {  // added once, as the positions are
    Tensor placed = env.act(x0.shape());
    env.be.embedding_forward(placed, *position_ids, env.w(positions), nullptr, 0);
    env.be.add_inplace(x0, placed);
  }
  if (token_types && env.tp.rank() == 0) {  // added once, as the positions
    Tensor typed = env.act(x0.shape());
    env.be.embedding_forward(typed, *token_types, env.w(types), nullptr, 0);
    env.be.add_inplace(x0, typed);
  }
  return env.tp.reduce(x0);
}

PartWork VocabParallelEmbedding::work(int64_t C, bool positions, bool types, const WorkShape& s) {
  PartWork w;
  const double x = s.tokens() * static_cast<double>(C);
  const double passes = 2 + (positions ? 1 : 0) + (types ? 2 : 0);
  w.elementwise_fwd = passes * x;
  w.elementwise_bwd = passes * x;
  if (s.sp) {
    w.collectives_fwd.push_back({CommGroup::kTensor, CollectiveKind::kReduceScatter, x});
    w.collectives_bwd.push_back({CommGroup::kTensor, CollectiveKind::kAllGather, x});
  } else if (s.t > 1) {
    w.collectives_fwd.push_back({CommGroup::kTensor, CollectiveKind::kAllReduce, x});
  }
  return w;
}

void VocabParallelEmbedding::backward(const LayerEnv& env, const Tensor& dout, const Tensor& tokens,
                                      const Tensor& token_types, const Tensor* position_ids) const {
  // Every rank needs the full-sequence gradient for its vocabulary rows, the positions and the
  // token types (replicated: every rank computes their whole gradient).
  const Tensor dx0 = env.tp.full_sequence(dout);
  Tensor dtable = env.g(table);
  const bool by_id = position_ids != nullptr && positions.valid();
  Tensor dpos = positions.valid() ? env.g(positions) : Tensor();
  env.be.embedding_backward(dtable, positions.valid() && !by_id ? &dpos : nullptr, dx0, tokens,
                            vocab.start);
  if (by_id) env.be.embedding_backward(dpos, nullptr, dx0, *position_ids, 0);
  if (types.valid()) {
    Tensor dtypes = env.g(types);
    env.be.embedding_backward(dtypes, nullptr, dx0, token_types, 0);
  }
}

}  // namespace strata
