#include "models/layers/embedding.h"

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
  table =
      layout.add({table_name, {v.Vp, C}, ParamSplit::kRows, ParamInit::kNormal, std, v.V, true, {}});
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

Tensor VocabParallelEmbedding::forward(const LayerEnv& env, const Tensor& tokens) const {
  return forward_at(env, tokens, 0);
}

Tensor VocabParallelEmbedding::forward_at(const LayerEnv& env, const Tensor& tokens,
                                          int64_t pos0) const {
  const int64_t B = tokens.size(0), S = tokens.size(1);
  const ParamInfo& t = env.params.info(table);
  Tensor x0 = env.act({B, S, t.shape[1]});
  Tensor pos;
  if (positions.valid()) {
    const Tensor all = env.w(positions);  // (S_max, C)
    const int64_t C = all.size(1), rows = all.size(0) - pos0;
    pos = all.view(pos0 * C, {rows, C});
  }
  env.be.embedding_forward(x0, tokens, env.w(table),
                           positions.valid() && env.tp.rank() == 0 ? &pos : nullptr, vocab.start);
  return env.tp.reduce(x0);
}

void VocabParallelEmbedding::backward(const LayerEnv& env, const Tensor& dout,
                                      const Tensor& tokens) const {
  // Every rank needs the full-sequence gradient for its vocabulary rows and the positions.
  const Tensor dx0 = env.tp.full_sequence(dout);
  Tensor dtable = env.g(table);
  Tensor dpos = positions.valid() ? env.g(positions) : Tensor();
  env.be.embedding_backward(dtable, positions.valid() ? &dpos : nullptr, dx0, tokens, vocab.start);
}

}  // namespace strata
