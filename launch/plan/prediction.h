// prediction.h — the planner's view of a config (partitioner/): what `strata train --dry-run`
// prints, what the start-up memory check compares with the machine, and the memory options
// `strata plan` and the prediction share. Both `strata train` and `strata plan` use it, so it
// belongs to neither command.
//
// Thread-safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "partitioner/cluster.h"
#include "partitioner/memory_model.h"
#include "partitioner/planner.h"
#include "runtime/base/config.h"
#include "runtime/base/parallel_layout.h"

namespace strata {

// What the planner's memory model assumes of the runtime. cpu: the CPU runtime (also for bf16,
// which it emulates: unfused attention keeps the probabilities, per-thread attention scratch),
// else a GPU (flash attention, the CUDA context and cuBLASLt's workspace held back). bucket_mb:
// parallel.bucket_mb.
MemoryOptions memory_options(const std::string& precision, double bucket_mb, int threads, bool cpu);

// The planner's request for cfg on `world_size` ranks of `cluster` (its nodes resized to them; a
// world that is not a whole number of nodes as one node of world_size GPUs): the config's model,
// global batch and precision, Strata's runtime and memory on the config's device. Nothing pinned.
PlanRequest plan_request_for_config(const Config& cfg, int world_size, const Cluster& cluster);

// The planner's prediction for cfg with `layout`, resolved for the world it runs on
// (launch/config/world_layout.h), on that many ranks of `cluster`: a plan entry of
// docs/contracts.md's plan format plus "model_flops" and "hardware_flops" per iteration. fp32
// predicts the CPU runtime. Throws InputError when the layout does not fit the model or the batch.
nlohmann::json predict_for_config(const Config& cfg, const ParallelLayout& layout,
                                  const Cluster& cluster);
// The same for cfg's layout as it stands on `world_size` ranks.
nlohmann::json predict_for_config(const Config& cfg, int world_size, const Cluster& cluster);

}  // namespace strata
