// model_state.h — between a model's per-rank parameter shards (models/layers/params.h) and full
// tensors: what a rank writes into a checkpoint (runtime/checkpoint/checkpoint.h), and how any
// layout rebuilds its shards from a checkpoint written under another one (resharding). Nothing here
// knows an architecture: it follows each parameter's ParamInfo (split, tied copy, padded rows).
//
// Full tensors use our layouts (weights (out, in), a vocabulary table (Vp, C) with its padded
// rows); a full tensor whose row count differs from this layout's (the vocabulary padded for
// another tensor-parallel size) maps row by row, rows past either end being padding (zero).
//
// Thread-safety: plain functions.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "models/layers/params.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/engine/optimizer.h"

namespace strata {

// A rank's place in the groups its parameters are replicated over: the dp group (data ×
// context) for the dense ones, the edp group for an expert-split one (ProcessGroups::edp_rank;
// the same as dense without expert parallelism). 0: the first replica, which writes.
struct Replica {
  int dense = 0, expert = 0;
};

// What this rank writes: every parameter it is the writer of (tensor-replicated ones on tensor
// rank 0, everything on its first replica; the last stage's copy of a tied parameter never), and
// the AdamW moments of the state it owns (with ZeRO-1 each data rank its own chunk). params, m, v:
// host copies of the model's flat parameters and the optimizer's compact state; previous
// (PipeDream-2BW, else null): the older weight version, written as "param_prev" beside "param".
RankShard make_rank_shard(const ParamLayout& layout, const std::vector<float>& params,
                          const std::vector<float>& m, const std::vector<float>& v,
                          const std::vector<OptSegment>& segments, Replica replica, bool sharded,
                          const std::vector<float>* previous = nullptr);
// The same from the model's own tensors, each piece downloaded straight into its buffer: one
// copy of the shard in host memory (what a background save holds while it writes).
RankShard make_rank_shard(const ParamLayout& layout, Backend& be, const Tensor& params,
                          const Tensor& m, const Tensor& v, const std::vector<OptSegment>& segments,
                          Replica replica, bool sharded, const Tensor* previous = nullptr);

// Assembles the full tensors of `kind` ("param", "param_prev", "m", "v") named in `names` (all when
// empty) from every rank's shard. InputError naming `path` when a tensor is not covered exactly.
FullTensors assemble_full(const std::vector<RankShard>& shards, const std::string& kind,
                          const std::set<std::string>& names, const std::string& path);

// Element `local` of this rank's shard of `p`, read from the full tensor `f`.
float shard_value(const ParamInfo& p, const FullTensor& f, int64_t local, int tp_rank, int tp);

// Fills this rank's flat parameters from full tensors (every parameter must be present:
// InputError naming `path` and the parameter otherwise).
void fill_params(const ParamLayout& layout, const FullTensors& full, std::vector<float>& params,
                 const std::string& path);
// Fills the compact optimizer state (segments over the flat parameters) from full tensors.
void fill_state(const ParamLayout& layout, const FullTensors& full,
                const std::vector<OptSegment>& segments, std::vector<float>& state,
                const std::string& path);

// Resuming without the full tensors: fills this rank's flat parameters with `kind` ("param", or
// PipeDream-2BW's "param_prev") straight from a checkpoint saved under any layout. For each
// parameter only the saved pieces' rows that hold elements of this rank's shard are read (a
// column-split shard reads whole rows and keeps its columns), in chunks of 4 MiB: memory is this
// rank's own buffers and the reader's blocks. Padded vocabulary rows stay zero. InputError
// naming the checkpoint and the parameter when its tensor is missing, has another shape, or does
// not give every element of the shard exactly once.
void load_params(const ParamLayout& layout, CheckpointReader& ck, const std::string& kind,
                 std::vector<float>& params);
// Before a model is built from a checkpoint's own run_state.json (generate, eval): the
// checkpoint holds a tensor of a compatible full shape for every parameter of `layout` (the
// whole model at t = 1) and nothing else, so a run state that does not describe its shards is
// refused (InputError naming run_state.json and the first parameter that differs) before any
// memory is allocated for it.
void check_checkpoint_holds(const ParamLayout& layout, const CheckpointReader& ck);
// The same for the compact optimizer state ("m" or "v") of `segments`.
void load_state(const ParamLayout& layout, CheckpointReader& ck, const std::string& kind,
                const std::vector<OptSegment>& segments, std::vector<float>& state);

}  // namespace strata
