#include "models/description.h"

namespace strata {

std::vector<int> layer_kind_counts(const ModelDescription& d, int first_layer, int layers) {
  std::vector<int> n(static_cast<size_t>(d.layer_kinds()), 0);
  for (int l = first_layer; l < first_layer + layers; ++l)
    ++n[static_cast<size_t>(d.layer_kind(l))];
  return n;
}

std::vector<int> first_layers(const std::vector<int>& layers_per_piece) {
  std::vector<int> first(layers_per_piece.size());
  int at = 0;
  for (size_t k = 0; k < layers_per_piece.size(); ++k) {
    first[k] = at;
    at += layers_per_piece[k];
  }
  return first;
}

int64_t piece_parameters(const ModelDescription& d, int tensor, int piece, int pieces,
                         int first_layer, int layers) {
  const std::vector<int> kinds = layer_kind_counts(d, first_layer, layers);
  int64_t n = 0;
  for (size_t k = 0; k < kinds.size(); ++k)
    n += int64_t{kinds[k]} * d.layer_parameters(tensor, static_cast<int>(k));
  if (piece == 0) n += d.embedding_parameters(tensor);
  if (piece == pieces - 1) {
    n += d.head_parameters(tensor);
    if (pieces > 1) n += d.tied_copy_parameters(tensor);
  }
  return n;
}

RankParameters rank_parameters(const ModelDescription& d, int tensor, int expert, int piece,
                               int pieces, int first_layer, int layers) {
  const std::vector<int> kinds = layer_kind_counts(d, first_layer, layers);
  int64_t experts = 0;
  for (size_t k = 0; k < kinds.size(); ++k)
    experts += int64_t{kinds[k]} * d.layer_expert_parameters(tensor, static_cast<int>(k));
  RankParameters n;
  n.dense = piece_parameters(d, tensor, piece, pieces, first_layer, layers) - experts;
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
  for (int l : kind_layers_) {
    // A kind no layer has (Qwen3-MoE without dense layers) holds nothing.
    if (l < 0) {
      c.layer.push_back(0);
      c.layer_experts.push_back(0);
      continue;
    }
    const ParamLayout layer = layout_(t, {{l, 1, false, false}});
    c.layer.push_back(layer.numel());
    c.layer_experts.push_back(0);
    for (const ParamInfo& p : layer.infos())
      if (p.experts) c.layer_experts.back() += p.numel;
  }
  c.embedding = layout_(t, {{0, 0, true, false}}).numel();
  // A head-only piece of a tied model holds the copy of the embedding; the head proper is the
  // rest.
  c.tied_copy = tied_copy_(t);
  c.head = layout_(t, {{num_layers_, 0, false, true}}).numel() - c.tied_copy;
  return cache_[t] = c;
}

}  // namespace strata
