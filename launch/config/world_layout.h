// world_layout.h — a config's parallel layout on a world of ranks: the checks that need the
// world size, and the batch arithmetic (data-parallel size, micro-batches per pipeline).
//
// Thread-safety: pure functions.
#pragma once

#include "runtime/base/config.h"

namespace strata {

// Checks that need the world size (parallel sizes dividing it, tensor splits, batch
// divisibility). Throws InputError naming both numbers. Called once the world size is known.
void validate_for_world(const Config& c, int world_size);

// The batch arithmetic, also before validate_for_world (then 0 where the world is smaller than
// t·p).
int data_parallel_size(const Config& c, int world_size);
int microbatches_per_pipeline(const Config& c, int world_size);  // global / (micro · d)

}  // namespace strata
