// embedding.h — the vocab-parallel token embedding (Megatron's VocabParallelEmbedding), with
// optional learned position embeddings and token-type (segment) embeddings (BERT's).
//
// The vocabulary is padded to a multiple of 128·t (Megatron's make-vocab-size-divisible-by
// times t); rank r holds rows [r·Vp/t, (r+1)·Vp/t) of the (Vp, C) table. Padded rows start at
// zero, are excluded from the loss and never sampled. In the forward pass each rank adds its own
// rows' vectors (and rank 0 the positions and token types), and the sum over the group is the
// embedding; with sequence parallelism the sum is reduce-scattered straight to the sequence
// shards.
//
// Thread-safety: as the model.
#pragma once

#include <algorithm>
#include <string>

#include "models/layers/parallel.h"
#include "models/layers/params.h"
#include "models/layers/work.h"

namespace strata {

// A vocabulary of V entries padded to Vp and split over t ranks.
struct VocabShard {
  int V = 0;      // real entries
  int Vp = 0;     // padded to a multiple of 128·t
  int local = 0;  // Vp / t rows on this rank
  int start = 0;  // this rank's first row
  // Real (non-padding) entries in this rank's shard.
  int valid() const { return std::clamp(V - start, 0, local); }
};
int pad_vocab(int vocab, int multiple);
VocabShard vocab_shard(int vocab, int tp, int tp_rank);

class VocabParallelEmbedding {
 public:
  VocabParallelEmbedding() = default;
  // Declares `table_name` (Vp, C) rows-split, N(0, std) over the real rows, and with
  // `positions` > 0 a replicated `positions_name` (positions, C) table, N(0, std).
  VocabParallelEmbedding(ParamLayout& layout, const VocabShard& vocab, int64_t C, double std,
                         const std::string& table_name, int64_t positions,
                         const std::string& positions_name);
  // Declares a replicated `types_name` (types, C) table, N(0, std): token_types ids select its
  // rows in forward().
  void add_token_types(ParamLayout& layout, int64_t types, int64_t C, double std,
                       const std::string& types_name);

  // tokens (B, S) i32 → (B, S_local, C): the sum over the tensor group of each rank's rows (and
  // the positions, and the rows of token_types (B, S) i32 when the layer has a type table),
  // reduce-scattered to this rank's sequence chunk with sequence parallelism. position_ids
  // (B, S) i32, given with context parallelism: each token's position (the learned position
  // rows gathered by id); null: positions 0 … S − 1.
  Tensor forward(const LayerEnv& env, const Tensor& tokens, const Tensor& token_types = Tensor(),
                 const Tensor* position_ids = nullptr) const;
  // Generation: tokens at positions pos0 … (the learned positions from row pos0).
  Tensor forward_at(const LayerEnv& env, const Tensor& tokens, int64_t pos0) const;
  // Table (and position, token-type) gradients from the gradient of the output, dout
  // (B, S_local, C).
  void backward(const LayerEnv& env, const Tensor& dout, const Tensor& tokens,
                const Tensor& token_types = Tensor(), const Tensor* position_ids = nullptr) const;

  // One micro-batch: the gather of each token's row (a read and a write), the position add and
  // the token-type gather and add where the layer has them (the backward scatter-adds the same
  // elements into the tables); the sum over the group (all-reduce, or reduce-scatter with sp,
  // whose backward gathers the gradient back).
  static PartWork work(int64_t C, bool positions, bool types, const WorkShape& s);

  ParamRef table, positions;  // positions invalid without learned positions
  ParamRef types;             // invalid without token types
  VocabShard vocab;

 private:
  // The embedding of tokens at positions pos0 … (and their types when given).
  Tensor lookup(const LayerEnv& env, const Tensor& tokens, int64_t pos0, const Tensor* token_types,
                const Tensor* position_ids = nullptr) const;
};

}  // namespace strata
