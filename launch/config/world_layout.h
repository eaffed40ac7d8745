// world_layout.h — a config's parallel layout on a world of ranks: the checks that need the
// world size, and the layout resolved for it, the one training, the dry run, the start-up memory
// check and the planner's prediction of a config all use.
//
// Resolving fills what the config may leave open (runtime/base/parallel_layout.h): the
// data-parallel size (parallel.data null: world / (t·c·p)), the micro-batches per pipeline
// (global / (b·d)) and the layer split (parallel.layers_per_stage, else the even split of
// partitioner/layer_split.h).
//
// Thread-safety: pure functions.
#pragma once

#include "runtime/base/config.h"
#include "runtime/base/parallel_layout.h"

namespace strata {

// Checks that need the world size (parallel sizes dividing it, tensor splits, batch
// divisibility). Throws InputError naming both numbers. Called once the world size is known;
// `world_from` says where it came from in the message.
void validate_for_world(const Config& c, int world_size, const char* world_from = "mpirun -np");

// c.layout resolved on `world_size` ranks. Precondition: validate_for_world(c, world_size).
ParallelLayout layout_for_world(const Config& c, int world_size);

// The batch arithmetic alone, also before validate_for_world (then 0 where the world is smaller
// than t·c·p).
int data_parallel_size(const Config& c, int world_size);
int microbatches_per_pipeline(const Config& c, int world_size);  // global / (micro · d)

}  // namespace strata
