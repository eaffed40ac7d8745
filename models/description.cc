#include "models/description.h"

namespace strata {

int64_t piece_parameters(const ModelDescription& d, int tensor, int piece, int pieces, int layers) {
  int64_t n = int64_t{layers} * d.layer_parameters(tensor);
  if (piece == 0) n += d.embedding_parameters(tensor);
  if (piece == pieces - 1) {
    n += d.head_parameters(tensor);
    if (pieces > 1) n += d.tied_copy_parameters(tensor);
  }
  return n;
}

RankParameters rank_parameters(const ModelDescription& d, int tensor, int expert, int piece,
                               int pieces, int layers) {
  const int64_t experts = int64_t{layers} * d.layer_expert_parameters(tensor);
  RankParameters n;
  n.dense = piece_parameters(d, tensor, piece, pieces, layers) - experts;
  n.expert = experts / expert;
  return n;
}

int64_t unpadded_parameters(const ParamLayout& layout) {
  int64_t n = 0;
  for (const ParamInfo& p : layout.infos())
    n += p.rows_initialised >= 0 ? p.rows_initialised * p.full_shape[1] : p.numel;
  return n;
}

PartParameterCounts::Counts PartParameterCounts::at(int t) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = cache_.find(t);
  if (it != cache_.end()) return it->second;
  Counts c;
  const ParamLayout layer = layout_(t, {{0, 1, false, false}});
  c.layer = layer.numel();
  for (const ParamInfo& p : layer.infos())
    if (p.experts) c.layer_experts += p.numel;
  c.embedding = layout_(t, {{0, 0, true, false}}).numel();
  // A head-only piece of a tied model holds the copy of the embedding; the head proper is the
  // rest.
  c.tied_copy = tied_copy_(t);
  c.head = layout_(t, {{num_layers_, 0, false, true}}).numel() - c.tied_copy;
  return cache_[t] = c;
}

}  // namespace strata
