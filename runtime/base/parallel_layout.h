// parallel_layout.h — how a model is spread over the ranks that train it: one type for every
// place a layout is written down or used — the config (parallel.*, train.micro_batch_size,
// train.recompute), a plan of `strata plan` and its `--fix` pins, the planner's search points,
// and the run itself (launch/train/run_layout.h holds the resolved one).
//
// World = tensor · context · pipeline · data; rank order (docs/contracts.md): tensor ranks
// consecutive, then context, then data (expert groups are consecutive data ranks), then pipeline.
//
// A config may leave the data-parallel size and the layer split open (its null): they are 0 and
// empty here until the layout is resolved for a world size (launch/config/world_layout.h: data
// from the world, the even split, num_microbatches from the global batch). The planner's points
// and a running layout are always resolved.
//
// Parsing is not here: launch/config/layout_fields.h holds the one table of fields that the
// config, --plan files and --fix all read through.
//
// Thread-safety: plain values.
#pragma once

#include <optional>
#include <vector>

#include "runtime/base/recompute.h"
#include "schedules/schedule.h"

namespace strata {

struct ParallelLayout {
  int tensor = 1;          // t: ranks each layer's weights are split over (inside a node)
  int context = 1;         // ranks each sequence is split over (ring attention)
  int expert = 1;          // data ranks each MoE layer's experts are spread over
  int pipeline = 1;        // p stages
  int data = 0;            // d replicas; 0: open, world / (t · c · p) once resolved
  int virtual_stages = 1;  // v model chunks per stage (interleaved only)
  ScheduleKind schedule = ScheduleKind::kOneFOneB;
  Recompute recompute = Recompute::kNone;
  bool sequence_parallel = false;
  bool distributed_optimizer = false;
  int micro_batch_size = 4;  // b sequences per micro-batch (docs/config.md's default)
  int num_microbatches = 0;  // m per pipeline per iteration, B / (b · d): derived, 0 until resolved
  // [piece] layers, piece k = chunk · p + stage (Megatron's interleaving), p · v entries; empty:
  // open (the config's even split, the planner's balanced one).
  std::vector<int> layers_per_piece;

  int pieces() const { return pipeline * virtual_stages; }
};

// The fields of a ParallelLayout that a source pins (`strata plan --fix`); the planner searches
// the others. The same fields under the same names, each optional.
struct PinnedLayout {
  std::optional<int> tensor, context, expert, pipeline, data, virtual_stages, micro_batch_size;
  std::optional<ScheduleKind> schedule;
  std::optional<Recompute> recompute;
  std::optional<bool> sequence_parallel, distributed_optimizer;
  std::optional<std::vector<int>> layers_per_piece;
};

}  // namespace strata
